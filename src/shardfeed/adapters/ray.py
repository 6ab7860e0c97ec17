"""Ray Data: TFRecords read by the record source in Ray tasks, parsed natively into Arrow;
the image stage as a ``map_batches`` step; batches to Ray Train's workers or back to a
plain shardfeed pipeline. Ray is imported when first needed (``pip install 'shardfeed[ray]'``).

- :func:`read_tfrecord` returns a ``ray.data.Dataset`` over ``TFRecordDatasource``:
  one read task per reader share (:meth:`~shardfeed.pipeline.records.TFRecordSource._split`,
  the same split ``slice_id/slice_count`` makes: each task fetches only its own bytes), with
  the options of :func:`shardfeed.read_tfrecord` (spec, ``shuffle=`` modes, ``cache_dir``,
  storage options, error policy). Each task parses batches with the native parser and hands
  them to Ray as Arrow tables: numeric columns without a copy, bytes as Arrow binary from
  the parser's buffer and offsets, VarLen features as Arrow lists.
- :class:`DecodeImages` is the image stage for ``ds.map_batches(DecodeImages, ...)``: a
  callable class, so each Ray worker builds its decoder once.
- :func:`to_shardfeed` is the way back: a Ray dataset's batches as a shardfeed ``Dataset``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..formats.compression import normalize_compression
from ..formats.image_damage import MAX_IMAGE_PIXELS
from ..formats.native import BytesBuffer
from ..formats.spec import FeatureSpec, RaggedColumn, SparseColumn
from ..pipeline.dataset import Dataset, positive_int
from ..pipeline.images import DecodeImages as _DecodeImages
from ..pipeline.records import TFRecordSource
from ..pipeline.records import read_tfrecord as _read_tfrecord
from ..pipeline.sources import from_iterable
from ..registry import require
from ..storage import read_bytes
from ..storage import size as storage_size
from ..storage.urls import parse_url

logger = logging.getLogger(__name__)

DEFAULT_BLOCK_BYTES = 16 << 20
"""Parsed bytes of one Ray block (a read task's output comes in blocks of about this size:
a few a CPU for a dataset of a few hundred MB; measured against 32-160 MiB in docs/ray.md)."""

LARGE_RECORD_BYTES = 8 << 10
"""A dataset whose first record is at least this long (images, audio) gets blocks of
:data:`LARGE_BLOCK_BYTES` by default: the steps after its read (a decoder's outputs are
larger still) then work on fewer, larger blocks."""

LARGE_BLOCK_BYTES = 64 << 20
"""The default ``block_bytes`` for datasets of large records (measured in docs/ray.md)."""

PASS_THROUGH = 1.25
"""A read task's blocks against the ``target_max_block_size`` of the dataset's
``DataContext``. Ray gathers the blocks a task yields until they pass that target (one
table of several chunks a column: the consumer copies each such block whole to cut its
first batch) and cuts a block of more than 1.5 times it into slices; a block between the
two goes through as the task built it. :func:`read_tfrecord` sets the dataset's target to
``block_bytes / PASS_THROUGH`` (Ray's default, 128 MiB, would hold the first batch of a
pass until a task had parsed 128 MiB)."""

GATHER_FROM = 1.05 / PASS_THROUGH
"""Parse batches gathered into one block are handed on once they pass this share of a
block's bytes (just above Ray's target): a batch of up to about half the target still
ends the block below 1.5 times it."""

PROBE_ROWS = 256
"""Records of a read task's first parse batch, which measures the parsed size of a record
(and begins the task's first block)."""

MAX_BLOCK_ROWS = 1 << 20
"""Records a parse batch holds at most (``batch_size=None``: a block's rows are parsed at once)."""

REMOTE_BATCH_ROWS = 1024
"""Records a parse batch of remote objects holds (``batch_size=None``)."""

SIZE_SAMPLE_FILES = 64
"""Files whose size is asked for to estimate a dataset's bytes (the rest extrapolated)."""


def _ray() -> Any:
    return require("ray", extra="ray", what="shardfeed.adapters.ray")


def _pa() -> Any:
    return require("pyarrow", extra="ray", what="Arrow blocks for Ray Data")


# -- one parsed batch as an Arrow table --------------------------------------------------------
def _binary(col: BytesBuffer) -> Any:
    pa = _pa()
    offsets = np.ascontiguousarray(col.offsets, np.int64)
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(offsets) - 1,
                                            [None, pa.py_buffer(offsets), pa.py_buffer(col.data)])


def _values(values: Any) -> Any:
    pa = _pa()
    if isinstance(values, BytesBuffer):
        return _binary(values)
    if isinstance(values, np.ndarray) and values.dtype == object:
        return pa.array(values, pa.large_binary())
    if isinstance(values, np.ndarray) and values.ndim > 1:  # each value a fixed-shape array
        flat = _values(values.reshape(-1))
        for dim in reversed(values.shape[1:]):
            flat = pa.FixedSizeListArray.from_arrays(flat, dim)
        return flat
    return pa.array(values)


def _column(name: str, col: Any, rows: int) -> Any:
    pa = _pa()
    if isinstance(col, RaggedColumn):
        splits = np.ascontiguousarray(col.row_splits, np.int64)
        return pa.LargeListArray.from_arrays(pa.array(splits), _values(col.values))
    if isinstance(col, SparseColumn):
        raise TypeError(f"feature {name!r}: a Sparse feature has no Arrow column here; read it as VarLen "
                        "(the values of each row as a list) or as a FixedLen with a default")
    if isinstance(col, BytesBuffer):
        return _binary(col)
    if isinstance(col, np.ndarray) and col.ndim > 1:
        # a fixed-shape column: Ray's tensor type, so iter_batches gives back (n, *shape) arrays
        from ray.data.extensions import ArrowTensorArray  # noqa: PLC0415

        return ArrowTensorArray.from_numpy(np.ascontiguousarray(col))
    return _values(np.asarray(col))


def batch_to_arrow(batch: Mapping[str, Any]) -> Any:
    """A shardfeed batch (numpy columns, ``BytesBuffer``, ``RaggedColumn``) as a
    ``pyarrow.Table``: numeric columns and bytes buffers without a copy of their values;
    ``RaggedColumn`` as an Arrow list; fixed-shape columns as Ray's tensor type. Raises
    ``TypeError`` for a Sparse column (no Arrow form: read it as VarLen)."""
    rows = _rows(batch)
    return _pa().table({k: _column(k, v, rows) for k, v in batch.items()})


def _rows(batch: Mapping[str, Any]) -> int:
    for v in batch.values():
        if isinstance(v, RaggedColumn):
            return len(v.row_splits) - 1
        if isinstance(v, (np.ndarray, BytesBuffer)):
            return len(v)
    return 0


# -- the datasource ---------------------------------------------------------------------------
def _all_local(share: TFRecordSource) -> bool:
    urls = getattr(share.provider, "urls", None)
    return bool(urls) and all(parse_url(u).is_local for u in urls)


def _one_chunk(tables: list[Any]) -> Any:
    """``tables`` as one table of one chunk a column. Ray serializes every chunk of every
    column on its own, and a consumer's batch that straddles two chunks is copied again by
    ``combine_chunks`` on the driver; one copy here, in the read task, at memory speed."""
    if len(tables) == 1 and all(c.num_chunks <= 1 for c in tables[0].columns):
        return tables[0]
    return _pa().concat_tables(tables).combine_chunks()


class _ReadShare:
    """What one read task runs: reader ``index`` of ``count``'s share of the source, as Ray
    blocks of about ``block_bytes`` parsed bytes, each one Arrow chunk a column."""

    def __init__(self, source: TFRecordSource, index: int, count: int, batch_size: int | None,
                 block_bytes: int, epoch: int = 0) -> None:
        self.source, self.index, self.count = source, index, count
        self.batch_size, self.block_bytes, self.epoch = batch_size, block_bytes, epoch

    def _batched(self, share: TFRecordSource, size: int) -> Dataset:
        """``share`` in parse batches of ``size``, whose next pass is the execution's epoch (a
        seeded shuffle's order is that epoch's, as the n-th pass in-process)."""
        return share.batch(size, bytes_as="buffer")._at_pass(self.epoch)

    def __call__(self) -> Iterator[Any]:
        share = self.source._split(self.index, self.count)
        if share is None:  # a provider that cannot split (only a static list was given here)
            raise ValueError(f"{self.source.provider!r} cannot be split among read tasks")
        if self.batch_size is None and _all_local(share):
            yield from self._local_blocks(share)
            return
        # remote objects (no probe: going on from its state would fetch its read-ahead twice) or
        # a given batch_size: parse batches gathered into blocks
        tables: list[Any] = []
        held = 0
        with iter(self._batched(share, self.batch_size or REMOTE_BATCH_ROWS)) as it:
            for batch in it:
                table = batch_to_arrow(batch)
                tables.append(table)
                held += table.nbytes
                if held > self.block_bytes * GATHER_FROM:
                    yield _one_chunk(tables)
                    tables, held = [], 0
        if tables:
            yield _one_chunk(tables)

    def _local_blocks(self, share: TFRecordSource) -> Iterator[Any]:
        """Local files: a first batch of :data:`PROBE_ROWS` tells the parsed bytes a record,
        and the pass goes on from its state in parse batches of a block's records, each one
        block built without a copy. The probe's records open the first block: whole blocks
        sliced from it when a block holds fewer records than the probe (large records), the
        rest joined to the records that complete its block (one copy of one block: alone, the
        rest would be below Ray's target, and Ray would join it to the next block as a second
        chunk)."""
        with iter(self._batched(share, PROBE_ROWS)) as it:
            first = next(it, None)
            if first is None:
                return
            probe = batch_to_arrow(first)
            state = it.get_state()
        per_row = max(1, probe.nbytes // max(1, probe.num_rows))
        size = int(min(MAX_BLOCK_ROWS, max(1, self.block_bytes // per_row)))
        whole = probe.num_rows // size
        for k in range(whole):
            yield probe.slice(k * size, size)
        rest = probe.slice(whole * size)
        if rest.num_rows:
            with iter(self._batched(share, size - rest.num_rows)) as it:
                it.set_state(state)
                batch = next(it, None)
                if batch is None:  # the share ends within the block
                    yield rest
                    return
                yield _one_chunk([rest, batch_to_arrow(batch)])
                state = it.get_state()
        with iter(self._batched(share, size)) as it:
            it.set_state(state)
            for batch in it:
                yield batch_to_arrow(batch)


def make_datasource(source: Any, spec: Mapping[str, FeatureSpec], *, batch_size: int | None = None,
                    block_bytes: int = DEFAULT_BLOCK_BYTES, num_parallel_reads: int | None = None,
                    **read_args: Any) -> Any:
    """A ``ray.data.Datasource`` reading ``source`` (a URL, glob or list, as for
    :func:`shardfeed.read_tfrecord`) with ``spec``; ``read_args`` are
    :func:`shardfeed.read_tfrecord`'s (``shuffle``, ``seed``, ``block_size``, ``cache_dir``,
    ``storage_options``, ``on_error``, ...; not ``slice_id``/``slice_count``, which the read
    tasks are). ``batch_size``: records parsed at once (``None``: on local files a block's
    records, measured on a first batch of 256; 1,024 for remote objects); ``block_bytes``:
    parsed bytes of one Ray block (one Arrow chunk a column) when the read runs with no
    ``DataContext`` (Ray's execution passes one: blocks are then :data:`PASS_THROUGH` times
    its ``target_max_block_size``, which :func:`read_tfrecord` sets from ``block_bytes``);
    ``num_parallel_reads``: parse threads in each read task (``None``: the task's own
    thread, as Ray gives a task one CPU)."""
    if spec is None:
        raise ValueError("Ray Data reads parsed columns: give a spec ({name: sf.FixedLen(...), ...})")
    for bad in ("slice_id", "slice_count"):
        if bad in read_args:
            raise ValueError(f"{bad} is not for Ray: each read task is one reader's share (override_num_blocks=n)")
    src = _read_tfrecord(source, spec, num_parallel_reads=num_parallel_reads, **read_args)
    return _datasource_class()(src, None if batch_size is None else int(batch_size), int(block_bytes))


_CLASS: Any = None


def __getattr__(name: str) -> Any:
    if name == "TFRecordDatasource":  # the ray.data.Datasource subclass, defined when Ray is imported
        return _datasource_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _datasource_class() -> Any:
    """The Datasource subclass, defined once Ray is imported (the module imports without it)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    ray = _ray()
    from ray.data.block import BlockMetadata  # noqa: PLC0415

    class TFRecordDatasource(ray.data.Datasource):  # type: ignore[misc, name-defined]
        """A ``ray.data.Datasource`` of TFRecord files: one read task per reader share."""

        def __init__(self, src: TFRecordSource, batch_size: int | None, block_bytes: int) -> None:
            self.src, self.batch_size, self.block_bytes = src, batch_size, block_bytes
            self.executions = 0  # each execution an epoch
            self._lock = threading.Lock()

        def __getstate__(self) -> dict:
            state = dict(self.__dict__)
            state.pop("_lock", None)
            return state

        def __setstate__(self, state: dict) -> None:
            self.__dict__.update(state)
            self._lock = threading.Lock()

        def get_name(self) -> str:
            return "shardfeed.TFRecord"

        def read_units(self) -> int:
            """Read tasks the data splits into without index files: a file each (unshuffled or
            ``"files"``); with ``"blocks"`` or ``"global"``, one a CPU of the cluster."""
            if getattr(self.src.provider, "mode", None) in ("blocks", "global"):
                cpus = ray.cluster_resources().get("CPU") if ray.is_initialized() else os.cpu_count()
                return max(1, int(cpus or 1))
            return self._units()

        def _units(self) -> int:
            provider = self.src.provider
            spans = getattr(provider, "spans", None)
            if getattr(provider, "mode", None) in ("blocks", "global"):
                return 1 << 16  # a shuffled order splits into any number of shares
            return max(1, len(spans)) if spans is not None else 1

        def estimate_inmemory_data_size(self) -> int | None:
            # the files' bytes (about the parsed size): with it Ray plans as many blocks as the data
            # calls for, instead of its minimum of 200 (which cut a few files' blocks into slivers)
            urls = list(getattr(self.src.provider, "urls", ()) or ())
            if not urls:
                return None
            sample = urls[:SIZE_SAMPLE_FILES]
            try:
                total = sum(storage_size(u, self.src.options.storage_options) for u in sample)
            except OSError:
                return None
            return total * len(urls) // len(sample)

        def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                           data_context: Any = None) -> list[Any]:
            count = max(1, min(int(parallelism), self._units()))
            files = tuple(getattr(self.src.provider, "urls", ()) or ())
            # blocks Ray passes through as built: above its target, below 1.5 times it
            target = getattr(data_context, "target_max_block_size", None)
            block_bytes = int(target * PASS_THROUGH) if target else self.block_bytes
            # Ray asks once when the dataset is made (no context: for its metadata) and once as
            # each execution starts (iter_batches, materialize, and also count, schema, take:
            # Ray tells them apart from a pass in no argument): the n-th execution reads epoch n
            with self._lock:
                epoch = self.executions
                if data_context is not None:
                    self.executions += 1
            tasks = []
            for i in range(count):
                meta = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None,
                                     input_files=files[i::count] if files else None)
                fn = _ReadShare(self.src, i, count, self.batch_size, block_bytes, epoch)
                tasks.append(ray.data.ReadTask(fn, meta, per_task_row_limit=per_task_row_limit))
            return tasks

    _CLASS = TFRecordDatasource
    return _CLASS


def _first_record_bytes(src: TFRecordSource) -> int | None:
    """The length of the first record of ``src``'s first file, from its frame's length field
    (8 bytes: one small read, a ranged GET for an object), or ``None`` (no file list, a
    compressed file, a read that fails)."""
    urls = getattr(src.provider, "urls", None)
    if not urls or normalize_compression(src.options.compression, urls[0]) is not None:
        return None
    try:
        head = read_bytes(urls[0], 0, 8, src.options.storage_options)
    except Exception:  # noqa: BLE001 - a guess at a default: the read itself reports what is wrong
        return None
    return int.from_bytes(head, "little") if len(head) == 8 else None


def read_tfrecord(source: Any, spec: Mapping[str, FeatureSpec], *, batch_size: int | None = None,
                  block_bytes: int | None = None, num_parallel_reads: int | None = None,
                  override_num_blocks: int | None = None, ray_remote_args: Mapping[str, Any] | None = None,
                  **read_args: Any) -> Any:
    """A ``ray.data.Dataset`` of the records of ``source`` parsed with ``spec`` (see
    :func:`make_datasource` for the arguments; ``block_bytes=None``: 16 MiB, or 64 MiB when
    the first record is 8 KiB or more). ``override_num_blocks``: read tasks (by
    default one a file, or with ``shuffle="blocks"``/``"global"`` one a CPU of the cluster;
    never more than the files unless a shuffle mode cuts finer). Every
    record is read once per epoch, by one task; with ``shuffle="global"`` the order within
    and across tasks follows the seeded permutation of that mode."""
    positive_int("block_bytes", block_bytes, allow_none=True)
    ds = make_datasource(source, spec, batch_size=batch_size, block_bytes=block_bytes or DEFAULT_BLOCK_BYTES,
                         num_parallel_reads=num_parallel_reads, **read_args)
    if block_bytes is None:
        first = _first_record_bytes(ds.src)
        block_bytes = LARGE_BLOCK_BYTES if first is not None and first >= LARGE_RECORD_BYTES else DEFAULT_BLOCK_BYTES
        ds.block_bytes = block_bytes
    # as many blocks as read tasks: more would have Ray cut every task's blocks into slivers
    # (SplitBlocks), each a round trip through the object store and a batch's fixed costs
    kwargs: dict[str, Any] = {"override_num_blocks": int(override_num_blocks) if override_num_blocks is not None
                              else ds.read_units()}
    if ray_remote_args:
        kwargs["ray_remote_args"] = dict(ray_remote_args)
    dataset = _ray().data.read_datasource(ds, **kwargs)
    _fit_block_target(dataset, block_bytes)
    return dataset


def _fit_block_target(dataset: Any, block_bytes: int) -> None:
    """Lower the ``target_max_block_size`` of ``dataset``'s own ``DataContext`` (a copy
    ``read_datasource`` took of the current one; the datasets derived from it share it) so
    that blocks of ``block_bytes`` pass through Ray as the read tasks build them. A target the
    user set lower is kept. On a Ray without a per-dataset context nothing changes: the
    blocks are then gathered up to the global target (the same records, later and copied)."""
    ctx = getattr(dataset, "context", None) or getattr(dataset, "_context", None)
    target = getattr(ctx, "target_max_block_size", None)
    want = max(1, int(block_bytes / PASS_THROUGH))
    if ctx is not None and (target is None or target > want):
        ctx.target_max_block_size = want


# -- the image stage as a map_batches step ----------------------------------------------------
class DecodeImages:
    """``ds.map_batches(DecodeImages, fn_constructor_args=(feature, size), concurrency=n)``:
    the image stage (:class:`shardfeed.DecodeImages`, same arguments) in Ray workers, each
    building its decoder once. ``on_error="skip"`` drops the rows of images that fail to
    decode (logged with their row and error) instead of failing the task."""

    def __init__(self, feature: str, size: Any, resize: str = "stretch", channels: int = 3,
                 filter: str = "bilinear", fast_dct: bool = False, fast_upsample: bool = False,
                 on_error: str = "raise", max_image_pixels: int | None = MAX_IMAGE_PIXELS) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.decoder = _DecodeImages(feature, size, resize, channels, filter, fast_dct, fast_upsample,
                                     max_image_pixels)
        self.on_error = on_error
        self.skipped = 0

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        if self.on_error == "raise":
            return self.decoder(batch)
        out, failed = self.decoder.decode_batch(batch)
        for exc in failed:
            logger.warning("decode_images skipped a row: %s", exc)
        self.skipped += len(failed)
        return out


# -- back to shardfeed ------------------------------------------------------------------------
def to_shardfeed(ray_dataset: Any, batch_size: int = 1024, **iter_args: Any) -> Dataset:
    """A shardfeed ``Dataset`` of ``ray_dataset``'s batches (dicts of numpy arrays, each
    pass a new epoch of ``iter_batches(batch_size=..., batch_format="numpy", **iter_args)``),
    for training loops that use shardfeed's stages and adapters (``.prefetch()``,
    ``.to_torch()``, ``.to_jax()``) without Ray Train. A ``streaming_split`` share is a
    ``DataIterator`` and works the same way."""
    return from_iterable(lambda: ray_dataset.iter_batches(batch_size=batch_size, batch_format="numpy",
                                                          **iter_args))
