"""VIDEO_CLASSIFICATION: videos made here with PyAV (H.264 with B-frames, MPEG-4 part 2)
are decoded per ``decode_type``, sampled at ``sample_fps``, resized to ``reshape_size``
and cut into clips of ``decode_batch_size`` frames overlapping by ``decode_keep_size``;
one record per clip carries the label(s). Unreadable and truncated videos are discarded
with a reason."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest

av = pytest.importorskip("av")
pytest.importorskip("PIL")
from PIL import Image

from shardfeed.cli.convert_cmd import main as convert_main

# `shardfeed.convert` is also the name of the function sf.convert: import the package's api module.
from shardfeed.convert import api as sc
from shardfeed.convert.options import ConvertOptions

from .test_convert_annotations import all_records as records
from .test_convert_annotations import reasons

FPS, SECONDS, W, H = 25, 3, 64, 48


def make_video(path, codec="libx264", fmt=None, gop=25, bframes=2):
    """A 3 s, 25 fps, 64x48 video: a moving bar on a colour ramp. H.264: a key frame every
    25 frames, 2 B-frames between references; MPEG-4: an I frame every 12."""
    if codec not in av.codecs_available:
        pytest.skip(f"this PyAV build has no {codec} encoder")
    c = av.open(str(path), "w", format=fmt)
    s = c.add_stream(codec, rate=FPS)
    s.width, s.height, s.pix_fmt = W, H, "yuv420p"
    s.codec_context.gop_size = gop
    s.codec_context.max_b_frames = bframes
    if codec == "libx264":
        s.codec_context.options = {"x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0"}
    else:
        s.codec_context.options = {"sc_threshold": "1000000000"}  # no extra I frames on scene changes
    for i in range(FPS * SECONDS):
        a = np.zeros((H, W, 3), np.uint8)
        a[..., 0] = (i * 7) % 256
        a[i % H, :, 1] = 255
        for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
    c.close()
    return str(path)


def frame_kinds(path):
    """(seconds, picture type letter, key frame) of every frame, from a plain full decode."""
    with av.open(path) as c:
        s = c.streams.video[0]
        return [(float(f.pts * s.time_base), "?IPB"[int(f.pict_type)] if int(f.pict_type) < 4 else "?",
                 bool(f.key_frame)) for f in c.decode(s)]


def itag(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        for source, labels in lines:
            result = {"questionId": "2", "data": labels,
                      "type": "survey/multivalue" if isinstance(labels, list) else "survey/value"}
            f.write(json.dumps({"data": {"source": source}, "label-1433000711494508544": {"results": [result]}},
                               ensure_ascii=False) + "\n")
    return str(path)


def convert(tmp_path, videos, name="out", **kw):
    src = itag(tmp_path / f"{name}.manifest", [(v, "cat") for v in videos])
    out = str(tmp_path / name)
    return sc.convert_annotations(src, out, model_type="VIDEO_CLASSIFICATION", progress=False, **kw), out


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    d = tmp_path_factory.mktemp("videos")
    return {"h264": make_video(d / "h264.mp4"), "mpeg4": make_video(d / "mpeg4.mp4", "mpeg4", gop=12)}


@pytest.mark.parametrize("kind", ["h264", "mpeg4"])
def test_decode_type_keeps_intra_key_non_bidirectional_or_all_frames(tmp_path, videos, kind):
    path = videos[kind]
    frames = frame_kinds(path)
    assert len(frames) == FPS * SECONDS and any(k == "B" for _, k, _ in frames)  # the video has B-frames
    want = {1: [t for t, k, _ in frames if k == "I"], 2: [t for t, _, key in frames if key],
            3: [t for t, k, _ in frames if k != "B"], 4: [t for t, _, _ in frames]}
    if kind == "h264":
        assert want[2] == [0.0, 1.0, 2.0]  # keyint=25
    else:
        assert want[1] == [i / FPS for i in range(0, FPS * SECONDS, 12)]
    for decode_type in (1, 2, 3, 4):
        # sample_fps above the video's rate and one clip for the whole video: every kept frame shows
        res, out = convert(tmp_path, [path], f"t{decode_type}", decode_type=decode_type, sample_fps=100,
                           decode_batch_size=1000, reshape_size=None)
        (r,) = records(out)
        assert r["video/frame_count"][0] == len(want[decode_type]), decode_type
        np.testing.assert_allclose(r["video/frame/timestamp"], want[decode_type], atol=1e-4)
        assert len(r["video/encoded"]) == len(want[decode_type])
    assert len(want[1]) < len(want[3]) < len(want[4])


def test_sample_fps_keeps_frames_at_the_sample_times(tmp_path, videos):
    # the first frame at or after each sample time k / sample_fps (frames are 0.04 s apart)
    for sample_fps, want in ((5, np.arange(15) * 0.2), (25, np.arange(75) * 0.04),
                             (2, [0.0, 0.52, 1.0, 1.52, 2.0, 2.52])):
        res, out = convert(tmp_path, [videos["h264"]], f"fps{sample_fps}", sample_fps=sample_fps, decode_batch_size=100)
        (r,) = records(out)
        np.testing.assert_allclose(r["video/frame/timestamp"], want, atol=1e-4)
        assert r["video/fps"][0] == pytest.approx(sample_fps) and r["video/source_fps"][0] == pytest.approx(FPS)
    # above the video's rate: every frame, and the stored rate is the video's
    res, out = convert(tmp_path, [videos["h264"]], "fps60", sample_fps=60, decode_batch_size=100)
    (r,) = records(out)
    assert r["video/frame_count"][0] == FPS * SECONDS and r["video/fps"][0] == pytest.approx(FPS)
    # sparse frames (key frames only): sample_fps is an upper bound, every key frame passes
    res, out = convert(tmp_path, [videos["h264"]], "keys", decode_type=2, sample_fps=5)
    (r,) = records(out)
    np.testing.assert_allclose(r["video/frame/timestamp"], [0.0, 1.0, 2.0], atol=1e-4)


def test_clips_of_decode_batch_size_overlap_by_decode_keep_size(tmp_path, videos):
    # defaults: decode_type 4, 5 fps, 224 shorter side, 10 frames a clip, no overlap
    res, out = convert(tmp_path, [videos["mpeg4"]], "defaults")
    o = res.manifest["options"]
    assert (o["decode_type"], o["sample_fps"], o["reshape_size"], o["decode_batch_size"], o["decode_keep_size"]) \
        == (4, 5.0, 224, 10, 0)
    clips = records(out)
    assert [c["video/frame_count"][0] for c in clips] == [10, 5]  # 15 frames at 5 fps over 3 s
    assert res.records_written == 2 and res.rows_converted == 1 and res.rows_read == 1
    assert "2 records written from 1 rows" in str(res)
    im = Image.open(io.BytesIO(clips[0]["video/encoded"][0]))
    assert im.format == "JPEG" and im.size == (299, 224)  # 64x48: shorter side to 224, aspect kept
    assert (clips[0]["video/width"][0], clips[0]["video/height"][0]) == (299, 224)

    res, out = convert(tmp_path, [videos["mpeg4"]], "overlap", decode_batch_size=6, decode_keep_size=2,
                       reshape_size=32)
    clips = records(out)
    assert [c["video/clip/index"][0] for c in clips] == [0, 1, 2, 3]
    assert [c["video/frame_count"][0] for c in clips] == [6, 6, 6, 3]  # starts every 4 of 15 frames
    np.testing.assert_allclose([c["video/clip/start_time"][0] for c in clips], [0.0, 0.8, 1.6, 2.4], atol=1e-4)
    for a, b in zip(clips, clips[1:]):
        np.testing.assert_allclose(a["video/frame/timestamp"][-2:], b["video/frame/timestamp"][:2])
        assert a["video/encoded"][-2:] == b["video/encoded"][:2]
    assert Image.open(io.BytesIO(clips[0]["video/encoded"][0])).size == (43, 32)
    assert all(c["video/source_id"] == [videos["mpeg4"].encode()] for c in clips)


def test_labels_single_and_multi_with_class_list(tmp_path, videos):
    src = itag(tmp_path / "v.manifest", [(videos["h264"], ["标签2", "标签1"]), (videos["mpeg4"], "标签1")])
    out = str(tmp_path / "multi")
    res = sc.convert_annotations(src, out, model_type="video_classification", progress=False, decode_batch_size=20)
    assert res.manifest["multi_label"] and res.manifest["classes"] == ["标签1", "标签2"]
    assert [r["video/class/label"].tolist() for r in records(out)] == [[1, 0], [0]]
    # the PAI annotation CSV, single label, through a class list with a mapping and an error class
    (tmp_path / "classes.txt").write_text("猫:cat\n狗:dog\n", encoding="utf-8")
    rows = [(videos["h264"], {"option": "猫"}), (videos["mpeg4"], {"option": "狗"}), (videos["h264"], {"option": "坏"})]
    path = tmp_path / "v.csv"
    path.write_text("#数据ID,原始数据,融合答案\n" + "".join(
        f'{i},"{json.dumps({"url": u}).replace(chr(34), 2 * chr(34))}",'
        f'"{json.dumps(a, ensure_ascii=False).replace(chr(34), 2 * chr(34))}"\n'
        for i, (u, a) in enumerate(rows, 1)), encoding="utf-8")
    out = str(tmp_path / "single")
    res = sc.convert_annotations(str(path), out, model_type="VIDEO_CLASSIFICATION", class_list_file=str(
        tmp_path / "classes.txt"), error_class="坏", decode_batch_size=20, progress=False)
    assert not res.manifest["multi_label"] and res.manifest["classes"] == ["cat", "dog"]
    recs = records(out)
    assert [(r["video/class/label"][0], r["video/class/text"]) for r in recs] == [(0, [b"cat"]), (1, [b"dog"])]
    assert "error class" in reasons(out)[3]


def test_unreadable_and_truncated_videos_are_discarded_with_a_reason(tmp_path, videos):
    good = videos["h264"]
    data = open(good, "rb").read()
    cut_mp4 = tmp_path / "cut.mp4"
    cut_mp4.write_bytes(data[: len(data) // 2])
    avi = make_video(tmp_path / "whole.avi", "mpeg4", gop=12)
    cut_avi = tmp_path / "cut.avi"
    whole = open(avi, "rb").read()
    cut_avi.write_bytes(whole[: int(len(whole) * 0.6)])
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"this is not a video " * 50)
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    res, out = convert(tmp_path, [good, str(cut_mp4), str(cut_avi), str(junk), str(empty),
                                  str(tmp_path / "missing.mp4")], "bad")
    assert res.rows_read == 6 and res.rows_converted == 1 and res.rows_discarded == 5
    assert res.records_written == len(records(out)) == 2
    why = reasons(out)
    assert set(why) == {2, 3, 4, 5, 6}
    assert why[2].startswith(("truncated video", "not a readable video"))
    assert why[3].startswith("truncated video") and "75 frames its header declares" in why[3]
    assert why[4].startswith("not a readable video") and why[5] == "empty file (0 bytes)"
    assert why[6] == "video not found"


def test_video_options_are_checked():
    with pytest.raises(ValueError, match="decode_type"):
        ConvertOptions(model_type="VIDEO_CLASSIFICATION", decode_type=5)
    with pytest.raises(ValueError, match="decode_keep_size"):
        ConvertOptions(model_type="VIDEO_CLASSIFICATION", decode_batch_size=4, decode_keep_size=4)
    with pytest.raises(ValueError, match="sample_fps"):
        ConvertOptions(model_type="VIDEO_CLASSIFICATION", sample_fps=0)
    with pytest.raises(ValueError, match="reshape_size"):
        ConvertOptions(model_type="VIDEO_CLASSIFICATION", reshape_size=0)


def test_cli_converts_videos_and_read_dataset_parses_clips(tmp_path, videos, capsys):
    src = itag(tmp_path / "v.manifest", [(videos["h264"], "cat"), (videos["mpeg4"], "dog")])
    out = str(tmp_path / "cli")
    assert convert_main(["convert", src, out, "--model_type", "VIDEO_CLASSIFICATION", "--decode_type", "3",
                         "--sample-fps", "10", "--decode_batch_size", "8", "--decode_keep_size", "4",
                         "--reshape_size", "24", "-q", "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["rows_read"] == 2 and counts["rows_converted"] == 2 and counts["records_written"] > 2
    o = sc.load_manifest(out)["options"]
    assert (o["decode_type"], o["sample_fps"], o["decode_batch_size"], o["decode_keep_size"], o["reshape_size"]) \
        == (3, 10.0, 8, 4, 24)
    got = list(sc.read_dataset(out))
    assert len(got) == counts["records_written"]
    assert all(1 <= len(r["video/encoded"]) <= 8 for r in got)
    assert os.path.exists(os.path.join(out, sc.load_manifest(out)["splits"]["train"]["shards"][0]["file"] + ".idx"))


def test_video_from_a_storage_url_is_read_in_ranges(tmp_path, videos):
    from shardfeed import storage

    url = "memory://shardfeed-test-video/clips/a.mp4"
    storage.write_bytes(url, open(videos["h264"], "rb").read())
    try:
        res, out = convert(tmp_path, [url], "memory", decode_batch_size=100)
        (r,) = records(out)
        assert r["video/source_id"] == [url.encode()] and r["video/frame_count"][0] == 15
    finally:
        storage.remove(url)
