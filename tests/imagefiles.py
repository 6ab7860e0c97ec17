"""Hostile image files built from good ones, for the tests and the fuzzers' seed corpus."""

from __future__ import annotations


def repeat_scan(jpeg: bytes, total: int, between: bytes = b"") -> bytes:
    """``jpeg`` (progressive) with its smallest scan (SOS header and entropy-coded data) repeated
    until it has ``total`` scans, ``between`` before each copy: the shape of a JPEG whose
    decode takes seconds from a few KB."""
    pos, scans, eoi = 2, [], len(jpeg)
    while pos + 2 <= len(jpeg):
        m = jpeg[pos + 1]
        if m == 0xD9:
            eoi = pos
            break
        end = pos + 2 + int.from_bytes(jpeg[pos + 2:pos + 4], "big")
        if m == 0xDA:  # to the next marker that is not stuffing or RSTn
            while not (jpeg[end] == 0xFF and jpeg[end + 1] not in (0x00, *range(0xD0, 0xD8))):
                end += 1
            scans.append((pos, end))
        pos = end
    a, b = min(scans, key=lambda s: s[1] - s[0])
    return jpeg[:eoi] + (between + jpeg[a:b]) * (total - len(scans)) + jpeg[eoi:]
