"""Small inline data shared by the pipeline tests (no tests here)."""

from __future__ import annotations

import threading
import time

import numpy as np

import shardfeed as sf

SPEC = {"id": sf.FixedLen("int64"), "x": sf.FixedLen("float32", shape=[2]), "ids": sf.VarLen("int64")}


def example(i: int) -> bytes:
    return sf.encode_example({"id": [i], "x": np.array([i, -i], np.float32), "ids": list(range(i % 3))})


def example_files(tmp_path, sizes: list[int], tag: str = "s") -> list[str]:
    """One TFRecord file per entry of ``sizes`` (record ``i`` of file ``f``: ``example(f *
    100_000 + i)``)."""
    out = []
    for f, n in enumerate(sizes):
        p = str(tmp_path / f"{tag}-{f}.tfrecord")
        sf.write_records(p, [example(f * 100_000 + i) for i in range(n)])
        out.append(p)
    return out


def write_shards(tmp_path, n_files: int = 3, per_file: int = 7, compression: str | None = None) -> list[str]:
    """``n_files`` TFRecord files; record ``i`` of file ``f`` has id ``f * 1000 + i``."""
    return write_sized_shards(tmp_path, [per_file] * n_files, compression=compression, prefix="part")


def write_sized_shards(tmp_path, sizes: list[int], index: bool = False, compression: str | None = None,
                       prefix: str = "s") -> list[str]:
    """One TFRecord file per entry of ``sizes`` (that many records; record ``i`` of file
    ``f`` has id ``f * 1000 + i``), with index files when ``index``."""
    suffix = ".gz" if compression == "GZIP" else ""
    paths = []
    for f, n in enumerate(sizes):
        p = str(tmp_path / f"{prefix}-{f:03d}.tfrecord{suffix}")
        sf.write_records(p, [example(f * 1000 + i) for i in range(n)], compression=compression, index=index)
        paths.append(p)
    return paths


def started_since(before: set) -> list:
    """The threads alive now that were not in ``before`` (a set of threading.enumerate()):
    a test's own threads, whatever threads of earlier tests do meanwhile."""
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


def wait_threads_back_to(before: set, timeout: float = 30.0) -> list:
    """The threads started since ``before`` still alive once they all ended (an empty
    list), or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while started_since(before) and time.monotonic() < deadline:
        time.sleep(0.01)
    return started_since(before)
