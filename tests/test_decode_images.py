"""decode_images: the stage and the function form, against Pillow's own decode + resize."""

from __future__ import annotations

import io
import pickle
import time

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.pipeline import check_resume_everywhere

Image = pytest.importorskip("PIL.Image")

SPEC = {"image": sf.FixedLen("bytes"), "label": sf.FixedLen("int64")}


def encode(h: int, w: int, mode: str = "RGB", fmt: str = "JPEG", seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    a, b, c = rng.uniform(0, 255, 3)
    img = np.stack([(a + xx * 0.5) % 256, (b + yy * 0.7) % 256, (c + (xx + yy) * 0.3) % 256], -1)
    img = np.clip(img + rng.normal(0, 4, img.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).convert(mode).save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


IMAGES = {
    "large jpeg": encode(640, 960),  # more than twice the target: DCT-domain downscaling
    "small jpeg": encode(40, 50, seed=1),  # smaller than the target: upsampled
    "near jpeg": encode(90, 70, seed=2),  # less than twice: full decode then resize
    "gray jpeg": encode(300, 200, "L", seed=3),
    "cmyk jpeg": encode(256, 320, "CMYK", seed=4),  # simplejpeg refuses it: Pillow
    "png": encode(120, 160, fmt="PNG", seed=5),
    "rgba png": encode(64, 64, "RGBA", "PNG", seed=6),
}


def pillow_reference(data: bytes, size: tuple[int, int], mode: str = "RGB") -> np.ndarray:
    img = Image.open(io.BytesIO(data)).convert(mode)
    return np.asarray(img.resize((size[1], size[0]), Image.Resampling.BILINEAR))


def batch_of(values: list[bytes]) -> dict:
    col = np.empty(len(values), object)
    col[:] = values
    return {"image": col, "label": np.arange(len(values), dtype=np.int64),
            "tags": sf.RaggedColumn(np.arange(2 * len(values), dtype=np.int64),
                                    np.arange(0, 2 * len(values) + 1, 2, dtype=np.int64))}


def write_shard(path, values: list[bytes]) -> str:
    url = str(path / "images.tfrecord")
    with sf.TFRecordWriter(url) as w:
        for i, v in enumerate(values):
            w.write(sf.encode_example({"image": [v], "label": [i]}))
    return url


@pytest.mark.parametrize("channels", [3, 1])
def test_shape_dtype_contiguous_and_close_to_pillow(channels):
    size = (48, 64)
    out = sf.decode_images(batch_of(list(IMAGES.values())), "image", size, channels=channels)
    images = out["image"]
    assert images.shape == (len(IMAGES), *size, channels) and images.dtype == np.uint8
    assert images.flags.c_contiguous
    for k, (name, data) in enumerate(IMAGES.items()):
        ref = pillow_reference(data, size, "RGB" if channels == 3 else "L").reshape(*size, channels)
        diff = np.abs(images[k].astype(int) - ref.astype(int)).mean()
        # DCT-domain scaling filters differently from Pillow's antialiased resize: a few levels
        assert diff < 6, f"{name}: mean abs diff {diff:.2f}"
    np.testing.assert_array_equal(out["label"], np.arange(len(IMAGES)))


def test_crop_keeps_aspect_and_centres():
    data = encode(200, 400)  # 1:2, crop to 100x100: scaled to 100x200, centre 100 columns
    out = sf.decode_images(batch_of([data]), "image", 100, resize="crop")["image"][0]
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((200, 100), Image.Resampling.BILINEAR))
    assert np.abs(out.astype(int) - full[:, 50:150].astype(int)).mean() < 4


def test_fast_flags_stay_close():
    data = IMAGES["large jpeg"]
    exact = sf.decode_images(batch_of([data]), "image", 160)["image"]
    fast = sf.decode_images(batch_of([data]), "image", 160, fast_dct=True, fast_upsample=True)["image"]
    assert np.abs(exact.astype(int) - fast.astype(int)).mean() < 3


def test_corrupt_image_names_feature_and_index():
    values = [IMAGES["png"], IMAGES["large jpeg"], IMAGES["large jpeg"][:300], b"not an image"]
    with pytest.raises(sf.ImageDecodeError, match=r"feature 'image', row 2") as info:
        sf.decode_images(batch_of(values), "image", 32)
    assert info.value.feature == "image" and info.value.index == 2
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.feature, again.index) == ("image", 2)


def test_stage_raises_by_default(tmp_path):
    url = write_shard(tmp_path, [IMAGES["png"], b"\xff\xd8\xff\xe0garbage", IMAGES["small jpeg"]])
    ds = sf.read_tfrecord(url, SPEC).batch(3).decode_images("image", 32)
    with pytest.raises(sf.ImageDecodeError, match=r"feature 'image', row 1"):
        list(ds)


def test_skip_drops_exactly_that_row_from_every_column():
    good = [IMAGES["png"], IMAGES["near jpeg"], IMAGES["gray jpeg"]]
    values = [good[0], IMAGES["large jpeg"][:500], good[1], good[2]]
    ds = sf.from_list([batch_of(values), batch_of([b"junk"]), batch_of(good)]).decode_images(
        "image", 24, on_error="skip", num_parallel_calls=2)
    with iter(ds) as it:
        out = list(it)
        stats = it.stats().to_dict()["skipped"]
    assert len(out) == 2  # the batch that lost its only row is dropped
    first = out[0]
    assert first["image"].shape == (3, 24, 24, 3) and first["image"].flags.c_contiguous
    np.testing.assert_array_equal(first["label"], [0, 2, 3])
    assert first["tags"].to_list()[1].tolist() == [4, 5]  # row 2's values, now at row 1
    ref = sf.decode_images(batch_of(good), "image", 24)["image"]
    np.testing.assert_array_equal(first["image"], ref)
    assert stats["total"] == 2 and stats["by_stage"] == {"decode_images": 2}
    assert [(e["element"], e["record_index"], e["feature"]) for e in stats["examples"]] == [
        (0, 1, "image"), (1, 0, "image")]


def test_handler_sees_context_and_can_stop():
    seen = []

    def handler(exc, context):
        seen.append(dict(context))
        if context["element"] == 1:
            raise RuntimeError("stop")

    ds = sf.from_list([batch_of([b"x", IMAGES["png"]]), batch_of([b"y"])]).decode_images("image", 16,
                                                                                        on_error=handler)
    with pytest.raises(RuntimeError, match="stop"):
        list(ds)
    assert [(c["stage"], c["element"], c["record_index"]) for c in seen] == [
        ("decode_images", 0, 0), ("decode_images", 1, 0)]


def test_resume_everywhere(tmp_path):
    values = [IMAGES[k] for k in ("png", "small jpeg", "gray jpeg", "near jpeg")] * 3
    values[5] = b"broken"
    url = write_shard(tmp_path, values)
    ds = sf.read_tfrecord(url, SPEC).batch(2).decode_images("image", 20, on_error="skip", num_parallel_calls=2)
    assert check_resume_everywhere(ds) == 7


def test_bytes_buffer_column(tmp_path):
    url = write_shard(tmp_path, [IMAGES["png"], IMAGES["small jpeg"]])
    out = next(iter(sf.read_tfrecord(url, SPEC).batch(2, bytes_as="buffer").decode_images("image", (8, 12))))
    assert out["image"].shape == (2, 8, 12, 3)


def test_bad_arguments_say_how_to_fix():
    ds = sf.from_list([batch_of([IMAGES["png"]])])
    with pytest.raises(ValueError, match="size"):
        ds.decode_images("image", (0, 3))
    with pytest.raises(ValueError, match="resize"):
        ds.decode_images("image", 8, resize="pad")
    with pytest.raises(ValueError, match="channels"):
        ds.decode_images("image", 8, channels=4)
    with pytest.raises(KeyError, match="no feature 'img'"):
        list(ds.decode_images("img", 8))


# -- the native resampler: Pillow's resize, value for value ------------------------------------
FILTER_CODES = {"box": 1, "bilinear": 2, "hamming": 3, "bicubic": 4, "lanczos": 5}


def native_resample():
    resample = getattr(pytest.importorskip("shardfeed._native"), "resample", None)
    if resample is None:
        pytest.skip("the native core is an older build without resample")
    return resample


def photo_like(h: int, w: int, c: int, seed: int) -> np.ndarray:
    """Smooth ramps with noise and one hard edge (so every filter's negative lobes clip)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = (xx[..., None] * rng.uniform(0.2, 2, c) + yy[..., None] * rng.uniform(0.2, 2, c)) % 256
    img = img + rng.normal(0, 20, img.shape)
    img[:, w // 2:] = 255 - img[:, w // 2:]
    return np.clip(img, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("filter", sorted(FILTER_CODES))
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize(("src", "dst"), [((375, 500), (224, 224)), ((300, 400), (224, 224)), ((224, 224), (224, 224)),
                                          ((50, 900), (224, 224)), ((33, 47), (100, 37)), ((600, 224), (224, 224)),
                                          ((224, 600), (224, 224)), ((7, 3), (5, 400)), ((1, 1), (3, 2))])
def test_native_resample_equals_pillow_resize(filter, channels, src, dst):
    resample = native_resample()
    (h, w), (th, tw) = src, dst
    arr = photo_like(h, w, channels, seed=h * w)
    img = Image.fromarray(arr[..., 0] if channels == 1 else arr)
    ref = np.asarray(img.resize((tw, th), getattr(Image.Resampling, filter.upper()))).reshape(th, tw, channels)
    sources = [(arr, channels)]
    if channels == 3:  # RGBX, as libjpeg-turbo writes it: the padding byte must not leak in
        rgbx = np.concatenate([arr, np.full((h, w, 1), 77, np.uint8)], -1)
        sources.append((np.ascontiguousarray(rgbx), 4))
    for source, sc in sources:
        out = np.empty((th, tw, channels), np.uint8)
        resample(source, h, w, sc, out, th, tw, channels, th, tw, 0, 0, FILTER_CODES[filter])
        np.testing.assert_array_equal(out, ref, err_msg=f"{sc} source channels")
        if th > 4 and tw > 4:  # a window of the result: the same values as cropping Pillow's
            top, left, wh, ww = th // 4, tw // 3, th // 2, tw // 2
            part = np.empty((wh, ww, channels), np.uint8)
            resample(source, h, w, sc, part, wh, ww, channels, th, tw, top, left, FILTER_CODES[filter])
            np.testing.assert_array_equal(part, ref[top:top + wh, left:left + ww], err_msg=f"window, {sc} channels")


def test_native_resample_refuses_bad_arguments():
    resample = native_resample()
    src, out = np.zeros((10, 10, 3), np.uint8), np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match="resample"):
        resample(src, 10, 10, 3, out, 4, 4, 3, 4, 4, 1, 0, 2)  # the window runs past the resized image
    with pytest.raises(ValueError, match="resample"):
        resample(src, 10, 10, 3, out, 4, 4, 3, 4, 4, 0, 0, 9)  # no such filter
    with pytest.raises(ValueError, match="resample"):
        resample(src, 20, 10, 3, out, 4, 4, 3, 4, 4, 0, 0, 2)  # src smaller than it claims


def test_native_resample_refuses_offsets_and_sizes_that_overflow():
    """Found by fuzz/fuzz_resample.c: top + th (left + tw) wrapped past INT_MAX and passed the
    window check, and sh * sw * sc wrapped negative and passed the binding's buffer check; both
    read far outside the source (a segfault) before the fix."""
    resample = native_resample()
    src, out = np.zeros((2, 2, 1), np.uint8), np.zeros((1, 1, 1), np.uint8)
    big = 2**31 - 1
    for top, left in ((big, 0), (0, big), (big - 63, 0), (big, big)):
        with pytest.raises(ValueError, match="resample"):
            resample(src, 2, 2, 1, out, 1, 1, 1, 4, 4, top, left, 2)
    with pytest.raises(ValueError, match="resample"):  # 4-byte pixels: sh * sw * 4 wraps to a negative length
        resample(b"\0" * 4, big, big, 4, bytearray(3), 1, 1, 3, big, big, 1000, 0, 2)
    edge = np.empty((1, 1, 1), np.uint8)  # the last pixel of the resized image is a valid window
    resample(np.arange(4, dtype=np.uint8).reshape(2, 2, 1), 2, 2, 1, edge, 1, 1, 1, 4, 4, 3, 3, 2)
    assert edge[0, 0, 0] == 3


@pytest.mark.parametrize("resize", ["stretch", "crop"])
@pytest.mark.parametrize("channels", [3, 1])
def test_native_path_gives_the_pillow_path_values(resize, channels):
    native_resample()
    values = [encode(375, 500, seed=11), encode(1200, 1600, seed=12), encode(224, 224, seed=13),
              encode(90, 70, seed=14), encode(300, 200, "L", seed=15)]
    for size in (224, (100, 150)):
        for filter in ("bilinear", "lanczos"):
            fast = sf.DecodeImages("image", size, resize=resize, channels=channels, filter=filter)
            slow = sf.DecodeImages("image", size, resize=resize, channels=channels, filter=filter)
            slow._resample = None  # the Pillow resize the stage used before the native one
            np.testing.assert_array_equal(fast(batch_of(values))["image"], slow(batch_of(values))["image"])


@pytest.mark.parametrize("isa", ["scalar", "sse4.1", "avx2", "avx512", "avx512vnni"])
def test_every_vector_path_equals_pillow(isa):
    """The scalar, SSE4.1, AVX2, AVX-512 and AVX-512 VNNI passes (SHARDFEED_RESAMPLE_ISA lowers the
    one picked; a CPU without the asked one runs the widest it has) each give Pillow's values."""
    import os
    import subprocess
    import sys

    native_resample()
    code = """if True:
        import numpy as np
        from PIL import Image
        from shardfeed import _native
        rng = np.random.default_rng(5)
        for (h, w), (th, tw), f in [((375, 500), (224, 224), 2), ((300, 400), (224, 224), 5), ((40, 900), (64, 96), 4),
                                    ((224, 600), (224, 224), 1), ((9, 9), (3, 2), 3)]:
            arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            rgbx = np.ascontiguousarray(np.concatenate([arr, arr[..., :1]], -1))
            name = {1: "BOX", 2: "BILINEAR", 3: "HAMMING", 4: "BICUBIC", 5: "LANCZOS"}[f]
            ref = np.asarray(Image.fromarray(arr).resize((tw, th), getattr(Image.Resampling, name)))
            for src, sc in ((arr, 3), (rgbx, 4)):
                out = np.empty((th, tw, 3), np.uint8)
                _native.resample(src, h, w, sc, out, th, tw, 3, th, tw, 0, 0, f)
                assert np.array_equal(out, ref), (h, w, th, tw, f, sc)
        print(_native.resample_backend())
    """
    env = dict(os.environ, SHARDFEED_RESAMPLE_ISA=isa)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in ("scalar", "sse4.1", "avx2", "avx512", "avx512vnni")


def test_widest_vector_path_equals_pillow_on_random_shapes_and_windows():
    """The widest path this CPU has (the AVX-512 VNNI passes here) on random sizes, shrinking
    and enlarging, whole images and crop windows, RGBX and RGB sources, one after another in
    one thread (each thread keeps its last weights and tables: a call must not use another
    size's), against Pillow's resize and crop."""
    from PIL import Image

    resample = native_resample()
    rng = np.random.default_rng(22)
    names = {1: "BOX", 2: "BILINEAR", 3: "HAMMING", 4: "BICUBIC", 5: "LANCZOS"}
    for case in range(60):
        h, w = (int(v) for v in rng.integers(1, 90, 2))
        sh, sw = (int(v) for v in rng.integers(1, 110, 2))
        th, tw = int(rng.integers(1, sh + 1)), int(rng.integers(1, sw + 1))
        top, left = int(rng.integers(0, sh - th + 1)), int(rng.integers(0, sw - tw + 1))
        f = int(rng.integers(1, 6))
        arr = photo_like(h, w, 3, case)
        ref = np.asarray(Image.fromarray(arr).resize((sw, sh), getattr(Image.Resampling, names[f]))
                         .crop((left, top, left + tw, top + th)))
        rgbx = np.ascontiguousarray(np.concatenate([arr, arr[..., :1]], -1))
        for src, sc in ((rgbx, 4), (arr, 3)):
            out = np.empty((th, tw, 3), np.uint8)
            resample(src, h, w, sc, out, th, tw, 3, sh, sw, top, left, f)
            np.testing.assert_array_equal(out, ref, err_msg=str((h, w, sh, sw, th, tw, top, left, f, sc)))


def test_one_batch_shared_among_threads_gives_the_same_batch():
    from concurrent.futures import ThreadPoolExecutor

    values = [IMAGES[k] for k in ("large jpeg", "png", "gray jpeg", "near jpeg", "small jpeg")] * 4
    values[3], values[17] = b"junk", IMAGES["large jpeg"][:400]
    dec = sf.DecodeImages("image", 40)
    alone, failed_alone = dec.decode_batch(batch_of(values))
    with ThreadPoolExecutor(3) as pool:
        shared, failed = dec.decode_batch(batch_of(values), submit=pool.submit, threads=4)
    np.testing.assert_array_equal(shared["image"], alone["image"])
    np.testing.assert_array_equal(shared["label"], alone["label"])
    assert [t.tolist() for t in shared["tags"].to_list()] == [t.tolist() for t in alone["tags"].to_list()]
    assert [e.index for e in failed] == [e.index for e in failed_alone] == [3, 17]


def test_helpers_that_never_start_are_not_waited_for():
    """A pool whose threads are all busy: the batch's own thread decodes every chunk and
    returns without waiting for the queued helper, which is cancelled."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    release = threading.Event()
    values = [IMAGES["small jpeg"]] * 8
    with ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(release.wait, 30)
        queued = []

        def submit(fn):
            queued.append(pool.submit(fn))
            return queued[-1]

        out, failed = sf.DecodeImages("image", 16).decode_batch(batch_of(values), submit=submit, threads=2)
        assert queued and queued[0].cancelled() and not blocker.done()
        release.set()
    assert out["image"].shape == (8, 16, 16, 3) and not failed


def test_stage_with_threads_equals_one_thread(tmp_path):
    values = [IMAGES[k] for k in ("large jpeg", "png", "near jpeg", "small jpeg")] * 6
    values[9] = b"broken"
    url = write_shard(tmp_path, values)
    one = list(sf.read_tfrecord(url, SPEC).batch(24).decode_images("image", 32, on_error="skip",
                                                                   num_parallel_calls=1))
    ds = sf.read_tfrecord(url, SPEC).batch(24).decode_images("image", 32, on_error="skip", num_parallel_calls=3)
    with iter(ds) as it:
        three = list(it)
        skipped = it.stats().to_dict()["skipped"]
    assert len(one) == len(three) == 1
    np.testing.assert_array_equal(one[0]["image"], three[0]["image"])
    np.testing.assert_array_equal(three[0]["label"], [i for i in range(24) if i != 9])
    assert skipped["total"] == 1 and skipped["examples"][0]["record_index"] == 9


def test_decoded_batches_reuse_pooled_memory():
    """A batch's array (here 8 x 224 x 224 x 3, 1.2 MB) comes from the native core's pool of
    recycled blocks, so the next batch is decoded into memory already mapped."""
    native = pytest.importorskip("shardfeed._native")
    if not hasattr(native, "pool_array"):
        pytest.skip("the native core is an older build without pool_array")
    dec = sf.DecodeImages("image", 224)
    batch = batch_of([IMAGES["small jpeg"]] * 8)
    first = dec(batch)["image"]
    ref = first.copy()
    del first
    reused = native.pool_info()[2]
    for _ in range(3):
        again = dec(batch)["image"]
        np.testing.assert_array_equal(again, ref)
        del again
    assert native.pool_info()[2] >= reused + 3


def test_a_closed_decode_images_pass_leaves_its_batch_memory_warm_until_idle():
    """The pooled arrays of a decode_images pass stay for the next pass when it closes, and go
    back to the system once idle (shardfeed.formats.bufpool; tests/test_bufpool.py)."""
    from shardfeed.formats import bufpool  # noqa: PLC0415

    if not hasattr(pytest.importorskip("shardfeed._native"), "pool_trim"):
        pytest.skip("the native core is an older build without pool_trim")
    # batches from a list, not a TFRecord source: the decode stage's own close keeps the pool
    ds = sf.Dataset.from_list([batch_of([IMAGES["small jpeg"]] * 8)] * 2).decode_images("image", 224)
    bufpool.release_pooled_memory()
    bufpool.set_pool_idle_seconds(600)
    try:
        for _ in range(2):
            for b in ds:
                assert b["image"].shape == (8, 224, 224, 3)
            del b
        assert bufpool.pool_info().blocks >= 1  # kept: the second pass reused the first one's
        bufpool.set_pool_idle_seconds(0.05)
        end = time.monotonic() + 30
        while bufpool.pool_info().blocks and time.monotonic() < end:
            time.sleep(0.01)
        assert bufpool.pool_info()[:2] == (0, 0)
    finally:
        bufpool.set_pool_idle_seconds(None)
        bufpool.release_pooled_memory()


def test_decoder_pickles_without_its_thread_buffers():
    dec = sf.DecodeImages("image", 32, resize="crop")
    batch = batch_of([IMAGES["large jpeg"], IMAGES["png"]])
    first = dec(batch)["image"]  # the decode buffer of this thread now exists
    again = pickle.loads(pickle.dumps(dec))
    np.testing.assert_array_equal(again(batch)["image"], first)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    import struct
    import zlib

    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def damaged_images() -> dict[str, bytes]:
    """Images a lenient decoder (Pillow, TensorFlow) returns with a part filled in."""
    import struct

    good = IMAGES["near jpeg"]
    sof = good.index(b"\xff\xc0")
    tall = bytearray(good)
    tall[sof + 5:sof + 7] = struct.pack(">H", 180)  # the frame says 180 rows, the scan holds 90
    png = IMAGES["png"]
    at = png.index(b"IDAT")
    flipped = bytearray(png)
    flipped[at + 40] ^= 0x10  # a pixel byte changed under the chunk's CRC
    return {"jpeg frame taller than its scan": bytes(tall), "png with a bad crc": bytes(flipped),
            "png without its end": png[:png.index(b"IEND") - 4]}


@pytest.mark.parametrize("case", ["jpeg frame taller than its scan", "png with a bad crc", "png without its end"])
def test_an_image_a_lenient_decoder_fills_in_is_an_error_or_a_skip_never_delivered(case, tmp_path):
    """Found from outside: a JPEG whose scan ends before its frame (simplejpeg refused it,
    then Pillow decoded it with the missing half grey), a PNG whose bytes changed under
    their CRC and one without its IEND were all delivered, none counted under skip."""
    pytest.importorskip("simplejpeg")
    bad = damaged_images()[case]
    Image.open(io.BytesIO(bad)).convert("RGB") if case != "png with a bad crc" else None  # Pillow takes them
    with pytest.raises(sf.ImageDecodeError, match=r"row 1") as info:
        sf.decode_images(batch_of([IMAGES["png"], bad]), "image", 32)
    assert any(w in str(info.value) for w in ("corrupt JPEG data", "broken PNG file")), info.value
    url = write_shard(tmp_path, [IMAGES["png"], bad, IMAGES["small jpeg"]])
    ds = sf.read_tfrecord(url, SPEC).batch(3).decode_images("image", 32, on_error="skip")
    with iter(ds) as it:
        labels = [int(v) for b in it for v in b["label"]]
        skipped = it.stats().to_dict()["skipped"]["total"]
    assert labels == [0, 2] and skipped == 1


def test_extraneous_bytes_before_the_end_marker_are_decoded_whole_as_every_decoder_does():
    """'Corrupt JPEG data: N extraneous bytes before marker 0xd9' is common and harmless in
    real datasets (ImageNet, webcams): the image is whole, and decoded as Pillow decodes it."""
    sj = pytest.importorskip("simplejpeg")
    good = IMAGES["near jpeg"]
    padded = good[:-2] + b"\x00\x17" * 40 + good[-2:]
    with pytest.raises(ValueError, match="extraneous bytes"):
        sj.decode_jpeg(padded)
    out = sf.decode_images(batch_of([padded]), "image", (90, 70))["image"][0]
    np.testing.assert_array_equal(out, np.asarray(Image.open(io.BytesIO(good)).convert("RGB")))


def test_a_16_bit_grey_png_is_scaled_to_8_bits_not_clipped():
    """A 16-bit grey PNG came out nearly all white (Pillow's clipping conversion), where
    conversion and TensorFlow scale it (found from outside)."""
    ramp = (np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) * 15).astype(np.uint16)
    buf = io.BytesIO()
    Image.fromarray(ramp).save(buf, "PNG")
    assert Image.open(io.BytesIO(buf.getvalue())).mode.startswith("I")
    out = sf.decode_images(batch_of([buf.getvalue()]), "image", 64, channels=1)["image"][0, ..., 0]
    want = np.round(ramp.astype(np.float64) * 255 / 65535).astype(np.uint8)
    np.testing.assert_array_equal(out, want)
    assert (out == 255).mean() < 0.01


# -- hostile headers: more scans or pixels than a real image has ------------------------------
def _progressive(h: int = 96, w: int = 128) -> bytes:
    buf = io.BytesIO()
    Image.open(io.BytesIO(encode(h, w))).save(buf, "JPEG", progressive=True, quality=90)
    return buf.getvalue()


@pytest.mark.parametrize("between", [b"", b"\xff\xfe\x00\x04sf\x00\x12"], ids=["scans", "scans-and-junk"])
def test_a_jpeg_repeating_a_scan_past_100_is_refused_before_any_decoder(between, tmp_path):
    """Found from outside: a 50 KB progressive JPEG repeating one scan 2,000 times took 16 s
    (each scan is a pass over the whole image; simplejpeg refused the one with junk between
    scans as 'extraneous bytes', and Pillow then decoded every scan and delivered it). Encoders
    write 1 to about 20 scans: over 100 is an error (a skip under on_error='skip'), at 100 the
    image is decoded as before."""
    from tests.imagefiles import repeat_scan

    base = _progressive()
    hostile = repeat_scan(base, 101, between)
    with pytest.raises(sf.ImageDecodeError, match=r"row 1.*more than 100 scans"):
        sf.decode_images(batch_of([base, hostile]), "image", 32)
    url = write_shard(tmp_path, [base, hostile, IMAGES["small jpeg"]])
    ds = sf.read_tfrecord(url, SPEC).batch(3).decode_images("image", 32, on_error="skip")
    with iter(ds) as it:
        labels = [int(v) for b in it for v in b["label"]]
        skipped = it.stats().to_dict()["skipped"]["total"]
    assert labels == [0, 2] and skipped == 1
    if between:  # at the limit: decoded as Pillow decodes it (simplejpeg refuses the junk)
        at_limit = repeat_scan(base, 100, between)
        want = pillow_reference(at_limit, (32, 32))
        got = sf.decode_images(batch_of([at_limit]), "image", 32)["image"][0]
        assert np.abs(got.astype(int) - want.astype(int)).mean() < 6  # DCT-domain scaling: a few levels


def _gif(h: int, w: int) -> bytes:
    buf = io.BytesIO()
    Image.open(io.BytesIO(encode(h, w, fmt="PNG"))).convert("P").save(buf, "GIF")
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF"])
def test_max_image_pixels_refuses_larger_images_before_decoding(fmt):
    """decode_images had no pixel limit: 2 KB progressive JPEGs declaring 13000x13000 cost
    1 GB and 4 s each before failing (libjpeg's coefficient buffer), where conversion refuses
    anything over max_image_pixels (Pillow's 89,478,485). The same limit, the same words."""
    data = _gif(80, 100) if fmt == "GIF" else encode(80, 100, fmt=fmt)
    with pytest.raises(sf.ImageDecodeError, match=r"decompression bomb: 100x80 = 8,000 pixels exceeds "
                                                  r"max_image_pixels=7,999"):
        sf.decode_images(batch_of([data]), "image", 16, max_image_pixels=7999)
    for limit in (8000, None):
        out = sf.decode_images(batch_of([data]), "image", 16, max_image_pixels=limit)["image"]
        assert out.shape == (1, 16, 16, 3)


def test_the_default_pixel_limit_is_pillows_and_reaches_every_form(tmp_path):
    import struct

    from shardfeed.formats.image_damage import MAX_IMAGE_PIXELS

    assert MAX_IMAGE_PIXELS == Image.MAX_IMAGE_PIXELS
    good = _progressive()
    sof = good.index(b"\xff\xc2")
    huge = good[:sof + 5] + struct.pack(">HH", 13000, 13000) + good[sof + 9:]
    with pytest.raises(sf.ImageDecodeError, match=r"decompression bomb: 13000x13000 = 169,000,000 pixels"):
        sf.decode_images(batch_of([huge]), "image", 32)
    assert sf.DecodeImages("image", 32, max_image_pixels=10).max_image_pixels == 10
    url = write_shard(tmp_path, [good])
    with pytest.raises(sf.ImageDecodeError, match=r"exceeds max_image_pixels=100"):
        list(sf.read_tfrecord(url, SPEC).batch(1).decode_images("image", 32, max_image_pixels=100))
    for bad in (0, -1, 2.5, "many"):
        with pytest.raises((ValueError, TypeError), match="max_image_pixels"):
            sf.DecodeImages("image", 32, max_image_pixels=bad)
