"""Pipeline sources."""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator, Mapping

from .. import storage
from ..formats.example import parse_single_example
from ..formats.spec import FeatureSpec, normalize_spec
from ..formats.tfrecord import ON_CORRUPT, ReadStats, TFRecordReader, normalize_compression
from .dataset import Dataset


class TFRecordDataset(Dataset):
    """Records of TFRecord files, file after file, in order.

    Without ``spec`` each element is the serialized record (``bytes``); with a ``spec``
    (``{name: FixedLen|VarLen|Sparse}``) each element is that record parsed into a dict of
    numpy values. ``stats`` accumulates what every pass read and skipped.
    """

    def __init__(
        self,
        files: str | os.PathLike | Iterable[str | os.PathLike],
        spec: Mapping[str, FeatureSpec] | None = None,
        compression: str | None = "auto",
        verify_crc: bool = True,
        on_corrupt: str = "raise",
        storage_options: Mapping[str, Any] | None = None,
    ):
        if on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt must be 'raise' or 'skip', got {on_corrupt!r}")
        normalize_compression(compression)
        self.files = storage.expand(files, storage_options)
        self.spec = normalize_spec(spec) if spec is not None else None
        self.compression = compression
        self.verify_crc = verify_crc
        self.on_corrupt = on_corrupt
        self.storage_options = storage_options
        self.stats = ReadStats()

    def __iter__(self) -> Iterator[Any]:
        for url in self.files:
            with TFRecordReader(url, self.compression, self.verify_crc, self.on_corrupt,
                                self.storage_options) as reader:
                try:
                    if self.spec is None:
                        yield from reader
                    else:
                        for record in reader:
                            yield parse_single_example(record, self.spec)
                finally:
                    self.stats.merge(reader.stats)

    def __repr__(self) -> str:
        return f"TFRecordDataset({len(self.files)} files, spec={'yes' if self.spec else 'no'})"


def read_tfrecord(
    files: str | os.PathLike | Iterable[str | os.PathLike],
    spec: Mapping[str, FeatureSpec] | None = None,
    compression: str | None = "auto",
    verify_crc: bool = True,
    on_corrupt: str = "raise",
    storage_options: Mapping[str, Any] | None = None,
) -> TFRecordDataset:
    """Read TFRecord files given as a URL, a glob or a list of them (any storage).

    Yields serialized records, or parsed examples when ``spec`` is given. ``compression``
    is ``"auto"`` (by file extension), ``None``, ``"GZIP"`` or ``"ZLIB"``; ``on_corrupt``
    is ``"raise"`` (a :class:`~shardfeed.errors.CorruptRecordError` naming file and byte
    offset) or ``"skip"`` (counted in ``.stats``). Raises ``FileNotFoundError`` at once when
    a path or glob matches nothing.
    """
    return TFRecordDataset(files, spec, compression, verify_crc, on_corrupt, storage_options)
