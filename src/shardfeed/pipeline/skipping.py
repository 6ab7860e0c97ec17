"""Batches parsed under a skipping policy: each record that does not parse, or whose deferred
data CRC fails, or that lies past a truncated file's end, left out and reported with where it
was (:func:`parse_skipping`), for the fused source batch and the batch stage."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CorruptRecordError, DecodeError, ParseError
from ..formats.chunks import FrameChunk
from ..formats.native import IN_FRAME, TRUNCATED_WHILE_READ, Buffers
from ..formats.parse import parse_batch
from ..formats.truncated import lost_records


def parse_skipping(batch: Any, spec: Any, bytes_as: str) -> tuple[Any, list]:
    """Parse ``batch`` (a :class:`FrameChunk` or a list of records), leaving out each
    record that does not parse, or whose data CRC (left to the parser: ``batch.crcs``)
    fails: ``(columns, or None when none is left, [(index in batch, error), ...])``, a CRC
    failure as a CorruptRecordError whose ``record_index`` is the index in the batch. One
    more parse per bad record."""
    if isinstance(batch, FrameChunk):
        records: Any = FrameChunk(batch.buffer, batch.offsets, batch.lengths, batch.positions, None, batch.crcs)
        n = batch.count
    else:
        records, n = list(batch), len(batch)
    keep = np.arange(n)
    skipped: list = []
    while len(keep):
        try:
            return parse_batch(records, spec, bytes_as=bytes_as), skipped
        except CorruptRecordError as exc:
            k = exc.record_index
            if k is None or not 0 <= k < len(keep):
                raise
            if exc.detail == TRUNCATED_WHILE_READ and isinstance(records, FrameChunk):
                # past a truncated file's end: every such record of the batch at once (its file's
                # map reads zeros; one parse again, not one a record)
                lost = lost_records(records)
                if len(lost) and lost[0] == k:
                    skipped += [(int(keep[j]), CorruptRecordError(exc.check, exc.url, int(records.offsets[j]) - 12,
                                                                  int(keep[j]), exc.detail)) for j in lost.tolist()]
                    keep = np.delete(keep, lost)
                    records = without(records, lost)
                    continue
            skipped.append((int(keep[k]), CorruptRecordError(exc.check, exc.url, exc.offset, int(keep[k]), exc.detail)))
        except (DecodeError, ParseError) as exc:
            k = exc.record_index
            if k is None or not 0 <= k < len(keep):
                raise
            skipped.append((int(keep[k]), exc.with_record_index(int(keep[k]))))  # its index as read
        keep = np.delete(keep, k)
        if isinstance(records, FrameChunk):
            records = without(records, k)
        else:
            del records[k]
    return None, skipped


def without(records: FrameChunk, k: Any) -> FrameChunk:
    """``records`` less record(s) ``k``."""
    buf = records.buffer
    if isinstance(buf, Buffers):
        buf = Buffers(buf.buffers, np.delete(buf.which, k))
    return FrameChunk(buf, np.delete(records.offsets, k), np.delete(records.lengths, k),
                      np.delete(records.positions, k), None,
                      records.crcs if records.crcs is None or records.crcs is IN_FRAME else np.delete(records.crcs, k))


__all__ = ["parse_skipping", "without"]
