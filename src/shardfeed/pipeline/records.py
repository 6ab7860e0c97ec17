"""The TFRecord source: the records of the spans a provider yields, through the native
chunk path. Every way of reading TFRecords (``read_tfrecord`` on files, ``read_shard``, a
``WorkQueue``, the framework adapters) is this one source over a different provider.

Frames are found in large chunks (:func:`~shardfeed.formats.chunks.iter_frame_chunks`:
``mmap`` and the native CRC scan for local shards, bounded ranged reads elsewhere) and
each chunk is tagged with its span, so the state is a cursor: the provider's state at the
current span and the byte offset after the last record delivered. A following ``batch``
asks the source for whole batches through the declared hook :meth:`TFRecordSource._batch_node`:
batches of frames go straight to the batch parser, on ``num_parallel_reads`` threads, in
order, so the output never depends on the parallelism.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..deprecation import renamed_argument
from ..errors import CorruptRecordError, DecodeError, ParseError
from ..formats.chunks import DEFAULT_CHUNK
from ..formats.parse import parse_single_example
from ..formats.spec import FeatureSpec, normalize_spec
from ..formats.tfrecord import FRAME_OVERHEAD, ON_CORRUPT, ReadStats, expand_files, normalize_compression
from ..formats.truncated import file_size_now, first_lost, truncated_while_read
from ..storage.cache import ObjectCache, get_cache, parse_size
from ..storage.counters import IOCounters
from ..storage.urls import mask
from .dataset import Dataset, positive_int
from .frames import FrameRecorder, Replay
from .node import AUTOTUNE, Build, Node
from .policy import ErrorLog, ErrorPolicy, on_error_from
from .source_batch import SourceBatchNode
from .sources import SourceDataset, SourceNode
from .span_reader import DEFAULT_READ_AHEAD, ChunkTag, SpanChunks, close_generator, cursor_state
from .spans import SHUFFLES, ShuffledSpans, Span, SpanProvider, StaticSpans

logger = logging.getLogger(__name__)

RECORD_CHUNK = 1 << 20
"""Bytes of frames found at once when records are handed out one by one: small enough that
several spans read ahead hold little, large enough that the scan's cost vanishes."""


class ReadOptions(NamedTuple):
    """How frames are read: compression (``"auto"``: by file name), CRC checks, the corrupt
    policy (``"raise"`` or ``"skip"``), storage options, the chunk size in bytes, and the
    local cache of remote objects (``cache_dir``, ``cache_limit`` in bytes; ``None``: the
    one ``SHARDFEED_CACHE_DIR`` names, or none)."""

    compression: str | None = "auto"
    verify_crc: bool = True
    on_corrupt: str = "raise"
    storage_options: Mapping[str, Any] | None = None
    chunk_size: int = DEFAULT_CHUNK
    cache_dir: str | None = None
    cache_limit: int | str | None = None
    on_error: Any = None  # an ErrorPolicy for reading and parsing; None: on_corrupt's

    def check(self) -> "ReadOptions":
        if self.on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt must be 'raise' or 'skip', got {self.on_corrupt!r}")
        if self.on_error is not None and self.on_error.framing != self.on_corrupt:
            raise ValueError(f"on_corrupt={self.on_corrupt!r} disagrees with on_error={self.on_error!r}")
        normalize_compression(self.compression)
        parse_size(self.cache_limit)
        return self

    @property
    def policy(self) -> ErrorPolicy:
        """The error policy of reading and parsing (``on_error``, else ``on_corrupt``'s)."""
        return self.on_error if self.on_error is not None else ErrorPolicy(self.on_corrupt)

    @property
    def cache(self) -> ObjectCache | None:
        """This process's cache for these options (``None``: no cache)."""
        return get_cache(self.cache_dir, self.cache_limit)


DEFAULT_OPTIONS = ReadOptions()
"""The read options of a source given none."""


# -- records one by one ---------------------------------------------------------------------
class _RecordReader:
    """Hands out the records of the chunks one at a time (parsed with the spec unless the
    consumer takes serialized records)."""

    def __init__(self, src: "TFRecordSource", epoch: tuple, state: Mapping[str, Any] | None, raw: bool,
                 counters: IOCounters | None = None, errors: ErrorLog | None = None,
                 recorder: FrameRecorder | None = None) -> None:
        self.src = src
        self.recorder = recorder  # told where each chunk's records lie (a shuffle above restores by it)
        self.parse = src.spec is not None and not raw
        self.policy = src.options.policy
        self.errors = errors
        self.chunks = SpanChunks(src, epoch, state, RECORD_CHUNK, counters, errors)
        self.it = iter(self.chunks)
        self.initial = dict(state) if state else None
        self.tag: ChunkTag | None = None
        self.records: list[bytes] = []
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.k = 0
        self.offset = 0
        self.bytes_read = 0
        self.cut: CorruptRecordError | None = None  # the records after these lie past a truncated file's end

    def __next__(self) -> Any:
        while True:
            k = self.k
            while k >= len(self.records):
                if self.cut is not None:
                    self._truncated()
                self._next_chunk()
                k = 0
            record = self.records[k]
            self.k = k + 1
            self.bytes_read += len(record) + FRAME_OVERHEAD
            self.offset = self.ends[k]
            if not self.parse:
                return record
            try:
                return parse_single_example(record, self.src.spec)
            except (DecodeError, ParseError) as exc:
                url = self.tag.span.url
                exc.add_note(f"in record at byte offset {self.starts[k]} of {mask(url)}")
                self.policy.handle(exc, {"stage": "parse", "url": url, "offset": self.starts[k]}, self.errors)

    def _next_chunk(self) -> None:
        try:
            chunk, tag = next(self.it)
        except StopIteration:
            self.chunks.finish_all()
            raise
        self.chunks.delivered(tag.seq)  # this chunk's first record goes out now
        if self.recorder is not None:
            self.recorder.add(chunk, tag.span)
        self.tag = tag
        self.records = chunk.records()
        self.starts = chunk.positions.tolist()
        self.ends = (chunk.positions + chunk.lengths + FRAME_OVERHEAD).tolist()
        self.k = 0
        lost = first_lost(chunk)  # copied out after its file was truncated: zeros, not its bytes
        if lost is not None:
            url = tag.span.url
            size = file_size_now(url)
            self.cut = truncated_while_read(url, self.starts[lost], None, size)
            del self.records[lost:], self.starts[lost:], self.ends[lost:]

    def _truncated(self) -> None:
        """The records handed out end where the file now ends: raise, or count the rest of
        the chunk as one frame skipped (as the reference reader counts a cut frame)."""
        err, self.cut = self.cut, None
        assert err is not None
        if self.policy.raises:
            raise err
        stats = ReadStats(on_skip=self.chunks.on_skip)
        stats.skipped(err, 1, 0)
        self.src._merge_stats(stats)

    def get_state(self) -> Any:
        return cursor_state(self.tag, self.offset, self.initial, self.src.replayable)

    def close(self) -> None:
        try:
            self.chunks.close()
        finally:
            close_generator(self.it)
            self.records, self.starts, self.ends = [], [], []


class _ReplayReader:
    """The records a shuffle's restore read back (:class:`~shardfeed.pipeline.frames.Replay`),
    handed out as the source hands out its own (parsed with the spec unless raw)."""

    bytes_read = 0

    def __init__(self, src: "TFRecordSource", records: list[bytes], raw: bool) -> None:
        self.spec = src.spec if src.spec is not None and not raw else None
        self.it = iter(records)

    def __next__(self) -> Any:
        record = next(self.it)
        return record if self.spec is None else parse_single_example(record, self.spec)

    def get_state(self) -> Any:
        return None  # never resumed: a replay is read to its end at once

    def close(self) -> None:
        self.it = iter(())  # the records go (the pass keeps the closed node until it ends)


# -- the dataset ------------------------------------------------------------------------------
class TFRecordSource(SourceDataset):
    """Records of TFRecord spans (whole files or record ranges) from a provider, in the
    provider's order.

    Without ``spec`` each element is the serialized record (``bytes``); with a ``spec``
    (``{name: FixedLen|VarLen|Sparse}``) each element is that record parsed into a dict of
    numpy values, except that a following ``batch`` parses whole batches at once, on
    ``num_parallel_reads`` threads. ``read_stats`` (a :class:`~shardfeed.ReadStats`)
    accumulates what every pass read and skipped. The state is a cursor: the provider's
    state at the current span and a byte offset.
    """

    kind = "tfrecord"

    @renamed_argument("files", "source")
    def __init__(
        self,
        source: Any,
        spec: Mapping[str, FeatureSpec] | None = None,
        compression: str | None = "auto",
        verify_crc: bool = True,
        on_corrupt: str = "raise",
        storage_options: Mapping[str, Any] | None = None,
        num_parallel_reads: int | None = AUTOTUNE,
        cache_dir: str | None = None,
        cache_limit: int | str | None = None,
        on_error: Any = None,
    ) -> None:
        policy = on_error_from(on_error, on_corrupt)
        options = ReadOptions(compression, verify_crc, policy.framing, storage_options,
                              cache_dir=None if cache_dir is None else os.fspath(cache_dir),
                              cache_limit=cache_limit, on_error=policy).check()
        self.provider = _provider_of(source, storage_options)
        self.spec = normalize_spec(spec) if spec is not None else None
        self.options = options
        self.num_parallel_reads = positive_int("num_parallel_reads", num_parallel_reads, allow_autotune=True,
                                               allow_none=True)
        self.read_stats = ReadStats()
        self._stats_lock = threading.Lock()

    def __getstate__(self) -> dict:
        d = super().__getstate__()
        d.pop("_stats_lock", None)  # locks do not pickle; a copy counts on its own
        d["read_stats"] = ReadStats()
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self._stats_lock = threading.Lock()

    @classmethod
    def of(cls, provider: SpanProvider, spec: Mapping[str, FeatureSpec] | None = None,
           options: ReadOptions = DEFAULT_OPTIONS, num_parallel_reads: int | None = AUTOTUNE) -> "TFRecordSource":
        """The source over ``provider`` with ``options``."""
        o = options
        out = cls(provider, spec, o.compression, o.verify_crc, o.on_corrupt, o.storage_options, num_parallel_reads)
        out.options = o
        return out

    # the files of a static provider, as a user who gave a list expects to see them
    @property
    def files(self) -> list[str]:
        urls = getattr(self.provider, "urls", None)
        if urls is None:
            raise AttributeError(f"{self.provider!r} has no fixed list of files")
        return urls

    @property
    def threads(self) -> int:
        """Batches parsed at once: ``num_parallel_reads`` (``AUTOTUNE``: one per core)."""
        n = self.num_parallel_reads
        if n is None:
            return 1
        return max(1, os.cpu_count() or 1) if n == AUTOTUNE else n

    @property
    def replayable(self) -> bool:
        """Whether reopening a saved state reads the same records again (a queue's does not)."""
        return getattr(self.provider, "replayable", True)

    @property
    def read_ahead(self) -> int:
        """Remote or compressed spans read at once in background threads."""
        n = self.num_parallel_reads
        if n is None or n == 1:
            return 1
        return DEFAULT_READ_AHEAD if n == AUTOTUNE else n

    def _merge_stats(self, stats: ReadStats) -> None:
        with self._stats_lock:
            self.read_stats.merge(stats)

    def _deferred_spec(self) -> Mapping[str, FeatureSpec] | None:
        return self.spec

    def _deferred_policy(self) -> ErrorPolicy:
        return self.options.policy

    def cardinality(self) -> int | None:
        """Records of one pass, from the spans' record ranges, index files or known
        counts; ``None`` when some file has none, for a provider that cannot tell (a
        queue), and with ``on_corrupt="skip"`` (skipped records are not known ahead)."""
        count = getattr(self.provider, "record_count", None)
        if count is None or not self.options.policy.raises:
            return None
        o = self.options
        return count(o.storage_options, o.compression, o.cache)

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        if isinstance(b.frames, Replay):  # a shuffle restoring its buffer: these records, then the end
            return SourceNode(b, self, _ReplayReader(self, b.frames.records, b.raw))
        recorder = b.frames if isinstance(b.frames, FrameRecorder) else None
        return SourceNode(b, self, _RecordReader(self, b.epoch, state, b.raw, b.ctx.stats.storage,
                                                 b.ctx.stats.errors, recorder))

    def _record_source(self) -> "TFRecordSource | None":
        """This source, when it can say where each record lies and read it back by offset:
        from a provider that can re-read (not a queue), every record handed out (no failure
        skipped), not all compressed (a state naming a compressed file's records leaves the
        offsets out: such a stream has none to read back from)."""
        if not self.replayable or not self.options.policy.raises or self.options.compression not in (None, "auto"):
            return None
        return self

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> _RecordReader:
        return _RecordReader(self, (), state, raw)

    def _batch_node(self, b: Build, state: Mapping[str, Any] | None, batch: Dataset) -> Node | None:
        """The declared hook a following ``batch`` calls: whole batches parsed at once (or
        ``None`` when there is no spec to parse with)."""
        if self.spec is None:
            return None
        return SourceBatchNode(b, batch, self, state)

    def _shuffle_batch_node(self, b: Build, state: Mapping[str, Any] | None, shuffle: Dataset,
                            batch: Dataset) -> Node | None:
        """``source.shuffle(n).batch(k)``: the shuffle computed on record positions and
        whole batches gathered and parsed at once (:mod:`shardfeed.pipeline.shuffle_batch`);
        not for a provider that cannot re-read (a queue) or a state it cannot resume."""
        if self.spec is None or not self.replayable:
            return None
        if state is not None and state.get("read") is None:
            return None
        from .shuffle_batch import ShuffledBatches, shuffle_stage  # noqa: PLC0415 - it imports this module

        return SourceBatchNode(b, batch, self, state, ShuffledBatches(self, shuffle, batch, b.epoch, state,
                                                                            b.ctx.stats.storage, b.ctx.stats.errors,
                                                                            shuffle_stage(b, shuffle)))

    def with_provider(self, provider: SpanProvider, num_parallel_reads: int | None | str = "same") -> "TFRecordSource":
        """The same source (spec, options) over another provider; ``read_stats`` shared."""
        out = TFRecordSource.of(provider, None, self.options,
                                self.num_parallel_reads if num_parallel_reads == "same" else num_parallel_reads)
        out.spec = self.spec
        out.read_stats = self.read_stats
        out._stats_lock = self._stats_lock
        return out

    def _split(self, index: int, count: int, threads: int | None = None) -> "TFRecordSource | None":
        """Reader ``index`` of ``count``'s share, split on spans below the source (each
        reader fetches only its own bytes); ``None`` when the provider cannot split.
        ``threads`` caps the parse threads of the share (several readers share the cores)."""
        split = getattr(self.provider, "split", None)
        if split is None:
            return None
        n = self.num_parallel_reads
        if threads is not None and n == AUTOTUNE:
            n = threads if threads > 1 else None
        o = self.options
        return self.with_provider(split(index, count, o.storage_options, o.compression, o.cache,
                                        on_corrupt=o.policy.framing), n)

    def __repr__(self) -> str:
        return f"TFRecordSource({self.provider!r}, spec={'yes' if self.spec else 'no'})"


def _check_shuffle(shuffle: str | None, seed: int | None, block_size: int | None) -> None:
    if shuffle not in SHUFFLES:
        raise ValueError(f"shuffle must be one of {SHUFFLES}, got {shuffle!r}")
    if shuffle is not None and (seed is None or isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"shuffle={shuffle!r} needs a seed (an int >= 0), so that every run and every reader "
                         f"computes the same order: pass seed=..., got {seed!r}")
    positive_int("block_size", block_size, allow_none=True)


def _provider_of(files: Any, storage_options: Mapping[str, Any] | None) -> SpanProvider:
    """A span provider from what a user passes as ``files``: a provider; an object that
    offers one (``span_provider(storage_options)``, as a ``WorkQueue`` does); or a URL,
    glob or list of them (whole files, in order)."""
    if not isinstance(files, (str, bytes, os.PathLike, list, tuple)):
        offer = getattr(files, "span_provider", None)
        if callable(offer):
            return offer(storage_options)
        if isinstance(files, SpanProvider):
            return files
    return StaticSpans([Span(u) for u in expand_files(files, storage_options)])


TFRecordDataset = TFRecordSource
"""The source's earlier name: ``sf.TFRecordDataset(files, spec, ...)`` still works."""


@renamed_argument("files", "source")
def read_tfrecord(
    source: Any,
    spec: Mapping[str, FeatureSpec] | None = None,
    compression: str | None = "auto",
    verify_crc: bool = True,
    on_corrupt: str = "raise",
    storage_options: Mapping[str, Any] | None = None,
    num_parallel_reads: int | None = AUTOTUNE,
    *,
    shuffle: str | None = None,
    seed: int | None = None,
    block_size: int | None = None,
    slice_id: int | None = None,
    slice_count: int | None = None,
    cache_dir: str | None = None,
    cache_limit: int | str | None = None,
    on_error: Any = None,
) -> TFRecordSource:
    """Read TFRecord files: ``source`` is a URL, a glob or a list of them (any storage).

    Yields serialized records, or parsed examples when ``spec`` is given (a following
    ``batch(n)`` parses n records in one call into numpy columns). ``compression`` is
    ``"auto"`` (by file extension), ``None``, ``"GZIP"`` or ``"ZLIB"``; ``on_corrupt`` is
    ``"raise"`` (a :class:`~shardfeed.errors.CorruptRecordError` naming file and byte
    offset) or ``"skip"`` (counted in ``.read_stats``). ``on_error`` (the one policy, see
    :mod:`shardfeed.pipeline.policy`) covers framing and parsing: ``"raise"``, ``"skip"``
    (a bad frame or a record that does not fit the spec is dropped and counted in
    ``iterator.stats()``; a batch that lost records is shorter) or a callable
    ``handler(exc, context)`` that returns to skip or raises to stop; it replaces
    ``on_corrupt``. ``num_parallel_reads``: threads
    that parse batches at once, and remote or compressed files read ahead at once
    (``AUTOTUNE``, the default: one parse thread per core, 16 compressed files or 48 remote
    objects ahead; ``None``: all
    in the consumer's thread). The order of records never depends on it: files in the
    order given, records in file order. Raises ``FileNotFoundError`` at once when a path
    or glob matches nothing.

    ``source`` may also be a span provider (:mod:`shardfeed.pipeline.spans`) or an object
    that offers one through ``span_provider(storage_options)``, such as a
    :class:`~shardfeed.WorkQueue`: the dataset then reads the items (files or record
    ranges) this worker takes off the queue, acknowledging each after its last record was
    delivered.

    ``shuffle``: ``None`` (the order given), ``"files"`` (a seeded order of the files,
    different every epoch), ``"blocks"`` (a seeded order of record ranges cut through
    index files, built when missing: sequential reads within a block, good for object
    storage) or ``"global"`` (a seeded permutation of all records); ``seed`` is required
    for any. ``block_size``: ``None`` (the default) cuts blocks of about 4 MiB of each
    file (by its record offsets, so the order depends only on the files, never on the
    link); an int cuts blocks of that many records. The block cut is part of the order:
    resume with the ``block_size`` a state was saved with (another is a ``ValueError``).
    For ``"global"`` it is the positions gathered at once (2,048 for ``None``), which
    does not change the order. With
    ``slice_id``/``slice_count`` this reader takes its share below the source: every
    ``slice_count``-th unit of the epoch's order, or, unshuffled, its files or record
    ranges (see :meth:`Dataset.shard`).

    Remote objects (``s3://``, ``oss://``, ``gs://``, ``http(s)://``) are fetched as
    parallel ranged GETs, as many in flight as the measured latency and per-connection
    rate call for (``storage_options={"max_concurrency": n}`` caps them). ``cache_dir``
    keeps whole objects on local disk as they are read, shared by every process on the
    host, at most ``cache_limit`` bytes (an int or ``"200G"``); ``None`` takes
    ``SHARDFEED_CACHE_DIR`` / ``SHARDFEED_CACHE_LIMIT`` when set. A pass's bytes fetched,
    requests, retries and cache hits are in ``iterator.stats().storage``.
    """
    _check_shuffle(shuffle, seed, block_size)
    if (slice_id is None) != (slice_count is None):
        raise ValueError("give both slice_id and slice_count, or neither")
    if shuffle is not None:
        provider = _provider_of(source, storage_options)
        if not isinstance(provider, StaticSpans):
            raise ValueError(f"shuffle={shuffle!r} applies to files; {provider!r} hands out its own order "
                             "(a WorkQueue shuffles with WorkQueue(..., shuffle=True, seed=...))")
        source = ShuffledSpans(provider.spans, seed, shuffle, block_size, storage_options,  # type: ignore[arg-type]
                              compression, cache=get_cache(cache_dir, cache_limit))
    src = TFRecordSource(source, spec, compression, verify_crc, on_corrupt, storage_options, num_parallel_reads,
                         cache_dir, cache_limit, on_error)
    if slice_id is not None:
        split = src._split(slice_id, slice_count)  # type: ignore[arg-type]
        if split is None:
            raise ValueError(f"{src.provider!r} cannot be split among readers")
        src = split
    return src
