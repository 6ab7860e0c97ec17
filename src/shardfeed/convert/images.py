"""Decode, normalize, resize and encode one image (Pillow).

Every image comes out 8-bit RGB, upright (EXIF orientation applied), no longer than
``max_size`` on its longest side (aspect kept, never upscaled), encoded as JPEG or PNG.
The original bytes are kept when nothing needs changing and the format already matches.
Anything Pillow cannot make sense of raises :class:`~shardfeed.convert.options.Discard`
with a reason, never a bare library error.

Kept bytes are checked one of two ways (``image_check``). ``"header"`` (the default): the
native core walks the file's structure without decoding pixels (JPEG: SOI, frame header,
tables, scans, EOI, every segment length; PNG: signature, IHDR, every chunk's CRC-32, IEND;
see ``_native/imgcheck.h``) and reads the size from the frame header or IHDR, about 100
times cheaper than a decode; a truncated or garbled file is discarded with what is wrong
and at which byte. It does not decode the compressed image data, so damage inside a JPEG's
entropy-coded data (or a PNG's deflate stream behind valid CRCs) passes; ``"decode"``
makes the same structural check, then the damage checks of
:mod:`~shardfeed.formats.image_damage` (a JPEG's scan through libjpeg-turbo, which refuses
what libjpeg only warns about; a PNG's rows against its header), and decodes every kept
image fully. Any file the header check cannot judge as plainly keepable (not JPEG/PNG,
12-bit, lossless or arithmetic JPEG, EXIF orientation other than 1, grey/CMYK/alpha,
multi-picture) takes the decode path either way,
so both give the same features for every image they keep. Pillow releases the GIL while it decodes,
resizes and encodes, so threads scale; large JPEGs are decoded at reduced size
(``Image.draft``, DCT scaling) when the target is at most half their size.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from ..formats.image_damage import MAX_IMAGE_PIXELS, bomb_reason, jpeg_check, png_short_data
from ..formats.native import image_check as _native_image_check
from ..pipeline.images import _simplejpeg, gray_to_8_bits
from .options import Discard

_EXIF_ORIENTATION = 0x0112


def _pil():
    try:
        from PIL import Image, ImageOps
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("image conversion needs Pillow: pip install 'shardfeed[convert]'") from exc
    return Image, ImageOps


@dataclass
class EncodedImage:
    data: bytes
    format: str  # "jpeg" or "png"
    height: int
    width: int
    original_height: int
    original_width: int

    @property
    def scale(self) -> tuple[float, float]:
        """(x, y) factors from original to stored pixel coordinates."""
        return self.width / self.original_width, self.height / self.original_height


def target_size(width: int, height: int, max_size: int | None) -> tuple[int, int]:
    """(width, height) with the longest side at most ``max_size``; never larger than now."""
    longest = max(width, height)
    if not max_size or longest <= max_size:
        return width, height
    s = max_size / longest
    return max(1, round(width * s)), max(1, round(height * s))


def empty_reason() -> str:
    """The discard reason of an empty image file."""
    return "empty file (0 bytes)"


def corrupt_reason(error: str, offset: int) -> str:
    """The discard reason of a JPEG/PNG the structural check refused at byte ``offset``."""
    return f"corrupt image: {error} (at byte {offset})"


def _open(data: bytes, max_pixels: int):
    Image, _ = _pil()
    # No warnings.catch_warnings() here: it swaps process-wide filters and is not thread-safe.
    # Pillow may warn about a large image; the size check below decides what is kept.
    try:
        im = Image.open(io.BytesIO(data))
    except Image.UnidentifiedImageError:
        raise Discard("not an image (Pillow cannot identify the file format)") from None
    except Image.DecompressionBombError:
        raise Discard("decompression bomb: the image declares more pixels than Pillow allows") from None
    except Exception as exc:  # noqa: BLE001 - any decoder failure is a bad file
        raise Discard(f"corrupt image: {type(exc).__name__}: {str(exc)[:120]}") from None
    w, h = im.size
    if w * h > max_pixels:
        raise Discard(bomb_reason(w, h, max_pixels))
    if w < 1 or h < 1:
        raise Discard(f"empty image ({w}x{h})")
    return im


def _to_rgb(im):
    """8-bit RGB from any mode: alpha composited on white, 16-bit scaled down, CMYK converted."""
    Image, _ = _pil()
    mode = im.mode
    if mode == "RGB":
        return im
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        # 16-bit (or 32-bit int) grayscale: scale the full range to 8 bits instead of clipping
        import numpy as np

        return Image.fromarray(gray_to_8_bits(np.asarray(im), mode), "L").convert("RGB")
    if mode == "F":
        return im.convert("L").convert("RGB")
    if mode == "P":
        im = im.convert("RGBA") if "transparency" in im.info else im.convert("RGB")
        mode = im.mode
        if mode == "RGB":
            return im
    if mode in ("RGBA", "LA", "RGBa", "La", "PA"):
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im.convert("RGB")  # L, 1, CMYK, YCbCr, LAB, HSV


def _kept_by_header(data: bytes, max_size: int | None, want: str, max_pixels: int) -> EncodedImage | None:
    """The image with its bytes kept as they are, judged from its headers alone; ``None``
    when it needs the decode path (it must change, or only a decoder can judge it).

    Raises :class:`Discard` for a structurally broken JPEG/PNG or one over ``max_pixels``.
    """
    h = _native_image_check(data)
    if h is None or not h.format:
        return None  # no native core, or not a JPEG/PNG: Pillow decides
    if h.error is not None:
        raise Discard(corrupt_reason(h.error, h.error_offset))
    if h.width * h.height > max_pixels:
        raise Discard(bomb_reason(h.width, h.height, max_pixels))
    rgb = h.components == 3 if h.format == "jpeg" else h.color_type == 2
    if (h.format != want or not rgb or h.unusual or h.orientation_unsure or h.orientation not in (0, 1)
            or target_size(h.width, h.height, max_size) != (h.width, h.height)):
        return None
    return EncodedImage(bytes(data), want, h.height, h.width, h.height, h.width)


def load_image(data: bytes, *, max_size: int | None = None, image_format: str = "jpg",
               jpeg_quality: int = 90, max_pixels: int = MAX_IMAGE_PIXELS, check: str = "decode") -> EncodedImage:
    """Turn the bytes of an image file into stored bytes (see the module docstring).

    ``check``: how bytes that are kept as they are get verified, ``"decode"`` (a full
    decode) or ``"header"`` (the native structural check; see the module docstring).
    Raises :class:`Discard` for a non-image, a corrupt or truncated file, or an image over
    ``max_pixels`` pixels (checked from the header, before decoding).
    """
    if not data:
        raise Discard(empty_reason())
    want = "jpeg" if image_format in ("jpg", "jpeg") else "png"
    if check == "header":
        kept = _kept_by_header(data, max_size, want, max_pixels)
        if kept is not None:
            return kept
    elif check != "decode":
        raise ValueError(f"check must be 'header' or 'decode', got {check!r}")
    else:  # the decode check is the header check and more: a PNG cut in its last chunks decodes
        h = _native_image_check(data)  # whole (found from outside), but the file is truncated
        if h is not None and h.format and h.error is not None:
            raise Discard(corrupt_reason(h.error, h.error_offset))
        # and damage a lenient decoder fills in (grey, black) that Pillow's decode does not
        # report: a JPEG's entropy-coded data cut or garbled, a PNG's rows missing behind
        # valid CRCs (formats/image_damage.py; found from outside: "decode" kept what
        # "header" kept)
        damage = jpeg_check(data, _simplejpeg()) if data[:3] == b"\xff\xd8\xff" else png_short_data(data)
        if damage is not None:
            raise Discard(f"corrupt image: {damage[:160]}")
    Image, ImageOps = _pil()
    im = _open(data, max_pixels)
    ow, oh = im.size
    src_format = (im.format or "").upper()
    if src_format != "JPEG":
        # decoded now: a PNG's EXIF, read next, decodes it, and a failure there (a broken
        # deflate stream) was taken for a broken EXIF block, the image kept half decoded
        try:
            im.load()
        except Exception as exc:  # noqa: BLE001
            raise Discard(f"corrupt image: {type(exc).__name__}: {str(exc)[:120]}") from None
    try:
        orientation = im.getexif().get(_EXIF_ORIENTATION, 1) if src_format in ("JPEG", "TIFF", "WEBP", "PNG") else 1
    except Exception:  # noqa: BLE001 - a broken EXIF block is not worth dropping the image
        orientation = 1
    rotated = orientation in (5, 6, 7, 8)
    uw, uh = (oh, ow) if rotated else (ow, oh)  # upright size
    tw, th = target_size(uw, uh, max_size)
    keep = (tw, th) == (uw, uh) and orientation in (1, None) and im.mode == "RGB" and (
        (want == "jpeg" and src_format == "JPEG") or (want == "png" and src_format == "PNG"))
    if keep:
        try:
            im.load()  # the bytes are kept, but a truncated or corrupt file must still be caught
        except Exception as exc:  # noqa: BLE001
            raise Discard(f"corrupt image: {type(exc).__name__}: {str(exc)[:120]}") from None
        return EncodedImage(bytes(data), want, oh, ow, uh, uw)
    try:
        if src_format == "JPEG" and (tw, th) != (uw, uh):
            dw, dh = (th, tw) if rotated else (tw, th)
            im.draft("RGB", (dw, dh))  # DCT-domain downscale; keeps the result >= the target
        im.load()
        if orientation not in (1, None):
            im = ImageOps.exif_transpose(im)
        im = _to_rgb(im)
        if im.size != (tw, th):
            im = im.resize((tw, th), Image.Resampling.BILINEAR, reducing_gap=None)
        out = io.BytesIO()
        if want == "jpeg":
            im.save(out, "JPEG", quality=jpeg_quality)
        else:
            im.save(out, "PNG", compress_level=3)
    except Discard:
        raise
    except Exception as exc:  # noqa: BLE001 - truncated data, bad markers, decoder errors
        raise Discard(f"corrupt image: {type(exc).__name__}: {str(exc)[:120]}") from None
    return EncodedImage(out.getvalue(), want, th, tw, uh, uw)


def image_size(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> tuple[int, int]:
    """(width, height) from the header; raises :class:`Discard` for a non-image."""
    return _open(data, max_pixels).size


def load_mask(data: bytes, size: tuple[int, int], *, channel: int = 2, max_pixels: int = MAX_IMAGE_PIXELS) -> bytes:
    """A segmentation mask as a single-channel PNG of ``size`` (width, height).

    PAI masks keep the class in channel ``channel`` (0-based) of a colour PNG; a
    single-channel (L or P) mask is used as it is. Resized with nearest neighbour so class
    ids stay class ids. Raises :class:`Discard` for a mask that is not an image.
    """
    Image, _ = _pil()
    im = _open(data, max_pixels)
    try:
        im.load()
        if im.mode in ("L", "P"):
            m = im if im.mode == "L" else Image.frombytes("L", im.size, im.tobytes())  # palette indices
        elif im.mode == "1" or im.mode == "I" or im.mode.startswith("I;16"):
            # a 1-bit mask holds ids 0/1, a 16/32-bit one ids that the stored 8-bit mask can hold only
            # up to 255 (before: 1-bit refused for a missing channel, ids above 255 stored as 255)
            ids = np.asarray(im)
            low, top = (int(ids.min()), int(ids.max())) if ids.size else (0, 0)
            if low < 0 or top > 255:
                raise Discard(f"mask holds class id {top if top > 255 else low}, outside 0-255 "
                              "(the stored mask is one 8-bit channel)")
            m = Image.fromarray(ids.astype(np.uint8), "L")
        else:
            bands = im.split()
            if channel >= len(bands):
                raise Discard(f"mask has {len(bands)} channels; the class channel {channel} is missing")
            m = bands[channel]
        if m.size != size:
            m = m.resize(size, Image.Resampling.NEAREST)
        out = io.BytesIO()
        m.save(out, "PNG")
    except Discard:
        raise
    except Exception as exc:  # noqa: BLE001
        raise Discard(f"corrupt mask image: {type(exc).__name__}: {str(exc)[:120]}") from None
    return out.getvalue()
