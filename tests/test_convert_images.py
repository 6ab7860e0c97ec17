"""Image loading for conversion: every odd image either comes out 8-bit RGB, upright and
no larger than asked, or is discarded with a reason."""

from __future__ import annotations

import io

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image

from shardfeed.convert.images import load_image, load_mask, target_size
from shardfeed.convert.options import Discard


def encode(im: Image.Image, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def gradient(w: int = 64, h: int = 48) -> Image.Image:
    x = np.linspace(0, 255, w, dtype=np.uint8)[None, :, None]
    y = np.linspace(0, 255, h, dtype=np.uint8)[:, None, None]
    return Image.fromarray(np.concatenate([np.broadcast_to(x, (h, w, 1)), np.broadcast_to(y, (h, w, 1)),
                                           np.full((h, w, 1), 128, np.uint8)], axis=2))


def decoded(img) -> Image.Image:
    im = Image.open(io.BytesIO(img.data))
    im.load()
    return im


def test_target_size_keeps_aspect_and_never_upscales():
    assert target_size(640, 480, 224) == (224, 168)
    assert target_size(480, 640, 224) == (168, 224)
    assert target_size(100, 50, 224) == (100, 50)
    assert target_size(100, 50, None) == (100, 50)
    assert target_size(10000, 1, 100) == (100, 1)


def test_jpeg_that_needs_no_change_keeps_its_original_bytes():
    data = encode(gradient(), "JPEG", quality=80)
    img = load_image(data, max_size=100, image_format="jpg")
    assert img.data == data and (img.width, img.height) == (64, 48) and img.format == "jpeg"


def test_png_input_is_reencoded_when_jpeg_is_asked_and_kept_when_png_is():
    data = encode(gradient(), "PNG")
    as_jpeg = load_image(data, image_format="jpg")
    assert as_jpeg.format == "jpeg" and decoded(as_jpeg).format == "JPEG"
    as_png = load_image(data, image_format="png")
    assert as_png.data == data


def test_large_jpeg_is_resized_to_the_longest_side_with_aspect_kept():
    data = encode(gradient(640, 480), "JPEG", quality=90)
    img = load_image(data, max_size=224)
    im = decoded(img)
    assert im.size == (224, 168) == (img.width, img.height)
    assert (img.original_width, img.original_height) == (640, 480)
    # colours survive the reduced-size decode: left edge dark red channel, right edge bright
    a = np.asarray(im).astype(int)
    assert a[:, :5, 0].mean() < 40 and a[:, -5:, 0].mean() > 215


@pytest.mark.parametrize("mode", ["CMYK", "L", "RGBA", "P", "LA", "1"])
def test_unusual_modes_come_out_as_rgb(mode):
    im = gradient().convert(mode)
    fmt = "JPEG" if mode in ("CMYK", "L") else "PNG"
    img = load_image(encode(im, fmt), image_format="jpg")
    out = decoded(img)
    assert out.mode == "RGB" and out.size == (64, 48)


def test_transparent_pixels_are_composited_on_white():
    a = np.zeros((8, 8, 4), np.uint8)  # fully transparent black
    img = load_image(encode(Image.fromarray(a, "RGBA"), "PNG"), image_format="png")
    assert np.asarray(decoded(img)).min() == 255


def test_sixteen_bit_png_is_scaled_to_eight_bits_not_clipped():
    a = np.tile(np.array([0, 32768, 65535], np.uint16), (4, 1))
    data = encode(Image.fromarray(a), "PNG")
    out = np.asarray(decoded(load_image(data, image_format="png")))
    assert out.shape == (4, 3, 3)
    assert list(out[0, :, 0]) == [0, 128, 255]


def test_exif_rotated_jpeg_is_stored_upright():
    im = gradient(64, 32)  # landscape as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    data = encode(im, "JPEG", exif=exif.tobytes())
    img = load_image(data, image_format="jpg")
    assert (img.width, img.height) == (32, 64)
    assert decoded(img).size == (32, 64)
    assert img.data != data


def test_exif_rotated_jpeg_resize_uses_the_upright_size():
    exif = Image.Exif()
    exif[0x0112] = 8
    data = encode(gradient(400, 200), "JPEG", exif=exif.tobytes())
    img = load_image(data, max_size=100)
    assert (img.width, img.height) == (50, 100)


def test_decompression_bomb_is_discarded_from_its_header():
    data = encode(Image.new("L", (3000, 3000)), "PNG")
    with pytest.raises(Discard, match="decompression bomb"):
        load_image(data, max_pixels=1_000_000)


@pytest.mark.parametrize("data, reason", [
    (b"", "empty file"),
    (b"hello, this is a text file\n" * 10, "not an image"),
    (b"\xff\xd8\xff\xe0" + b"\x00" * 50, "not an image|corrupt"),
])
def test_non_images_are_discarded_with_a_reason(data, reason):
    with pytest.raises(Discard, match=reason):
        load_image(data)


def test_truncated_jpeg_is_discarded_as_corrupt_even_when_bytes_would_be_kept():
    data = encode(gradient(), "JPEG")
    with pytest.raises(Discard, match="corrupt"):
        load_image(data[: len(data) // 2], image_format="jpg")


def test_mask_takes_the_class_channel_and_resizes_nearest():
    a = np.zeros((40, 40, 3), np.uint8)
    a[:, 20:, 2] = 3  # class 3 on the right half, in channel 2
    png = load_mask(encode(Image.fromarray(a), "PNG"), (20, 20))
    m = np.asarray(Image.open(io.BytesIO(png)))
    assert m.shape == (20, 20) and set(np.unique(m)) == {0, 3}
