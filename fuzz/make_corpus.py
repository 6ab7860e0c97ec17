"""Write the seed corpus for the fuzzers (fuzz/corpus/{frames,crcfuse,example,resample,imgcheck,imgrows,permute,indextext}/),
deterministically.

Run from the repository root: ``python fuzz/make_corpus.py``. Example seeds start with
one byte choosing the harness's spec (bit 2 set: parsed as SequenceExamples, the
``seq-*`` seeds); records of one batch are separated by FF FE FD. Resample seeds are the
10-byte header ``fuzz_resample.c`` reads (filter and channel layout, sizes, window, hostile
argument) followed by source pixels.
"""

from __future__ import annotations

import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from shardfeed.formats.crc import masked_crc32c, masked_length_crc  # noqa: E402
from shardfeed.formats.example import encode_example, encode_sequence_example  # noqa: E402
from shardfeed.formats.wire import encode_varint  # noqa: E402
from tests.imagefiles import repeat_scan  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SEP = b"\xff\xfe\xfd"


def ld(field: int, payload: bytes) -> bytes:
    return encode_varint(field << 3 | 2) + encode_varint(len(payload)) + payload


def entry(key: bytes, feature: bytes) -> bytes:
    return ld(1, ld(1, key) + ld(2, feature))


def frame(rec: bytes) -> bytes:
    return struct.pack("<QI", len(rec), masked_length_crc(len(rec))) + rec + struct.pack("<I", masked_crc32c(rec))


def examples() -> list[bytes]:
    out = [
        encode_example({"a": 1, "b": 2.5, "c": b"x"}),
        encode_example({"a": [1, 2], "b": [0.5, 1.5], "c": [b"x", b"yy"]}),
        encode_example({"ids": [1, -1, 1 << 62, 0], "f": [1.0, 2.0], "s": [b"", b"abc"]}),
        encode_example({"val": [b"v1", b"v2"], "idx": [1, 3], "idx2": [5, 99]}),
        encode_example({"val": [0.25], "idx": [9], "idx2": [0]}),
        encode_example({}),
        encode_example({"a": [], "": [b"empty key"]}),
        encode_example({"a": 3, "b": 1.0, "c": b"z", "other": list(range(20)), "f": [float("nan")]}),
        b"",
    ]
    # unpacked int64 and float, split packed chunks, value before key
    out.append(ld(1, entry(b"a", ld(3, b"\x08\x05\x08\x06")) + entry(b"b", ld(2, b"\x0d\x00\x00\x80\x3f" * 2))))
    out.append(ld(1, entry(b"ids", ld(3, ld(1, b"\x01\x02") + ld(1, b"\x03") + b"\x08\x7f"))))
    out.append(ld(1, ld(1, ld(2, ld(3, ld(1, b"\x2a"))) + ld(1, b"a"))))
    # duplicate keys, oneof switch, merged Features, unknown fields and groups
    out.append(ld(1, entry(b"a", ld(3, ld(1, b"\x01"))) + entry(b"a", ld(3, ld(1, b"\x02")))))
    out.append(ld(1, entry(b"a", ld(3, ld(1, b"\x01")) + ld(1, ld(1, b"q")) + ld(3, ld(1, b"\x09")))))
    out.append(ld(1, entry(b"a", ld(3, ld(1, b"\x01")))) + ld(1, entry(b"b", ld(2, ld(1, b"\0\0\0\0")))))
    out.append(b"\x10\x05" + ld(1, entry(b"c", ld(1, ld(1, b"x")) + b"\x1b\x08\x01\x1c" + b"\x25\0\0\0\0")) + b"\x39" + b"\0" * 8)
    out.append(ld(1, entry(b"a", ld(3, b"\x08\x01" + ld(1, b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01")))))
    # broken ones
    out.append(ld(1, entry(b"a", ld(3, ld(1, b"\x80")))))
    out.append(ld(1, entry(b"b", ld(2, ld(1, b"\0\0\0")))))
    out.append(ld(1, entry(b"\xff\xfe", ld(1, b""))))
    out.append(b"\x0a\x05\x0a\x03")
    out.append(b"\x0b" * 30 + b"\x0c" * 30)
    out.append(b"\x0a\xff\xff\xff\xff\x0f")
    out.append(b"\x04")
    return out


def sequences() -> list[bytes]:
    """SequenceExamples for the harness's feature-list columns (a, f, s, the empty key)."""
    def lists(key: bytes, *steps: bytes) -> bytes:
        return ld(1, ld(1, key) + ld(2, b"".join(ld(1, s) for s in steps)))

    return [
        encode_sequence_example({"a": 1, "b": 2.5, "c": b"x"}, {"a": [[1], [2]], "f": [[0.5], []], "s": [[b"x", b""]]}),
        encode_sequence_example({"ids": [1, 2]}, {"a": [[1, 2], [3, 4]], "f": [[1.0, 2.0]], "": [[7], [], [8, 9]]}),
        encode_sequence_example({}, {"a": [], "s": [], "f": [[float("nan")]]}),
        encode_sequence_example({"a": [1, 2]}, {"other": [[1], [b"x"]], "a": [[5]]}),
        # value before key, value twice, duplicate lists, kindless steps, unknown fields and groups
        ld(2, ld(1, ld(2, ld(1, ld(3, ld(1, b"\x01")))) + ld(1, b"a") + ld(2, ld(1, b"")))),
        ld(2, lists(b"a", ld(3, ld(1, b"\x01"))) + lists(b"a", ld(3, b"\x08\x02"), b"")) + ld(1, entry(b"a", ld(3, b"\x08\x03"))),
        b"\x18\x01" + ld(2, b"\x1b\x1c" + lists(b"f", ld(2, b"\x0d\0\0\x80\x3f" + b"\x1b\x1c"), b"\x10\x01") + b"\x25\0\0\0\0"),
        # broken ones
        ld(2, lists(b"a", ld(3, ld(1, b"\x80")))),
        ld(2, lists(b"\xff", b"")),
        ld(2, b"\x0a\x05\x0a\x01a"),
        ld(2, lists(b"s", ld(1, b"\x0c"))),
    ]


def resample_seeds() -> dict[str, bytes]:
    """name -> input of fuzz_resample.c: down-, up- and one-sided resizes, edge windows, widths
    around the AVX-512 paths' 16-pixel loads, every filter and channel layout."""
    pixels = bytes((i * 37 + (i >> 4) * 11) & 255 for i in range(512))
    shapes = {  # (sh, sw, scaled_h, scaled_w, th, tw, top, left)
        "down": (64, 64, 24, 24, 24, 24, 0, 0),
        "up": (5, 7, 40, 50, 40, 50, 0, 0),
        "same": (9, 9, 9, 9, 9, 9, 0, 0),
        "same-window": (9, 9, 9, 9, 3, 4, 6, 5),
        "rows-only": (30, 20, 11, 20, 11, 20, 0, 0),
        "cols-only": (20, 30, 20, 11, 20, 11, 0, 0),
        "one-pixel": (1, 1, 1, 1, 1, 1, 0, 0),
        "to-one": (64, 64, 1, 1, 1, 1, 0, 0),
        "line": (1, 64, 3, 17, 3, 17, 0, 0),
        "column": (64, 1, 17, 3, 17, 3, 0, 0),
        "window-end": (40, 40, 100, 100, 7, 9, 93, 91),
        "window-start": (40, 40, 100, 100, 7, 9, 0, 0),
        "narrow-16": (16, 16, 16, 5, 16, 5, 0, 0),
        "narrow-17": (17, 17, 8, 4, 8, 4, 0, 0),
        "wide-crop": (48, 64, 90, 120, 20, 33, 35, 87),
    }
    out = {}
    for name, (sh, sw, h, w, th, tw, top, left) in shapes.items():
        for filt in range(5):
            for layout in range(4):
                head = bytes([filt | layout << 3, sh - 1, sw - 1, h - 1, w - 1, th - 1, tw - 1, top, left, 0])
                out[f"{name}-f{filt + 1}-c{layout}"] = head + pixels
    for sel in (0xE0, 0xE1, 0xE8, 0xF0, 0xF8, 0xFF):  # argument validation, see hostile()
        out[f"hostile-{sel:02x}"] = bytes([1, 20, 20, 40, 40, 30, 30, 3, 4, sel]) + pixels[:64]
    return out


def crcfuse_seeds() -> dict[str, bytes]:
    """name -> input of fuzz_crcfuse.c: options, segment count, 5 bytes per segment (start,
    length, outside-the-record flag), the record (an Example, so values lie where a parse
    finds them)."""
    rec = encode_example({"image/encoded": [bytes(range(256)) * 3], "label": [7]})

    def seg(start: int, n: int, outside: int = 0) -> bytes:
        return struct.pack("<HHB", start, n, outside)

    at = rec.index(bytes(range(256)))
    return {
        "one-value": bytes([0, 1]) + seg(at, 768) + rec,
        "tiled-long-blocks": bytes([1, 2]) + seg(5, 3000) + seg(4000, 20) + rec,
        "wrong-crc": bytes([2, 1]) + seg(at, 768) + rec,
        "default-and-overlap": bytes([0, 3]) + seg(0, 10, 1) + seg(3, 50) + seg(20, 50) + rec,
        "empty-record": bytes([0, 2]) + seg(0, 0) + seg(5, 5, 1),
        "unsorted": bytes([4 << 2, 3]) + seg(100, 20) + seg(10, 20) + seg(50, 5) + rec,
        "misaligned-dst": bytes([7 << 2 | 1, 1]) + seg(at + 1, 700) + rec,
    }


def imgcheck_seeds() -> dict[str, bytes]:
    """name -> small JPEG/PNG files for fuzz_imgcheck.c (under its 4,096-byte inputs), made with
    Pillow: baseline, progressive, restart markers, EXIF, grey; PNG RGB, palette + tRNS, eXIf."""
    import io

    import numpy as np
    from PIL import Image

    a = (np.arange(16 * 12 * 3, dtype=np.uint32).reshape(12, 16, 3) * 37 % 251).astype(np.uint8)
    im = Image.fromarray(a)
    exif = Image.Exif()
    exif[0x0112] = 6

    def enc(img, fmt, **kw):
        b = io.BytesIO()
        img.save(b, fmt, **kw)
        return b.getvalue()

    return {
        "baseline.jpg": enc(im, "JPEG", quality=80),
        "progressive.jpg": enc(im, "JPEG", progressive=True),
        "restart.jpg": enc(im, "JPEG", restart_marker_blocks=1),
        "exif.jpg": enc(im, "JPEG", exif=exif.tobytes()),
        "grey.jpg": enc(im.convert("L"), "JPEG"),
        "rgb.png": enc(im, "PNG"),
        "palette-trns.png": enc(im.convert("P"), "PNG", transparency=0),
        "exif.png": enc(im, "PNG", exif=exif.tobytes()),
        "truncated.jpg": enc(im, "JPEG")[:300],
        # one scan repeated past the scan limit (SF_JPEG_MAX_SCANS), the second with a comment
        # and bytes that are not a marker before each copy (a lenient decoder skips them)
        "many-scans.jpg": repeat_scan(enc(im, "JPEG", progressive=True), 101),
        "many-scans-garbage.jpg": repeat_scan(enc(im, "JPEG", progressive=True), 101, between=b"\xff\xfe\x00\x04sf\x00\x12"),
    }


def layouts() -> list[list[bytes]]:
    """Batches whose records repeat one layout (the parser's entry templates: an entry with
    the previous record's bytes up to its values is read without parsing), and records that
    break it: keys in another order, a key that differs by one byte, other varint lengths
    under the same header, a record cut short."""
    def rec(i: int, **over) -> bytes:
        f = {"a": [300 + i % 2], "b": [0.5 * i], "c": [b"val%02d" % i], "other": [i, 1], "ids": [i] * (i % 3),
             "pad": [b"p" * 32]}
        f.update(over)
        return encode_example(f)
    base = [rec(i) for i in range(4)]
    return [
        base,
        base[:2] + [rec(2, a=[1, 2])] + base[2:],
        base[:2] + [encode_example(dict(reversed(list({"a": 1, "b": 2.0, "c": b"x", "pad": [b"p" * 32]}.items()))))],
        base[:2] + [rec(2, c=[b"val0\xff"])] + [rec(3, other=[1 << 40])],
        base[:3] + [base[3][:-5]],
    ]


def main() -> None:
    ex_dir = os.path.join(HERE, "corpus", "example")
    fr_dir = os.path.join(HERE, "corpus", "frames")
    os.makedirs(ex_dir, exist_ok=True)
    os.makedirs(fr_dir, exist_ok=True)
    recs = examples()
    for i, r in enumerate(recs):
        with open(os.path.join(ex_dir, f"seed-{i:02d}"), "wb") as f:
            f.write(bytes([i % 4]) + r)
    for i in range(0, len(recs) - 2, 3):
        with open(os.path.join(ex_dir, f"batch-{i:02d}"), "wb") as f:
            f.write(bytes([i % 4]) + SEP.join(recs[i:i + 3]))
    for i, batch in enumerate(layouts()):
        for spec in (0, 1):
            with open(os.path.join(ex_dir, f"layout-{i:02d}-{spec}"), "wb") as f:
                f.write(bytes([spec]) + SEP.join(batch))
    seqs = sequences()
    for i, r in enumerate(seqs):
        with open(os.path.join(ex_dir, f"seq-{i:02d}"), "wb") as f:
            f.write(bytes([4 + i % 4]) + r)
    with open(os.path.join(ex_dir, "seq-batch"), "wb") as f:
        f.write(bytes([4]) + SEP.join(seqs[:4]))
    good = b"".join(frame(r) for r in recs[:6])
    seeds = {
        "empty": b"",
        "one": frame(recs[0]),
        "many": good,
        "truncated-header": good[:20],
        "truncated-data": good[: len(frame(recs[0])) + 30],
        "bad-length-crc": good[:8] + b"\0\0\0\0" + good[12:],
        "bad-data-crc": good[:-1] + bytes([good[-1] ^ 1]),
        "absurd-length": struct.pack("<QI", 1 << 40, masked_length_crc(1 << 40)) + b"data",
        "zero-length": frame(b"") * 3,
        "big-record": frame(bytes(range(256)) * 40),
    }
    for name, data in seeds.items():
        for opt in (0, 1):
            with open(os.path.join(fr_dir, f"{name}-{opt}"), "wb") as f:
                f.write(bytes([opt]) + data)
    rs_dir = os.path.join(HERE, "corpus", "resample")
    os.makedirs(rs_dir, exist_ok=True)
    for name, data in resample_seeds().items():
        with open(os.path.join(rs_dir, name), "wb") as f:
            f.write(data)
    cf_dir = os.path.join(HERE, "corpus", "crcfuse")
    os.makedirs(cf_dir, exist_ok=True)
    for name, data in crcfuse_seeds().items():
        with open(os.path.join(cf_dir, name), "wb") as f:
            f.write(data)
    ic_dir = os.path.join(HERE, "corpus", "imgcheck")
    os.makedirs(ic_dir, exist_ok=True)
    for name, data in imgcheck_seeds().items():
        with open(os.path.join(ic_dir, name), "wb") as f:
            f.write(data)
    ir_dir = os.path.join(HERE, "corpus", "imgrows")
    os.makedirs(ir_dir, exist_ok=True)
    for name, data in imgrows_seeds().items():
        with open(os.path.join(ir_dir, name), "wb") as f:
            f.write(data)
    pm_dir = os.path.join(HERE, "corpus", "permute")
    os.makedirs(pm_dir, exist_ok=True)
    for name, data in permute_seeds().items():
        with open(os.path.join(pm_dir, name), "wb") as f:
            f.write(data)
    it_dir = os.path.join(HERE, "corpus", "indextext")
    os.makedirs(it_dir, exist_ok=True)
    for name, data in indextext_seeds().items():
        with open(os.path.join(it_dir, name), "wb") as f:
            f.write(data)


def indextext_seeds() -> dict[str, bytes]:
    """name -> inputs of fuzz_indextext.c: index texts, well formed (blank lines, no last
    newline, an offset + length of 2^63 - 1) and not (three numbers, CRLF, a length of 15,
    an offset past 2^63)."""
    return {"valid": b"0 100\n100 20\n\n120 16\n", "no-last-newline": b"0 100\n100 20",
            "edge": b"9223372036854775790 17\n", "three": b"0 100\n100 20 7\n", "crlf": b"0 100\r\n",
            "short": b"0 15", "huge": b"92233720368547758070 17\n"}


def permute_seeds() -> dict[str, bytes]:
    """name -> inputs of fuzz_permute.c: n (8 bytes), the mode byte (even: n cut to 1..4096),
    six round keys, the first position, the step: small sizes at the bit widths' edges, and
    large ones (2^32 + 1, 2^62) read in windows with strides 1 and 7."""
    keys = struct.pack("<6Q", *(0x9E3779B97F4A7C15 * (r + 1) % 2**64 for r in range(6)))
    out = {}
    for n in (1, 2, 3, 4, 5, 16, 17, 255, 256, 4095):
        out[f"small-{n}"] = struct.pack("<Q", n - 1) + b"\0" + keys
    for n, first, step in ((2**32 + 1, 2**32 - 3, 1), (2**62, 12345, 7)):
        out[f"large-{n}-{step}"] = struct.pack("<Q", n - 1) + b"\1" + keys + struct.pack("<qB", first, step)
    return out


def imgrows_seeds() -> dict[str, bytes]:
    """name -> inputs of fuzz_imgrows.c: the options byte, the path's and the label text's
    lengths, the path, the text, then one of the imgcheck seeds (JPEG wanted, no limits; PNG
    wanted; a 64-pixel size limit; a 4,096-pixel limit; a 130-byte path and a 200-byte text)."""
    out = {}
    path, text = b"/data/imgs/cats/0001.jpg", b"cats"
    long_path, long_text = b"/p" * 65, "\u00e9".encode() * 100
    for name, data in imgcheck_seeds().items():
        stem = name.rsplit(".", 1)[0] + ("-png" if name.endswith(".png") else "-jpg")
        for tag, opt, p, tx in (("plain", 3 << 3, path, text), ("want-png", 1 | 3 << 3, path, text),
                                ("size64", 2 << 1 | 3 << 3, path, text), ("pixels4096", 2 << 3, path, text),
                                ("long", 3 << 3, long_path, long_text)):
            out[f"{stem}-{tag}"] = bytes([opt, len(p), len(tx)]) + p + tx + data
    return out


if __name__ == "__main__":
    main()
