"""The base of every pipeline: an immutable description that makes iterators.

Chain methods (``map``, ``batch``, ``prefetch`` ...) return new datasets; nothing runs until
iteration. Stage classes live in their own modules and are imported inside the methods, so
that stage modules can import this base without a cycle.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..formats.image_damage import MAX_IMAGE_PIXELS
from .node import AUTOTUNE, Build, Node

if TYPE_CHECKING:
    from .iterator import PipelineIterator
    from .stats import PipelineStats

_counter_lock = threading.Lock()


class Dataset:
    """A re-iterable description of a stream of elements.

    A ``Dataset`` holds no iteration state: each ``iter(ds)`` starts a fresh pass (a
    :class:`~shardfeed.pipeline.iterator.PipelineIterator` that owns the pass's threads),
    so the same object can be iterated many times (one pass per epoch). Passes are numbered:
    the n-th pass of a seeded shuffle uses the seed of epoch n, the same in every run.

    Subclasses implement :meth:`_build` (see :mod:`shardfeed.pipeline.node`); a subclass
    that only implements ``__iter__`` still works, with resume by replay.
    """

    kind = "dataset"

    # -- iteration -----------------------------------------------------------------
    def __iter__(self) -> "PipelineIterator":
        from .iterator import PipelineIterator  # noqa: PLC0415

        return PipelineIterator(self)

    def iter_from_state(self, state: Mapping[str, Any]) -> "PipelineIterator":
        """An iterator that resumes where the iterator whose ``get_state()`` gave ``state`` was."""
        from .iterator import PipelineIterator  # noqa: PLC0415

        return PipelineIterator(self, state)

    def __getstate__(self) -> dict:
        # pass counters and statistics stay with the process that made them (a dataset
        # pickled to a DataLoader worker starts afresh there)
        d = dict(self.__dict__)
        d.pop("_passes", None)
        d.pop("_last_stats", None)
        return d

    def _next_pass(self) -> int:
        with _counter_lock:
            n = self.__dict__.get("_passes", 0)
            self.__dict__["_passes"] = n + 1
        return n

    def _at_pass(self, n: int) -> "Dataset":
        """This dataset, its next pass numbered ``n`` (an engine that runs each pass in a fresh
        copy of it, Ray's read tasks, tells it which epoch it reads). Returns itself."""
        with _counter_lock:
            self.__dict__["_passes"] = int(n)
        return self

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        """A node for one pass, resumed from ``state`` (``None``: from the start)."""
        if type(self).__iter__ is Dataset.__iter__:
            raise NotImplementedError(f"{type(self).__name__} must implement _build (or __iter__)")
        from .sources import IterableNode  # noqa: PLC0415

        return IterableNode(b, self, lambda: type(self).__iter__(self), state)

    def _deferred_spec(self) -> Mapping[str, Any] | None:
        """The feature spec when this dataset can hand out serialized Example records for a
        downstream ``batch`` to parse in one call; ``None`` otherwise."""
        return None

    def _deferred_policy(self) -> Any:
        """The error policy (``on_error``) for parsing the records :meth:`_deferred_spec`
        hands out: the source's, through the stages that pass its records on."""
        parent = getattr(self, "parent", None)
        return parent._deferred_policy() if parent is not None and self._deferred_spec() is not None else None

    def _batch_node(self, b: Build, state: Mapping[str, Any] | None, batch: "Dataset") -> Node | None:
        """The hook a following ``batch`` calls: a node that makes whole batches of this
        dataset itself (resuming from ``state``, the state such a node gives), or ``None``
        to let ``batch`` group elements one by one. ``batch`` carries the batch arguments."""
        return None

    def _shuffle_batch_node(self, b: Build, state: Mapping[str, Any] | None, shuffle: "Dataset",
                            batch: "Dataset") -> Node | None:
        """The hook ``shuffle(...).batch(...)`` directly on this dataset calls: a node that
        shuffles and batches whole batches itself with the same order and state as the
        unfused chain, or ``None``."""
        return None

    def _record_source(self) -> "Dataset | None":
        """The source whose records this dataset's elements are, one for one and in order
        (the source itself, or ``map`` stages over it; or some of them, through one ``filter``
        with no parallel ``map`` above it: :meth:`_filters_records`), when that source can say where each
        record lies and read records back by it (an uncompressed TFRecord source); ``None``
        otherwise. A ``shuffle`` over such a chain restores by reading back only its buffered
        records (:mod:`shardfeed.pipeline.frames`)."""
        return None

    def _filters_records(self) -> bool:
        """For a dataset whose :meth:`_record_source` is a source: whether a ``filter`` sits
        between (its elements are then some of the records, one for one, in order)."""
        return False

    def _records_before(self, state: Mapping[str, Any] | None) -> int:
        """For a dataset whose :meth:`_record_source` is a source: the records that source hands
        out, when this dataset is built from ``state``, before this dataset's first element
        (a parallel ``map`` resumes by reading again the inputs of its chunk it had delivered)."""
        return 0

    def _split(self, index: int, count: int, threads: int | None = None) -> "Dataset | None":
        """The hook ``shard`` and the adapters call: reader ``index`` of ``count``'s share of
        this dataset, split below it so each reader reads only its own part (sources over
        spans do), or ``None`` to deal elements round robin above it."""
        return None

    def _order_varies(self) -> bool:
        """Whether this stage may give its elements in another order on another pass of
        the same data: a shuffle without a seed, a parallel map with ``deterministic=False``.
        ``shard`` cannot deal such a stage's elements round robin among readers (each
        reader's pass would deal a different order: some elements twice, others never)."""
        return False

    def cardinality(self) -> int | float | None:
        """Elements one pass yields, when that is known without reading: an int,
        ``math.inf`` for an endless ``repeat()``, ``None`` when unknown (after a ``filter``
        or an ``interleave``, from a ``WorkQueue``, from a TFRecord file without an index
        file). A TFRecord source counts records through index files (or the counts of a
        conversion manifest); ``batch``, ``take``, ``skip``, ``shard`` and ``repeat``
        compute theirs from their parent's; ``map``, ``shuffle`` and ``prefetch`` keep it.
        ``to_tf`` reports it to ``tf.data`` (Keras then knows the epoch length)."""
        return None

    def stats(self) -> "PipelineStats":
        """Statistics of this dataset's most recent pass (see :class:`PipelineStats`)."""
        from .stats import PipelineStats  # noqa: PLC0415

        last = self.__dict__.get("_last_stats")
        return last if last is not None else PipelineStats()

    # -- stages --------------------------------------------------------------------
    def map(self, fn: Callable[[Any], Any], num_parallel_calls: int | None = None,
            deterministic: bool = True, use_processes: bool = False, on_error: Any = "raise") -> "Dataset":
        """Apply ``fn`` to every element; in ``num_parallel_calls`` threads (or processes,
        for a picklable ``fn``) when given (``AUTOTUNE``: one per core). With
        ``deterministic=False`` results come as they finish (and cannot be resumed exactly).
        ``on_error``: ``"raise"`` (an exception from ``fn`` stops the pass), ``"skip"``
        (that element is dropped, counted in ``stats()``) or ``handler(exc, context)``,
        which returns to skip or raises to stop (see :mod:`shardfeed.pipeline.policy`)."""
        from .map import MapDataset  # noqa: PLC0415

        return MapDataset(self, fn, num_parallel_calls, deterministic, use_processes, on_error)

    def decode_images(self, feature: str, size: Any, *, resize: str = "stretch", channels: int = 3,
                      filter: str = "bilinear", fast_dct: bool = False, fast_upsample: bool = False,
                      num_parallel_calls: int | None = AUTOTUNE, on_error: Any = "raise",
                      max_image_pixels: int | None = MAX_IMAGE_PIXELS) -> "Dataset":
        """Decode the encoded images of batches' ``feature`` column (one per row, as
        ``read_tfrecord(files, spec).batch(n)`` gives a FixedLen bytes feature) into one
        contiguous ``(n, H, W, channels)`` uint8 array; other columns pass through.

        ``size``: ``H`` or ``(H, W)`` in pixels; ``resize``: ``"stretch"`` (exactly that size)
        or ``"crop"`` (aspect kept, shorter side to size, centre crop); ``filter``: Pillow's
        resampling filter; ``channels``: 3 (RGB) or 1. JPEGs go through simplejpeg (DCT-domain
        downscaling when the source is at least twice the target), others and JPEGs it refuses
        through Pillow; ``fast_dct``/``fast_upsample``: see :class:`DecodeImages`. Batches are
        decoded in ``num_parallel_calls`` threads (``AUTOTUNE``: one per core) as a parallel
        ``map``. ``on_error``: ``"raise"`` (:class:`ImageDecodeError` naming the feature and the
        row), ``"skip"`` (that row dropped from every column, counted in ``stats()``; a batch
        that lost every row is dropped) or ``handler(exc, context)``. ``max_image_pixels``: an
        image declaring more pixels is refused before it is decoded (default Pillow's limit,
        89,478,485, as conversion; ``None``: no limit); a JPEG with more than 100 scans too.
        Needs Pillow."""
        from .images import DecodeImages, DecodeImagesDataset  # noqa: PLC0415

        decoder = DecodeImages(feature, size, resize, channels, filter, fast_dct, fast_upsample, max_image_pixels)
        return DecodeImagesDataset(self, decoder, num_parallel_calls, on_error)

    def filter(self, predicate: Callable[[Any], bool]) -> "Dataset":
        """Keep the elements for which ``predicate`` is true."""
        from .map import FilterDataset  # noqa: PLC0415

        return FilterDataset(self, predicate)

    def shuffle(self, buffer_size: int, seed: int | None = None, reshuffle_each_iteration: bool = True) -> "Dataset":
        """Shuffle through a buffer of ``buffer_size`` elements. Give ``seed`` for the same
        order in every run; each pass (epoch) derives its own seed from it unless
        ``reshuffle_each_iteration=False``."""
        from .shuffle import ShuffleDataset  # noqa: PLC0415

        return ShuffleDataset(self, buffer_size, seed, reshuffle_each_iteration)

    def batch(self, batch_size: int, drop_remainder: bool = False, bytes_as: str = "object") -> "Dataset":
        """Group ``batch_size`` elements into one: dicts/tuples of numpy arrays. Serialized
        Examples of a dataset with a spec are parsed a whole batch at once; their bytes
        features come as numpy object arrays (``bytes_as="object"``) or, faster, as one
        buffer plus offsets each (``bytes_as="buffer"``: a ``BytesBuffer``)."""
        from .batch import BatchDataset  # noqa: PLC0415

        return BatchDataset(self, batch_size, drop_remainder, bytes_as)

    def unbatch(self) -> "Dataset":
        """Split batches (dicts/tuples of arrays, or arrays) back into elements."""
        from .batch import UnbatchDataset  # noqa: PLC0415

        return UnbatchDataset(self)

    def repeat(self, count: int | None = None) -> "Dataset":
        """Repeat ``count`` times (``None`` or -1: forever). Each repetition is an epoch."""
        from .slicing import RepeatDataset  # noqa: PLC0415

        return RepeatDataset(self, count)

    def take(self, count: int) -> "Dataset":
        """The first ``count`` elements (``list(ds.take(3))`` to look at a few)."""
        from .slicing import TakeDataset  # noqa: PLC0415

        return TakeDataset(self, count)

    def skip(self, count: int) -> "Dataset":
        """All but the first ``count`` elements."""
        from .slicing import SkipDataset  # noqa: PLC0415

        return SkipDataset(self, count)

    def shard(self, index: int, count: int) -> "Dataset":
        """Reader ``index`` of ``count``'s part. On a source that reads spans (TFRecord
        files and record ranges) the split is made on the spans, so each reader fetches
        only its own bytes (whole files, or record ranges through index files); on a
        ``mix``, the mix of each input's part; elsewhere elements
        ``index, index + count, index + 2*count, ...``, except above a stage whose order
        differs from pass to pass (a ``shuffle`` without a seed, a parallel ``map`` with
        ``deterministic=False``): there the split is made just above the source, as
        ``to_torch`` makes it, and each reader shuffles or maps its own part (dealing
        orders that differ between the readers' passes would give some elements twice and
        others never). Either way every element is in exactly one part."""
        from .slicing import ShardDataset, split_near_source  # noqa: PLC0415

        ShardDataset(self, index, count)  # validates the arguments
        split = self._split(index, count)
        if split is not None:
            return split
        node: Dataset = self
        while isinstance(node, UnaryDataset):
            if node._order_varies():
                return split_near_source(self, index, count)
            node = node.parent
        return ShardDataset(self, index, count)

    def prefetch(self, buffer_size: int = AUTOTUNE) -> "Dataset":
        """Produce up to ``buffer_size`` elements ahead in a background thread
        (``AUTOTUNE``: sized from the element size within the pass's memory budget)."""
        from .prefetch import PrefetchDataset  # noqa: PLC0415

        return PrefetchDataset(self, buffer_size)

    def in_subprocess(self, buffer_size: int = 4, zero_copy: bool = True, timeout: float | None = None) -> "Dataset":
        """Run everything above this stage in one child process (started with ``spawn``,
        so safe with CUDA and threads here) and hand its elements over through
        ``buffer_size`` shared-memory slots: numpy arrays (and object arrays of ``bytes``)
        are written once into a slot by the child, and the consumer gets its numeric arrays
        as views of the slot, which goes back to the child when the last of them is gone
        (one copy in all); only the small structure around them is pickled. When the
        consumer holds all slots but one (it keeps its batches), or with
        ``zero_copy=False``, an element is copied out of its slot instead. Python stages
        above it (a ``map`` with a user function) then no longer hold this process's GIL.

        It is named for where the chain runs, as ``map(use_processes=True)`` is; it prefetches
        like ``prefetch(buffer_size)``. ``get_state()``/resume and ``stats()`` see through it.
        The chain above must pickle (user functions at module top level); ``TypeError``
        names the stage, the function and the part of it that does not. The child's exception
        is re-raised here with its traceback; a child that dies raises
        :class:`~shardfeed.pipeline.process.SubprocessError` naming the signal. ``timeout``:
        seconds to wait for one element (30 s more for the first, while the child starts)
        before ``TimeoutError`` names the child's pid and where its threads are, and the child
        is stopped; ``None`` (the default) waits as long as the child takes. See
        docs/pipeline.md, "Input beside the trainer"."""
        from .process import SubprocessDataset  # noqa: PLC0415

        return SubprocessDataset(self, buffer_size, zero_copy, timeout)

    def interleave(self, fn: Callable[[Any], "Dataset"], cycle_length: int = AUTOTUNE, block_length: int = 1,
                   num_parallel_calls: int | None = None, deterministic: bool = True) -> "Dataset":
        """Map each element to a dataset with ``fn`` and mix ``cycle_length`` of them,
        ``block_length`` elements from each in turn; read them ahead in
        ``num_parallel_calls`` threads when given."""
        from .interleave import InterleaveDataset  # noqa: PLC0415

        return InterleaveDataset(self, fn, cycle_length, block_length, num_parallel_calls, deterministic)

    # -- outputs ---------------------------------------------------------------------
    def as_numpy(self) -> Iterator[Any]:
        """Iterate with every value as numpy (lists and scalars become arrays)."""
        from ..adapters.jax import as_numpy  # noqa: PLC0415

        return as_numpy(self)

    def to_torch(self, **kwargs: Any) -> Any:
        """A ``torch.utils.data.IterableDataset`` (see :func:`shardfeed.adapters.torch.to_torch`)."""
        from ..adapters.torch import to_torch  # noqa: PLC0415

        return to_torch(self, **kwargs)

    def to_tf(self, **kwargs: Any) -> Any:
        """A ``tf.data.Dataset`` (see :func:`shardfeed.adapters.tf.to_tf`)."""
        from ..adapters.tf import to_tf  # noqa: PLC0415

        return to_tf(self, **kwargs)

    def to_jax(self, **kwargs: Any) -> Iterator[Any]:
        """Iterate with arrays placed by ``jax.device_put`` (see :func:`shardfeed.adapters.jax.to_jax`)."""
        from ..adapters.jax import to_jax  # noqa: PLC0415

        return to_jax(self, **kwargs)

    # -- constructors --------------------------------------------------------------
    @staticmethod
    def from_list(items: Any) -> "Dataset":
        """The items of a list (or anything with ``len`` and ``[i]``), in order."""
        from .sources import from_list  # noqa: PLC0415

        return from_list(items)

    @staticmethod
    def from_iterable(iterable: Any) -> "Dataset":
        """The elements of a re-iterable object, or of what a zero-argument callable returns."""
        from .sources import from_iterable  # noqa: PLC0415

        return from_iterable(iterable)


class UnaryDataset(Dataset):
    """A stage with one upstream dataset, ``parent``."""

    def __init__(self, parent: Dataset) -> None:
        if not isinstance(parent, Dataset):
            raise TypeError(f"expected a shardfeed Dataset upstream, got {type(parent).__name__}")
        self.parent = parent

    def __repr__(self) -> str:
        return f"{self.parent!r}.{self.kind}()"


def batches_of(n: int | float | None, batch_size: int, drop_remainder: bool) -> int | float | None:
    """How many batches of ``batch_size`` ``n`` elements make (``None``, ``math.inf`` kept)."""
    if n is None or n == math.inf:
        return n
    return n // batch_size if drop_remainder else -(-n // batch_size)


def dataset_list(datasets: Any, what: str, usage: str = "") -> list["Dataset"]:
    """``datasets`` as a list, checked to be a non-empty list or tuple of datasets (the
    inputs of ``mix``, ``round_robin``...); ``what`` names the operation in the errors,
    ``usage`` is appended to the first one (how to call it)."""
    if isinstance(datasets, Dataset) or not isinstance(datasets, (list, tuple)):
        raise TypeError(f"{what} needs a list of datasets, got {type(datasets).__name__}{usage}")
    if not datasets:
        raise ValueError(f"{what} needs at least one dataset")
    for i, ds in enumerate(datasets):
        if not isinstance(ds, Dataset):
            raise TypeError(f"{what} datasets[{i}] must be a shardfeed Dataset, got {type(ds).__name__}")
    return list(datasets)


def positive_int(name: str, value: Any, allow_autotune: bool = False, allow_none: bool = False) -> Any:
    """Validate a count argument at the boundary, with a message saying how to fix it."""
    if value is None and allow_none:
        return None
    if allow_autotune and value == AUTOTUNE:
        return AUTOTUNE
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        extra = " or sf.AUTOTUNE" if allow_autotune else ""
        raise ValueError(f"{name} must be a positive int{extra}, got {value!r}")
    return value


