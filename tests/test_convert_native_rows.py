"""Image-folder rows converted in the native core (``convert/native_rows.py``,
``_native/imgrows.c``): the same shards, indexes, manifest and discard report as the general
Python path, byte for byte, on folders with good, broken, odd and hostile files; the records
equal ``example_pieces``'s at every varint boundary; bad arguments and odd files never crash
or block the core."""

from __future__ import annotations

import io
import os
import threading

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image

from shardfeed import _native
from shardfeed.convert import api as convert_api
from shardfeed.convert import native_rows
from shardfeed.convert.options import ConvertOptions, Row
from shardfeed.convert.tasks import ConvertContext, TableConverter
from shardfeed.formats.example import example_pieces, features_entries
from shardfeed.formats.native import frame_records, native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="the native core is not built")


def photo(w: int, h: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    return Image.fromarray(a).convert(mode)


def encode(im: Image.Image, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def _exif(orientation: int) -> bytes:
    e = Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


def hostile_folder(root) -> str:
    """A label/file folder of good JPEGs and PNGs and every kind of file the native path must
    hand back or discard as the general path does."""
    jpg = encode(photo(64, 48), "JPEG")
    sos = jpg.index(b"\xff\xda")
    files = {
        "cats/good0.jpg": jpg,
        "cats/good1.jpg": encode(photo(40, 90, 1), "JPEG", progressive=True),
        "cats/big.jpg": encode(photo(300, 200, 2), "JPEG"),  # resized when max_image_size < 300
        "cats/trailing.jpg": jpg + b"camera data after EOI",
        "cats/été ünïcode.jpg": encode(photo(33, 17, 3), "JPEG"),
        "cats/rotated.jpg": encode(photo(64, 48, 4), "JPEG", exif=_exif(6)),
        "cats/grey.jpg": encode(photo(64, 48, 5, "L"), "JPEG"),
        "cats/cmyk.jpg": encode(photo(64, 48, 6, "CMYK"), "JPEG"),
        "cats/rgb.png": encode(photo(50, 30, 7), "PNG"),
        "cats/rgba.png": encode(photo(50, 30, 8, "RGBA"), "PNG"),
        "cats/anim.gif": encode(photo(20, 20, 9), "GIF"),
        "cats/empty.jpg": b"",
        "cats/text.jpg": b"not an image at all\n" * 20,
        "cats/truncated.jpg": jpg[:sos + 100],
        "cats/no-eoi.jpg": jpg[:-2],
        "cats/headers-only.jpg": jpg[:sos - 10],
        "cats/png-cut.png": encode(photo(50, 30, 10), "PNG")[:200],
        "dogs/good2.jpg": encode(photo(128, 127, 11), "JPEG"),
        "dogs/bomb.jpg": jpg[:jpg.index(b"\xff\xc0") + 5] + (60000).to_bytes(2, "big") * 2 + jpg[jpg.index(b"\xff\xc0")
                                                                                                + 9:],
        "dogs/" + "long-name-" * 20 + ".jpg": encode(photo(16, 16, 12), "JPEG"),
        "dogs/x/nested.jpg": jpg,  # not in the label/file layout
        "loose.jpg": jpg,  # neither
    }
    for rel, data in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    os.symlink(os.path.join(root, "nowhere.jpg"), os.path.join(root, "dogs", "dangling.jpg"))
    return str(root)


def converted(folder: str, out: str, **opts) -> dict[str, bytes]:
    """Every file the conversion wrote (shards, indexes, manifest, discard report, states)."""
    convert_api.convert(folder, out, progress=False, num_samples_per_tfrecord=5, **opts)
    found = {}
    for dirpath, _, names in os.walk(out):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                found[os.path.relpath(p, out)] = f.read()
    return found


@pytest.mark.parametrize("opts", [
    {},
    {"max_image_size": 100, "max_test_image_size": 64, "test_ratio": 0.3},
    {"image_format": "png"},
    {"read_parallel_num": 2, "executor": "process"},
    {"error_class": "dogs"},
], ids=["plain", "resize-and-split", "png", "processes", "error-class"])
def test_native_path_gives_the_python_paths_shards_and_discards_byte_for_byte(tmp_path, monkeypatch, opts):
    folder = hostile_folder(tmp_path / "imgs")
    native = converted(folder, str(tmp_path / "native"), **opts)
    monkeypatch.setenv(native_rows.ENV_SWITCH, "0")  # inherited by worker processes
    python = converted(folder, str(tmp_path / "python"), **opts)
    assert sorted(native) == sorted(python)
    for name in python:
        assert native[name] == python[name], name
    discards = python["data-discards.csv"].decode()
    for reason in ("empty file (0 bytes)", "JPEG truncated", "not an image", "not in the label/file layout"):
        assert reason in discards, reason
    if "error_class" not in opts:
        assert "decompression bomb: 60000x60000" in discards and "image not found" in discards


def _rows(folder: str) -> list[Row]:
    from shardfeed.convert.sources import read_image_folder

    return read_image_folder(folder)[0]


def _converter(**opts) -> TableConverter:
    from shardfeed.convert.classes import LabelMap

    ctx = ConvertContext(ConvertOptions(**opts), label_map=LabelMap(["cats", "dogs"]))
    return TableConverter(ctx)


def test_native_path_judges_the_common_rows_and_leaves_the_rest_to_python(tmp_path):
    folder = hostile_folder(tmp_path / "imgs")
    rows = _rows(folder)
    path = native_rows.native_image_rows(_converter())
    assert path is not None
    frames, results = path.convert(rows)
    by_name = {os.path.basename(r.image_uri): res for r, res in zip(rows, results)}
    for kept in ("good0.jpg", "good1.jpg", "big.jpg", "trailing.jpg", "été ünïcode.jpg", "good2.jpg"):
        assert type(by_name[kept]) is int, kept
    assert by_name["empty.jpg"] == "empty file (0 bytes)"
    assert by_name["truncated.jpg"].startswith("corrupt image: JPEG truncated")
    assert by_name["bomb.jpg"] == ("decompression bomb: 60000x60000 = 3600000000 pixels exceeds "
                                   "max_image_pixels=89478485")
    for general in ("rotated.jpg", "grey.jpg", "cmyk.jpg", "rgb.png", "anim.gif", "text.jpg", "dangling.jpg"):
        assert by_name[general] is None, general
    assert len(frames) == sum(r + 16 for r in results if type(r) is int)


def test_general_path_taken_where_the_native_one_does_not_apply():
    assert native_rows.native_image_rows(_converter(image_check="decode")) is None
    assert native_rows.native_image_rows(TableConverter(_converter().ctx, has_image=False)) is None

    class Custom(TableConverter):
        pass

    assert native_rows.native_image_rows(Custom(_converter().ctx)) is None


@pytest.mark.parametrize("size", [1, 127, 128, 16_300, 16_383, 16_384, 16_390, 2_097_152 + 5])
def test_native_records_equal_example_pieces_at_varint_boundaries(tmp_path, size):
    """File, path, label text, width and height lengths on both sides of 128 and 16,384."""
    rng = np.random.default_rng(size)
    for w, h, fmt in ((127, 128, "JPEG"), (128, 127, "PNG"), (1, 16_384 // 100, "JPEG")):
        base = encode(photo(w, h, size % 7), fmt)
        data = base + bytes(rng.integers(0, 256, max(0, size - len(base)), dtype=np.uint8))  # after EOI / IEND
        name = "p" * (200 if size % 2 else 20) + (".png" if fmt == "PNG" else ".jpg")
        p = tmp_path / name
        p.write_bytes(data)
        for text in ("t", "x" * 127, "y" * 128, "é" * 200):
            tail = features_entries({"image/class/label": size % 300, "image/class/text": text})
            want = "png" if fmt == "PNG" else "jpeg"
            frames, results = _native.image_rows([str(p)], [tail], [0], 2 if fmt == "PNG" else 1, 1 << 40)
            feats = {"image/encoded": data, "image/format": want, "image/height": h, "image/width": w,
                     "image/channels": 3, "image/source_id": str(p), "image/class/label": size % 300,
                     "image/class/text": text}
            expected = frame_records([example_pieces(feats)[0]])
            assert results == [len(expected) - 16]
            assert bytes(frames) == expected


def test_image_rows_rejects_bad_arguments_with_a_message():
    with pytest.raises(ValueError, match="same length"):
        _native.image_rows(["a"], [], [0], 1, 10)
    with pytest.raises(ValueError, match="want must be 1"):
        _native.image_rows([], [], [], 3, 10)
    with pytest.raises(TypeError, match="row 0"):
        _native.image_rows([b"path"], [b""], [0], 1, 10)
    with pytest.raises(TypeError, match="row 1"):
        _native.image_rows(["a", "b"], [b"", "tail"], [0, 0], 1, 10)
    with pytest.raises(TypeError, match="row 0"):
        _native.image_rows(["a"], [b""], [1.5], 1, 10)
    with pytest.raises(OverflowError):
        _native.image_rows(["a"], [b""], [1 << 70], 1, 10)
    with pytest.raises(TypeError):
        _native.image_rows(("a",), [b""], [0], 1, 10)
    frames, results = _native.image_rows([], [], [], 1, 10)
    assert len(frames) == 0 and results == []


def test_image_rows_hands_odd_paths_back_without_reading_or_blocking(tmp_path):
    fifo = tmp_path / "fifo.jpg"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer
    jpg = encode(photo(8, 8), "JPEG")
    (tmp_path / "ok.jpg").write_bytes(jpg)
    paths = [str(fifo), "", str(tmp_path / "ok.jpg") + "\x00.png", str(tmp_path), str(tmp_path / "missing.jpg"),
             "\udce9.jpg", None, str(tmp_path / "ok.jpg")]
    done: list = []
    t = threading.Thread(target=lambda: done.append(
        _native.image_rows(paths, [b""] * len(paths), [0] * len(paths), 1, 1 << 30)), daemon=True)
    t.start()
    t.join(60)
    assert done, "image_rows blocked"
    frames, results = done[0]
    assert results[:-1] == [None] * (len(paths) - 1)
    assert type(results[-1]) is int and len(frames) == results[-1] + 16


def test_image_rows_limits_apply_as_in_load_image(tmp_path):
    jpg = encode(photo(64, 48), "JPEG")
    p = str(tmp_path / "a.jpg")
    with open(p, "wb") as f:
        f.write(jpg)
    one = [p]
    assert _native.image_rows(one, [b""], [63], 1, 1 << 30)[1] == [None]  # to be resized: Python's
    assert type(_native.image_rows(one, [b""], [64], 1, 1 << 30)[1][0]) is int
    assert _native.image_rows(one, [b""], [-1], 1, 1 << 30)[1] == [None]
    assert _native.image_rows(one, [b""], [0], 1, 64 * 48 - 1)[1][0] == ("bomb", 64, 48)  # worded by images.py
    assert type(_native.image_rows(one, [b""], [0], 1, 64 * 48)[1][0]) is int
    assert _native.image_rows(one, [b""], [0], 1, -1)[1][0] == ("bomb", 64, 48)
    assert _native.image_rows(one, [b""], [0], 2, 1 << 30)[1] == [None]  # a PNG wanted: Python re-encodes
