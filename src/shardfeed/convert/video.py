"""Decode a video (PyAV) into sampled, resized, encoded frames cut into clips.

PAI's video options, with their defaults:

- ``decode_type``: which frames are decoded at all. 1 intra-coded (I) frames only, 2 key
  frames (random-access points) only, 3 all but bidirectional (B) frames, 4 every frame.
  FFmpeg's ``skip_frame`` makes the decoder skip the others (the speed-up), and the frame
  type is checked again on every decoded frame, because some decoders ignore
  ``skip_frame`` (MPEG-4 part 2 still returns P frames under "non-intra").
- ``sample_fps`` (5): frames kept per second of video time. A frame is kept when its
  timestamp reaches the next sample time ``k / sample_fps``; with sparse frames (key
  frames only) every frame that passes a sample time is kept, so ``sample_fps`` is an
  upper bound on the kept rate. A rate at or above the video's keeps every frame.
- ``reshape_size`` (224): the shorter side of every output frame, aspect ratio kept
  (``None`` keeps the decoded size). See docs/conversion.md for why not a square.
- ``decode_batch_size`` (10): frames per clip; ``decode_keep_size`` (0): frames a clip
  shares with the one before it (clips start every ``batch - keep`` frames). The last clip
  holds what remains when fewer frames than a full clip are left, as long as it has frames
  no earlier clip has; a video shorter than one clip gives one short clip.

Frames come out in timestamp order (decoders that skip frames may return them out of
order: a small reorder buffer puts them back). A video that cannot be opened, holds no
video stream, fails to decode, or has fewer packets than its header declares (a truncated
file) raises :class:`~shardfeed.convert.options.Discard` with the reason.
"""

from __future__ import annotations

import heapq
import io
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, BinaryIO

from .options import Discard

DECODE_TYPES = {1: "intra frames only", 2: "key frames only", 3: "no bidirectional frames", 4: "all frames"}
_SKIP_FRAME = {1: "NONINTRA", 2: "NONKEY", 3: "BIDIR", 4: "DEFAULT"}
_PICT_I, _PICT_B = 1, 3  # AVPictureType values
_REORDER = 32  # frames a decoder may hold back (H.264 allows 16)


def _av():
    try:
        import av
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("VIDEO_CLASSIFICATION needs PyAV: pip install 'shardfeed[video]'") from exc
    return av


@dataclass
class Clip:
    """``frames`` encoded images, ``times`` their timestamps in seconds from the start."""

    index: int
    frames: list[bytes]
    times: list[float]


@dataclass
class DecodedVideo:
    """What a decode gave: stream facts and the clips."""

    width: int
    height: int
    source_fps: float
    sample_fps: float
    frames: int = 0
    clips: list[Clip] = field(default_factory=list)


def frame_size(width: int, height: int, reshape_size: int | None) -> tuple[int, int]:
    """(width, height) with the shorter side at ``reshape_size`` (aspect kept, even when
    that means upscaling); unchanged for ``None``."""
    if not reshape_size:
        return width, height
    short = min(width, height)
    s = reshape_size / short
    return max(1, round(width * s)), max(1, round(height * s))


def _keep(decode_type: int, frame: Any) -> bool:
    t = int(frame.pict_type)
    if decode_type == 1:
        return t == _PICT_I
    if decode_type == 2:
        return bool(frame.key_frame)
    if decode_type == 3:
        return t != _PICT_B
    return True


def _ordered_frames(container: Any, stream: Any, decode_type: int) -> Iterator[tuple[Fraction, Any]]:
    """(timestamp in seconds from the stream start, frame) of the frames ``decode_type``
    keeps, in timestamp order; raises Discard for a truncated stream."""
    av = _av()
    stream.codec_context.skip_frame = _SKIP_FRAME[decode_type]
    stream.thread_type = "AUTO"
    tb = stream.time_base or Fraction(1, 90000)
    start = stream.start_time or 0
    rate = stream.average_rate or stream.guessed_rate or 25
    heap: list[tuple[Fraction, int, Any]] = []
    packets = seq = 0
    try:
        for packet in container.demux(stream):
            if packet.size:
                packets += 1
            for frame in packet.decode():
                if not _keep(decode_type, frame):
                    continue
                t = (frame.pts - start) * tb if frame.pts is not None else Fraction(seq) / Fraction(rate)
                heapq.heappush(heap, (Fraction(t), seq, frame))
                seq += 1
                if len(heap) > _REORDER:
                    t, _, f = heapq.heappop(heap)
                    yield t, f
    except av.error.FFmpegError as exc:
        raise Discard(f"corrupt video: {type(exc).__name__}: {str(exc)[:140]} (after {packets} packets)") from None
    declared = stream.frames or 0
    if declared and packets < declared:
        raise Discard(f"truncated video: {packets} of the {declared} frames its header declares are present")
    while heap:
        t, _, f = heapq.heappop(heap)
        yield t, f


def _sampled(frames: Iterator[tuple[Fraction, Any]], sample_fps: float) -> Iterator[tuple[Fraction, Any]]:
    fps = Fraction(sample_fps).limit_denominator(1_000_000)
    next_t = Fraction(-1)
    for t, frame in frames:
        if t < next_t:
            continue
        yield t, frame
        next_t = (math.floor(t * fps) + 1) / fps


def _encode(frame: Any, size: tuple[int, int], image_format: str, jpeg_quality: int) -> bytes:
    im = frame.to_image(width=size[0], height=size[1], interpolation="BILINEAR")
    out = io.BytesIO()
    if image_format == "png":
        im.save(out, "PNG", compress_level=3)
    else:
        im.save(out, "JPEG", quality=jpeg_quality)
    return out.getvalue()


def split_clips(items: Iterator[tuple[float, bytes]], batch: int, keep: int) -> Iterator[Clip]:
    """Clips of ``batch`` frames starting every ``batch - keep`` frames (module docstring)."""
    buf: list[tuple[float, bytes]] = []
    index = 0
    fresh = 0  # frames in buf that no emitted clip holds
    for item in items:
        buf.append(item)
        fresh += 1
        if len(buf) == batch:
            yield Clip(index, [b for _, b in buf], [t for t, _ in buf])
            index += 1
            buf = buf[batch - keep:] if keep else []
            fresh = 0
    if fresh:
        yield Clip(index, [b for _, b in buf], [t for t, _ in buf])


def decode_video(f: BinaryIO, *, decode_type: int = 4, sample_fps: float = 5.0, reshape_size: int | None = 224,
                 decode_batch_size: int = 10, decode_keep_size: int = 0, image_format: str = "jpg",
                 jpeg_quality: int = 90) -> DecodedVideo:
    """Decode the video in the seekable binary file ``f`` into clips (module docstring).

    Raises :class:`Discard` for a file that is not a readable video, a truncated one, or
    one that gives no frame.
    """
    av = _av()
    if not f.read(1):
        raise Discard("empty file (0 bytes)")
    f.seek(0)
    try:
        container = av.open(f, mode="r")
    except av.error.EOFError as exc:
        raise Discard(f"truncated video: the file ends before its header does ({str(exc)[:100]})") from None
    except (av.error.FFmpegError, UnicodeDecodeError, ValueError, OSError) as exc:
        raise Discard(f"not a readable video: {type(exc).__name__}: {str(exc)[:140]}") from None
    with container:
        if not container.streams.video:
            raise Discard("the file has no video stream")
        stream = container.streams.video[0]
        cc = stream.codec_context
        if not cc.width or not cc.height:
            raise Discard("the video stream declares no frame size")
        size = frame_size(cc.width, cc.height, reshape_size)
        native = float(stream.average_rate or stream.guessed_rate or 0)
        out = DecodedVideo(size[0], size[1], native, min(sample_fps, native) if native else sample_fps)
        fmt = "png" if image_format == "png" else "jpg"

        def encoded() -> Iterator[tuple[float, bytes]]:
            for t, frame in _sampled(_ordered_frames(container, stream, decode_type), sample_fps):
                out.frames += 1
                yield float(t), _encode(frame, size, fmt, jpeg_quality)

        try:
            out.clips = list(split_clips(encoded(), decode_batch_size, decode_keep_size))
        except Discard:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged file can fail anywhere in the decoder
            raise Discard(f"corrupt video: {type(exc).__name__}: {str(exc)[:140]}") from None
    if not out.clips:
        raise Discard(f"no frame decoded ({DECODE_TYPES[decode_type]}, decode_type={decode_type})")
    return out
