"""``image_check="header"``: images stored as they are get verified by the native
structural check (JPEG marker walk, PNG chunks and CRCs) instead of a full decode. Broken
files are discarded with a reason, never a failed job; good images give the same features
as the decode path."""

from __future__ import annotations

import csv
import io
import os
import struct
import zlib

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image

from shardfeed.cli.main import main
from shardfeed.convert import api as convert_api
from shardfeed.convert.images import load_image
from shardfeed.convert.options import ConvertOptions, Discard
from shardfeed.formats.native import image_check, native_available
from shardfeed.formats.tfrecord import read_records
from tests.imagefiles import repeat_scan

needs_native = pytest.mark.skipif(not native_available(), reason="the header check is in the native core")


def encode(im: Image.Image, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def photo(w: int = 96, h: int = 64, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 255, w)[None, :]
    y = np.linspace(0, 255, h)[:, None]
    a = np.stack([x + 0 * y, y + 0 * x, (x + y) / 2], axis=2) + rng.normal(0, 12, (h, w, 3))
    return Image.fromarray(a.clip(0, 255).astype(np.uint8))


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def jpeg_with_size(data: bytes, w: int, h: int) -> bytes:
    """``data`` with its frame header (SOF0) patched to declare ``w`` x ``h``."""
    i = data.index(b"\xff\xc0")
    return data[:i + 5] + struct.pack(">HH", h, w) + data[i + 9:]


GOOD = {
    "baseline 4:2:0": lambda: encode(photo(), "JPEG", quality=85),
    "baseline 4:4:4": lambda: encode(photo(), "JPEG", quality=95, subsampling=0),
    "progressive": lambda: encode(photo(), "JPEG", progressive=True),
    "optimized tables": lambda: encode(photo(), "JPEG", optimize=True),
    "odd size": lambda: encode(photo(33, 17), "JPEG"),
    "EXIF orientation 1": lambda: encode(photo(), "JPEG", exif=_exif(1)),
    "EXIF rotated": lambda: encode(photo(), "JPEG", exif=_exif(6)),
    "grey JPEG": lambda: encode(photo().convert("L"), "JPEG"),
    "CMYK JPEG": lambda: encode(photo().convert("CMYK"), "JPEG"),
    "needs a resize": lambda: encode(photo(640, 480), "JPEG"),
    "RGB PNG": lambda: encode(photo(), "PNG"),
    "RGBA PNG": lambda: encode(photo().convert("RGBA"), "PNG"),
    "palette PNG": lambda: encode(photo().convert("P"), "PNG"),
    "GIF": lambda: encode(photo(), "GIF"),
}


def _exif(orientation: int) -> bytes:
    e = Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


@pytest.mark.parametrize("image_format", ["jpg", "png"])
@pytest.mark.parametrize("name", sorted(GOOD))
def test_header_check_gives_the_decode_paths_image_for_good_files(name, image_format):
    data = GOOD[name]()
    by_header = load_image(data, max_size=200, image_format=image_format, check="header")
    by_decode = load_image(data, max_size=200, image_format=image_format, check="decode")
    assert by_header == by_decode


@needs_native
def test_header_check_reads_size_and_layout_without_decoding():
    h = image_check(encode(photo(33, 17), "JPEG", progressive=True))
    assert (h.format, h.width, h.height, h.components, h.bit_depth, h.error) == ("jpeg", 33, 17, 3, 8, None)
    h = image_check(encode(photo(40, 30).convert("RGBA"), "PNG"))
    assert (h.format, h.width, h.height, h.components, h.color_type, h.error) == ("png", 40, 30, 4, 6, None)
    assert image_check(encode(photo(), "JPEG", exif=_exif(6))).orientation == 6
    assert image_check(b"GIF89a not a jpeg or png").format == ""


def _truncations():
    jpg = encode(photo(), "JPEG")
    sos = jpg.index(b"\xff\xda")
    png = encode(photo(), "PNG")
    return {
        "JPEG cut inside the headers": (jpg[:sos - 10], "JPEG truncated"),
        "JPEG cut inside the image data": (jpg[:sos + 200], "JPEG truncated"),
        "JPEG missing only EOI": (jpg[:-2], "JPEG truncated"),
        "PNG cut in half": (png[:len(png) // 2], "PNG truncated"),
        "PNG without IEND": (png[:-12], "PNG truncated"),
    }


def _garbles():
    jpg = bytearray(encode(photo(), "JPEG"))
    dqt = jpg.index(b"\xff\xdb")
    bad_len = bytearray(jpg)
    bad_len[dqt + 2:dqt + 4] = b"\x00\x01"  # a segment length below 2
    no_marker = bytearray(jpg)
    no_marker[dqt] = 0x00  # bytes where a marker should be
    sof = jpg.index(b"\xff\xc0")
    bad_sampling = bytearray(jpg)
    bad_sampling[sof + 11] = 0x00  # the first component's sampling factors 0x0
    sos_first = bytearray(jpg)
    sos_first[sof + 1] = 0xDA  # the frame header turned into a scan header: a scan before any frame
    png = bytearray(encode(photo(), "PNG"))
    flipped = bytearray(png)
    flipped[len(png) // 2] ^= 0x40  # inside IDAT: its CRC no longer matches
    return {
        "JPEG bad segment length": (bytes(bad_len), "JPEG garbled: a segment length below 2"),
        "JPEG junk where a marker belongs": (bytes(no_marker), "JPEG garbled"),
        "JPEG bad sampling factor": (bytes(bad_sampling), "sampling factor"),
        "JPEG scan before frame": (bytes(sos_first), "JPEG garbled"),
        "PNG flipped bit": (bytes(flipped), "CRC does not match"),
        "PNG without IHDR": (bytes(png[:8] + png[33:]), "first chunk is not IHDR"),
    }


BROKEN = {
    **{k: v for k, v in _truncations().items()},
    **{k: v for k, v in _garbles().items()},
    "empty file": (b"", "empty file"),
    "text file": (b"hello, this is a text file\n" * 10, "not an image"),
    "JPEG zero width": (jpeg_with_size(encode(photo(), "JPEG"), 0, 64), "width 0"),
    "huge JPEG": (jpeg_with_size(encode(photo(), "JPEG"), 65000, 65000), "decompression bomb: 65000x65000"),
    "JPEG with 101 scans": (repeat_scan(encode(photo(), "JPEG", progressive=True), 101),
                            "more scans than any encoder writes"),
    "huge PNG": (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0))
                 + png_chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + png_chunk(b"IEND", b""),
                 "decompression bomb: 100000x100000"),
}


@needs_native
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_files_are_discarded_by_the_header_check_with_a_reason(name):
    data, reason = BROKEN[name]
    with pytest.raises(Discard, match=reason):
        load_image(data, image_format="png" if "PNG" in name else "jpg", check="header")


@needs_native
@pytest.mark.parametrize("cut", [12, 20])
def test_the_decode_check_discards_what_the_header_check_does(cut):
    """A PNG cut in its last chunks (IEND, the last CRC) decodes whole with Pillow: "decode"
    kept it while "header" discarded it (found from outside); the decode check is the header
    check and more now."""
    png = encode(photo(), "PNG")
    for check in ("header", "decode"):
        with pytest.raises(Discard, match="PNG truncated"):
            load_image(png[:-cut], image_format="png", check=check)
        assert load_image(png, image_format="png", check=check).data == png


@needs_native
def test_structure_errors_name_the_byte_where_they_were_found():
    jpg = encode(photo(), "JPEG")
    with pytest.raises(Discard, match=rf"at byte {len(jpg) - 2}\)"):
        load_image(jpg[:-2], check="header")


@needs_native
def test_header_check_accepts_bytes_after_eoi_and_restart_markers():
    data = encode(photo(), "JPEG") + b"trailing camera data"
    assert load_image(data, check="header").data == data
    # restart markers inside the image data (libjpeg's restart_interval)
    from PIL import JpegImagePlugin  # noqa: F401

    rst = encode(photo(256, 64), "JPEG", restart_marker_blocks=1)
    assert any(rst[i] == 0xFF and 0xD0 <= rst[i + 1] <= 0xD7 for i in range(len(rst) - 1))
    assert load_image(rst, check="header") == load_image(rst, check="decode")


def _folder(tmp_path, broken: dict[str, bytes]):
    root = tmp_path / "imgs"
    for c in ("cats", "dogs"):
        (root / c).mkdir(parents=True)
    good = {}
    for i in range(6):
        for c in ("cats", "dogs"):
            data = encode(photo(64 + 8 * i, 48, seed=i), "JPEG", progressive=bool(i % 2))
            (root / c / f"good{i}.jpg").write_bytes(data)
            good[f"{c}/good{i}.jpg"] = data
    for name, data in broken.items():
        (root / "cats" / name).write_bytes(data)
    return str(root)


def _records(out):
    m = convert_api.load_manifest(out)
    return [r for sp in sorted(m["splits"]) for s in m["splits"][sp]["shards"]
            for r in read_records(os.path.join(out, s["file"]))]


def _discards(out):
    with open(os.path.join(out, "data-discards.csv"), encoding="utf-8") as f:
        return {os.path.basename(r["source"]): r["reason"] for r in csv.DictReader(f)}


@needs_native
def test_convert_writes_the_same_records_either_way_and_reports_every_broken_file(tmp_path):
    broken = {f"broken{i}.jpg": BROKEN[name][0] for i, name in enumerate(
        ["JPEG cut inside the image data", "JPEG missing only EOI", "JPEG bad segment length", "empty file",
         "text file", "huge JPEG", "JPEG with 101 scans"])}
    folder = _folder(tmp_path, broken)
    header = convert_api.convert(folder, str(tmp_path / "h"), progress=False, num_samples_per_tfrecord=4)
    decode = convert_api.convert(folder, str(tmp_path / "d"), progress=False, num_samples_per_tfrecord=4,
                                 image_check="decode")
    assert header.manifest["options"]["image_check"] == "header"
    assert decode.manifest["options"]["image_check"] == "decode"
    assert header.records_written == 12 and header.rows_discarded == 7
    # every good image: byte for byte the same records (same bytes, same height/width)
    assert _records(str(tmp_path / "h")) == _records(str(tmp_path / "d"))
    reasons = _discards(str(tmp_path / "h"))
    assert set(reasons) == set(broken)
    assert "JPEG truncated" in reasons["broken0.jpg"] and "JPEG truncated" in reasons["broken1.jpg"]
    assert "segment length below 2" in reasons["broken2.jpg"]
    assert reasons["broken3.jpg"].startswith("empty file")
    assert reasons["broken4.jpg"].startswith("not an image")
    assert reasons["broken5.jpg"].startswith("decompression bomb")
    assert "more scans than any encoder writes" in reasons["broken6.jpg"]


def test_image_check_option_is_validated():
    assert ConvertOptions().image_check == "header"
    with pytest.raises(ValueError, match="image_check must be 'header'.*or 'decode'"):
        ConvertOptions(image_check="none")


def test_cli_image_check_flag_reaches_the_manifest(tmp_path):
    folder = _folder(tmp_path, {"cut.jpg": encode(photo(), "JPEG")[:300]})
    out = str(tmp_path / "out")
    assert main(["convert", folder, out, "--image_check", "decode", "-q"]) == 0
    m = convert_api.load_manifest(out)
    assert m["options"]["image_check"] == "decode" and m["counts"]["rows_discarded"] == 1
    out2 = str(tmp_path / "out2")
    assert main(["convert", folder, out2, "--image-check", "header", "-q"]) == 0
    assert convert_api.load_manifest(out2)["options"]["image_check"] == "header"
    with pytest.raises(SystemExit):
        main(["convert", folder, str(tmp_path / "out3"), "--image_check", "pixels", "-q"])


@needs_native
def test_damage_inside_the_entropy_coded_data_passes_the_header_check_as_documented():
    # docs/conversion.md: bytes overwritten inside a JPEG's scan data leave its structure
    # intact; the header check keeps the file (and here a full decode accepts it too)
    data = bytearray(encode(photo(), "JPEG", quality=90))
    start = data.index(b"\xff\xda") + 20
    for i in range(start, len(data) - 40, 97):
        data[i] = 0x55
    damaged = bytes(data)
    assert load_image(damaged, check="header").data == damaged
    assert load_image(damaged, check="decode").data == damaged


def _png_half_rows() -> bytes:
    """A PNG whose deflate stream is whole, CRCs valid, but holds half the rows its header says."""
    a = np.asarray(photo(96, 64))
    raw = b"".join(b"\x00" + a[r].tobytes() for r in range(32))
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 96, 64, 8, 2, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b""))


def _png_broken_deflate() -> bytes:
    """A bit flipped inside the deflate stream, the CRC made again: Pillow fails half way."""
    data = bytearray(encode(photo(96, 64), "PNG"))
    at = data.index(b"IDAT")
    length = struct.unpack(">I", data[at - 4:at])[0]
    data[at + 4 + length // 2] ^= 0x40
    data[at + 4 + length:at + 8 + length] = struct.pack(">I", zlib.crc32(bytes(data[at:at + 4 + length])))
    return bytes(data)


@needs_native
@pytest.mark.parametrize("case", ["jpeg frame taller than its scan", "png rows missing", "png deflate broken"])
def test_the_decode_check_discards_what_a_lenient_decoder_fills_in(case):
    """Found from outside: image_check="decode" kept the same damaged files as "header" (a
    JPEG whose scan ends before its frame, stored half grey; a PNG holding half its rows
    behind valid CRCs, stored half black), and a PNG whose deflate stream breaks half way
    was stored with garbage rows by both (its EXIF read decoded it, and that failure was
    taken for a broken EXIF block)."""
    pytest.importorskip("simplejpeg")
    if case == "jpeg frame taller than its scan":
        good = encode(photo(96, 64), "JPEG", quality=90)
        bad = jpeg_with_size(good, 96, 128)
    elif case == "png rows missing":
        bad = _png_half_rows()
    else:
        bad = _png_broken_deflate()
    Image.open(io.BytesIO(bad)).size  # noqa: B018 - it opens: only a decode can tell
    with pytest.raises(Discard, match="corrupt image"):
        load_image(bad, check="decode")
    if case == "png deflate broken":  # re-encoded (PNG to JPEG): decoded either way
        with pytest.raises(Discard, match="corrupt image"):
            load_image(bad, check="header", image_format="jpg")


@pytest.mark.parametrize("interlace", [0, 1])
def test_whole_pngs_of_every_kind_hold_all_their_rows(interlace):
    """The rows check counts the bytes each PNG kind holds (bit depths 1-16, grey, RGB,
    palette, alpha, Adam7 interlacing): no whole PNG is taken for a short one."""
    from shardfeed.formats.image_damage import png_short_data

    for mode in ("1", "L", "I;16", "RGB", "P", "LA", "RGBA"):
        for w, h in ((1, 1), (7, 3), (37, 23), (96, 64)):
            im = photo(max(w, 2), max(h, 2)).resize((w, h)).convert(mode if mode != "I;16" else "L")
            if mode == "I;16":
                im = Image.fromarray(np.asarray(im).astype(np.uint16) * 257)
            data = encode(im, "PNG", interlace=interlace)
            assert png_short_data(data) is None, (mode, w, h)
            assert load_image(data, check="decode").width == w  # kept by the decode check
    assert "rows are missing" in png_short_data(_png_half_rows())


@needs_native
def test_the_scan_limit_is_100_in_the_check_and_in_the_lenient_count():
    """The structural check refuses a JPEG's 101st scan (each costs a decoder a pass over the
    whole image: a few KB repeating one took seconds); the lenient count decode_images uses
    (bytes that are not a marker skipped, as libjpeg skips them) agrees with it on whole files
    and stops counting past its limit."""
    from shardfeed.formats.image_damage import MAX_JPEG_SCANS
    from shardfeed.formats.native import jpeg_scans

    base = encode(photo(), "JPEG", progressive=True)
    assert jpeg_scans(base, 100) == (10, 96, 64) == (10, image_check(base).width, image_check(base).height)
    at, over = repeat_scan(base, MAX_JPEG_SCANS), repeat_scan(base, MAX_JPEG_SCANS + 1)
    assert image_check(at).error is None and jpeg_scans(at, MAX_JPEG_SCANS)[0] == 100
    assert "more scans" in image_check(over).error and jpeg_scans(over, MAX_JPEG_SCANS)[0] == 101
    assert jpeg_scans(repeat_scan(base, 5000), 7)[0] == 8  # stops at its limit + 1
    junk = repeat_scan(base, 101, b"\xff\xfe\x00\x04sf\x00\x12")
    assert image_check(junk).error.startswith("JPEG garbled") and jpeg_scans(junk, 1000)[0] == 101
    for cut in (0, 1, 3, 100, len(base) - 1):  # never more than the file holds
        assert jpeg_scans(base[:cut], 100)[0] <= 10
