"""Damage inside an image's compressed data that lenient decoders fill in without a word.

The native structural check (:func:`shardfeed.formats.native.image_check`) walks a JPEG's
segments and a PNG's chunks (CRCs, IEND) without decoding. Two kinds of damage pass it and
also pass Pillow's and TensorFlow's decoders, which return an image with the missing part
filled in (found from outside):

- a JPEG whose entropy-coded data ends before its frame does, or holds codes that do not
  decode: libjpeg reports "Corrupt JPEG data: premature end of data segment", "Premature
  end of JPEG file", "bad Huffman code", "found marker ... instead of RST" as *warnings*
  and fills the rest with grey; libjpeg-turbo through simplejpeg refuses them
  (:func:`jpeg_damage` tells those messages from a file it merely does not support).
  "N extraneous bytes before marker" is not damage here: it is common and harmless in
  real datasets (ImageNet, webcam captures), every decoder gives the whole image;
- a PNG whose deflate stream is whole (valid CRCs, a clean end) but holds fewer rows than
  its header says: Pillow leaves the rest black (:func:`png_short_data`).
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

MAX_IMAGE_PIXELS = 89_478_485
"""The most pixels an image's header may declare by default (Pillow's ``Image.MAX_IMAGE_PIXELS``):
conversion's ``max_image_pixels`` and ``decode_images``' refuse larger ones before decoding."""

def bomb_reason(width: int, height: int, max_pixels: int, thousands: bool = False) -> str:
    """Why an image declaring ``width x height`` pixels, more than ``max_pixels``, is refused
    (conversion's discard reason, the native row path's text; ``thousands``: the numbers
    with separators, as ``decode_images``' error)."""
    n = f"{width * height:,}" if thousands else str(width * height)
    limit = f"{max_pixels:,}" if thousands else str(max_pixels)
    return f"decompression bomb: {width}x{height} = {n} pixels exceeds max_image_pixels={limit}"


MAX_JPEG_SCANS = 100
"""The most scans a JPEG may have (``SF_JPEG_MAX_SCANS`` in ``_native/imgcheck.h``): encoders
write 1 to about 20, and each costs a decoder a pass over the whole image."""

JPEG_DAMAGE = ("premature end", "bad huffman code", "bad arithmetic code", "instead of rst")
"""Words of libjpeg's messages that mean pixels are missing or wrong (matched lower-case)."""

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def jpeg_damage(message: str) -> bool:
    """Whether libjpeg-turbo's ``message`` (simplejpeg's error) says the compressed data is
    damaged (pixels missing or wrong), not that the file is of a kind it does not support."""
    text = message.lower()
    return any(word in text for word in JPEG_DAMAGE)


def jpeg_check(data: bytes, simplejpeg: Any) -> str | None:
    """libjpeg-turbo's message when ``data`` (a JPEG) is damaged inside its entropy-coded
    data, else None (also when simplejpeg refuses it for another reason, or is missing).
    Decodes at the smallest scale: every code is still read, the inverse DCT is cheap."""
    if simplejpeg is None:
        return None
    try:
        simplejpeg.decode_jpeg(data, colorspace="GRAY", min_height=1, min_width=1, min_factor=8)
    except ValueError as exc:
        return str(exc) if jpeg_damage(str(exc)) else None
    return None


def _png_raw_size(width: int, height: int, depth: int, color_type: int, interlace: int) -> int | None:
    channels = _PNG_CHANNELS.get(color_type)
    if channels is None or width <= 0 or height <= 0:
        return None
    bits = channels * depth
    if not interlace:
        return height * (1 + (width * bits + 7) // 8)
    total = 0
    for x0, y0, dx, dy in _ADAM7:
        cols, rows = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
        if cols > 0 and rows > 0:
            total += rows * (1 + (cols * bits + 7) // 8)
    return total


def png_short_data(data: bytes) -> str | None:
    """What is wrong when ``data`` (a PNG) holds fewer image bytes than its header says,
    or a deflate stream that does not inflate; None when they are all there (or the file
    is not a PNG this can judge: the structural check and the decoder judge those)."""
    if data[:8] != _PNG_MAGIC or len(data) < 33 or data[12:16] != b"IHDR":
        return None
    width, height, depth, color_type, _, _, interlace = struct.unpack(">IIBBBBB", data[16:29])
    want = _png_raw_size(width, height, depth, color_type, interlace)
    if want is None:
        return None
    inflate = zlib.decompressobj()
    got, pos = 0, 8
    try:
        while pos + 8 <= len(data):
            length, kind = struct.unpack(">I4s", data[pos:pos + 8])
            if kind == b"IDAT":
                piece = data[pos + 8:pos + 8 + length]
                while piece and got <= want:
                    got += len(inflate.decompress(piece, 1 << 20))
                    piece = inflate.unconsumed_tail
            elif kind == b"IEND":
                break
            pos += 12 + length
        got += len(inflate.flush())
    except zlib.error as exc:
        return f"PNG image data does not inflate ({exc})"
    if got < want:
        return (f"PNG image data holds {got:,} of the {want:,} bytes its header says ({width}x{height}): "
                "rows are missing")
    return None


__all__ = ["JPEG_DAMAGE", "bomb_reason", "jpeg_check", "jpeg_damage", "png_short_data"]
