"""``shuffle``: a seeded buffer shuffle whose state is a few numbers and one upstream cursor.

The buffer fills with ``buffer_size`` elements; each output is a random slot of it, refilled
from upstream. The random stream is numpy's PCG64 seeded from ``(seed, epoch path)``, so
the same seed gives the same order in every run. Serialized records pass through
untouched, so a following ``batch`` still parses them.

Resuming costs the same wherever the pass was: which upstream position each slot holds
depends only on the random draws, never on the data, so a restore recomputes it from the
seed and the number delivered (vectorized: milliseconds for millions of draws), then
re-reads upstream from the newest saved upstream cursor at or before the oldest element
still in the buffer, keeping only the buffered ones. That span is about
``buffer_size * ln(buffer_size)`` elements whatever the position (the oldest of n slots
has waited about n ln n draws); the node keeps an upstream cursor every
``buffer_size / 4`` elements back to the oldest buffered element (a few dozen), and the
state carries only the one it needs (no buffered data). Over a source that is its own
checkpoint (a ``WorkQueue``), a restore starts a fresh buffer where the queue is.

Over a chain whose elements are a TFRecord source's records one for one (the source, or
``map`` stages on it) a restore re-reads one buffer at most: the state also names where
each buffered record lies, and the restore reads back exactly those records and maps them
again (:mod:`shardfeed.pipeline.frames`).
"""

from __future__ import annotations

import collections
import itertools
import secrets
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..formats.tfrecord import ReadStats
from .dataset import Dataset, UnaryDataset, positive_int
from .deferred import ReadPosition
from .frames import FrameRecorder, Frames, Replay, fetch_frames
from .node import Build, Node

_DRAWS = 4096


def derive_seed(seed: int, epoch: tuple) -> int:
    """A 64-bit seed for one epoch path, stable across runs, platforms and versions."""
    return int(np.random.SeedSequence([seed, *epoch]).generate_state(1, np.uint64)[0])


def next_draws(rng: np.random.Generator, draws: np.ndarray, di: int, k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The next ``k`` draws of the stream (blocks of ``_DRAWS`` from ``rng``), and the new
    ``(block, index)``: the same values the shuffle node takes one at a time."""
    parts = []
    while k > 0:
        if di >= len(draws):
            draws, di = rng.random(_DRAWS), 0
        take = min(k, len(draws) - di)
        parts.append(draws[di: di + take])
        di += take
        k -= take
    return (np.concatenate(parts) if parts else np.empty(0)), draws, di


def slot_positions(seed: int, epoch: tuple, size: int, consumed: int, read: int,
                   exhausted: bool) -> tuple[np.random.Generator, np.ndarray, int, list[int]]:
    """After ``consumed`` draws of a shuffle of ``size`` slots that had read ``read``
    upstream elements: the random stream positioned after those draws ``(rng, block,
    index)``, and the upstream position each slot holds. Depends only on the draws, never
    on the data; vectorized while upstream still refilled every slot."""
    rng = np.random.Generator(np.random.PCG64(derive_seed(seed, epoch)))
    blocks = -(-consumed // _DRAWS)
    draws = rng.random(blocks * _DRAWS) if blocks else np.empty(0)
    block = draws[(blocks - 1) * _DRAWS:] if blocks else np.empty(0)
    di = consumed - (blocks - 1) * _DRAWS if blocks else 0
    first = min(size, read)  # the first fill
    # draws while upstream still gave a replacement: draw t refills its slot with position first + t
    full = consumed if not exhausted else max(0, min(consumed, read - first))
    slots = (draws[:full] * first).astype(np.int64) if first else np.empty(0, np.int64)
    pos = np.arange(first, dtype=np.int64)
    if full:
        last = np.full(first, -1, np.int64)
        uniq, idx = np.unique(slots[::-1], return_index=True)
        last[uniq] = full - 1 - idx
        drawn = last >= 0
        pos[drawn] = first + last[drawn]
    positions = pos.tolist()
    # the draws after upstream ran out: each takes a slot and moves the last one into it
    for t in range(full, consumed):
        i = int(draws[t] * len(positions))
        positions[i] = positions[-1]
        positions.pop()
    return rng, block, di, positions


class ShuffleDataset(UnaryDataset):
    kind = "shuffle"

    def __init__(self, parent: Dataset, buffer_size: int, seed: int | None = None,
                 reshuffle_each_iteration: bool = True) -> None:
        super().__init__(parent)
        self.buffer_size = positive_int("shuffle buffer_size", buffer_size)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be an int >= 0 or None, got {seed!r}")
        self.seed = seed
        self.reshuffle_each_iteration = bool(reshuffle_each_iteration)

    def cardinality(self) -> int | float | None:
        return self.parent.cardinality()

    def _order_varies(self) -> bool:
        return self.seed is None  # each pass (each reader's) draws its own

    def _deferred_spec(self):
        return self.parent._deferred_spec()

    def _batch_node(self, b: Build, state: Mapping[str, Any] | None, batch: Dataset) -> Node | None:
        """A following ``batch`` asks here; a parent that can shuffle and batch whole
        batches itself (a TFRecord source) makes the fused node."""
        return self.parent._shuffle_batch_node(b, state, self, batch)

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return _ShuffleNode(b, self, state)


def _replayable(state: Any) -> bool:
    """False when a state (nested) says its source cannot be reopened to give the same
    records again (``"replayable": False``, what a work-queue source's state carries)."""
    if isinstance(state, Mapping):
        if state.get("replayable") is False:
            return False
        return all(_replayable(v) for v in state.values())
    if isinstance(state, list):
        return all(_replayable(v) for v in state)
    return True


class _ShuffleNode(Node):
    def __init__(self, b: Build, ds: ShuffleDataset, state: Mapping[str, Any] | None) -> None:
        if state is not None:
            seed = int(state["seed"])
            self.parent_start = state["parent_start"]
        else:
            # no seed given: draw one now and keep it in the state, so a resume still matches
            seed = ds.seed if ds.seed is not None else secrets.randbits(63)
            self.parent_start = None
        self.seed = seed
        self.epoch = b.epoch if ds.reshuffle_each_iteration else ()
        self.size = ds.buffer_size
        self.buf: list = []
        self.pos: list[int] = []  # upstream position of each slot's element
        self.read = 0  # upstream elements read
        self.exhausted = False
        self.draws = np.empty(0)
        self.di = 0
        self.consumed = 0
        self.every = max(1, self.size // 4)
        self.anchors: collections.deque = collections.deque()  # (position, upstream state), trimmed
        # upstream elements are a source's records one for one: the state can name where each
        # buffered one lies, and a restore reads back only those (see shardfeed.pipeline.frames)
        self.src = ds.parent._record_source()
        self.recorder: FrameRecorder | None = None
        self.restored: tuple | None = None  # where the records a restore read back lie
        anchor = state.get("anchor") if state is not None else None
        if state is not None and state.get("read") is not None and self.src is not None \
                and state.get("frames") is not None:
            self._restore_frames(b, ds, state)
            return
        if state is not None and state.get("read") is not None and anchor is not None:
            self.parent = self._build_parent(b, ds, anchor[1], int(anchor[0]))
            super().__init__(b, ds, [self.parent])
            self._restore(int(state["consumed"]), int(state["read"]), bool(state["exhausted"]), int(anchor[0]))
            return
        self.parent = self._build_parent(b, ds, self.parent_start, 0)
        super().__init__(b, ds, [self.parent])
        self.rng = np.random.Generator(np.random.PCG64(derive_seed(seed, self.epoch)))
        for _ in range(int(state["consumed"]) if state else 0):
            self._shuffled_next()

    def _build_parent(self, b: Build, ds: ShuffleDataset, state: Any, base: int) -> Node:
        """Upstream from ``state`` (upstream position ``base``), its source telling a
        recorder where each record lies when it can."""
        if self.src is not None:
            if ds.parent._filters_records():  # records numbered from 0; the filter says which each element is
                self.recorder = FrameRecorder(0, kept_base=base)
                self.first_record = ds.parent._records_before(state)  # the filter's first input
            else:
                self.recorder = FrameRecorder(base - ds.parent._records_before(state))
        return ds.parent._build(b.but(frames=self.recorder), state)

    # -- reading upstream, remembering cursors to resume from ----------------------------
    def _read_one(self) -> Any:
        if self.read % self.every == 0:
            anchors = self.anchors
            anchors.append((self.read, self.parent.get_state()))
            if len(anchors) > 8:  # drop cursors older than the one before the oldest buffered element
                oldest = min(self.pos) if self.pos else self.read
                while len(anchors) > 1 and anchors[1][0] <= oldest:
                    anchors.popleft()
                if self.recorder is not None:
                    self.recorder.trim(oldest)
        x = next(self.parent)
        self.read += 1
        return x

    def _shuffled_next(self) -> Any:
        buf = self.buf
        if not self.exhausted and len(buf) < self.size:
            try:
                while len(buf) < self.size:
                    p = self.read
                    buf.append(self._read_one())
                    self.pos.append(p)
            except StopIteration:
                self.exhausted = True
        if not buf:
            raise StopIteration
        if self.di >= len(self.draws):
            self.draws = self.rng.random(_DRAWS)
            self.di = 0
        i = int(self.draws[self.di] * len(buf))
        self.di += 1
        x = buf[i]
        if not self.exhausted:
            try:
                p = self.read
                buf[i] = self._read_one()
                self.pos[i] = p
            except StopIteration:
                self.exhausted = True
        if self.exhausted:
            buf[i] = buf[-1]
            buf.pop()
            self.pos[i] = self.pos[-1]
            self.pos.pop()
        self.consumed += 1
        return x

    _next = _shuffled_next

    # -- resuming ------------------------------------------------------------------------------
    def _restore(self, consumed: int, read: int, exhausted: bool, anchor_pos: int) -> None:
        """Rebuild the buffer after ``consumed`` draws without replaying them through
        upstream, which is open at the anchor (upstream position ``anchor_pos``)."""
        self.rng, self.draws, self.di, positions = slot_positions(self.seed, self.epoch, self.size, consumed, read,
                                                                  exhausted)
        # re-read upstream from the anchor, keeping the elements still in the buffer (the
        # positions set first: the cursors and record offsets kept meanwhile are trimmed by them)
        self.pos = positions
        want = {p: k for k, p in enumerate(positions)}
        buf: list = [None] * len(positions)
        self.read = anchor_pos
        got = 0
        while self.read < read and got < len(want):
            p = self.read
            x = self._read_one()
            k = want.get(p)
            if k is not None:
                buf[k] = x
                got += 1
        if got != len(want):
            raise RuntimeError(f"shuffle resume: upstream gave {got} of the {len(want)} buffered elements "
                               "(is the upstream deterministic?)")
        # upstream is now at position `read`: skip the rest of the already-read range
        while self.read < read:
            self._read_one()
        if self.src is not None:  # every record from the anchor's was read again
            again = read - anchor_pos  # its records one for one
            kept = self.recorder.kept if self.recorder is not None else None
            if kept is not None and read > anchor_pos:  # some of them: up to the last element's record
                self.recorder.resolve()
                again = kept.last_record + 1 - self.first_record
            self.src._merge_stats(ReadStats(reread=again))
        self.buf, self.pos = buf, positions
        self.exhausted = exhausted
        self.consumed = consumed

    def _restore_frames(self, b: Build, ds: ShuffleDataset, state: Mapping[str, Any]) -> None:
        """Rebuild the buffer from the records the state's ``"frames"`` names: read back by
        offset, mapped again by the stages between the source and here (upstream built over
        them, :class:`~shardfeed.pipeline.frames.Replay`); upstream goes on from the cursor at
        the first record not drawn into the buffer. At most one buffer is re-read."""
        consumed, read, exhausted = int(state["consumed"]), int(state["read"]), bool(state["exhausted"])
        frames = state["frames"]
        resume_pos, resume_state = int(frames["resume"][0]), frames["resume"][1]
        if resume_pos != read:
            raise ValueError(f"shuffle resume: the state's frames resume at upstream position {resume_pos}, "
                             f"its buffer was filled up to {read}: not a state this shuffle saved")
        self.rng, self.draws, self.di, positions = slot_positions(self.seed, self.epoch, self.size, consumed, read,
                                                                  exhausted)
        src = self.src
        got, self.restored = fetch_frames(src, frames, b.ctx.stats.storage, src.options.cache)
        order = sorted(got)
        if order != sorted(positions):
            raise ValueError(f"shuffle resume: the state's frames name {len(order)} records, its buffer holds "
                             f"{len(positions)} others: not a state this shuffle saved")
        replay = ds.parent._build(b.but(frames=Replay([got[p][0] for p in order])), None)
        try:
            elements = list(itertools.islice(replay, len(order)))
        finally:
            replay.close()
        if len(elements) != len(order):
            raise RuntimeError(f"shuffle resume: the stages between the source and the shuffle gave {len(elements)} "
                               f"elements for the {len(order)} buffered records (is every stage one output an input, "
                               "and deterministic?)")
        at = dict(zip(order, elements))
        self.buf, self.pos = [at[p] for p in positions], positions
        self.parent = self._build_parent(b, ds, resume_state, read)
        super().__init__(b, ds, [self.parent])
        if state.get("anchor") is not None:  # for a later state without offsets
            self.anchors.append((int(state["anchor"][0]), state["anchor"][1]))
        self.read, self.exhausted, self.consumed = read, exhausted, consumed

    def _frames(self, oldest: int) -> Frames:
        """The state's ``"frames"``, made into JSON only if the state is kept."""
        recorder = self.recorder
        recorder.trim(oldest)
        restored = self.restored
        if restored is not None and (not len(restored[0]) or oldest > restored[0][-1]):
            self.restored = restored = None  # none of those records is buffered any more
        kept = recorder.kept.snapshot() if recorder.kept is not None else None  # resolved by trim()
        # the positions: a copy of the list (pointers: microseconds), an array only if the state is kept
        return Frames([self.read, self.parent.get_state()], self.pos.copy(), tuple(recorder.index), restored,
                      self.src.options.compression, kept)

    def get_state(self) -> dict:
        if self.read and not _replayable(self.anchors[-1][1] if self.anchors else None):
            # upstream is its own checkpoint (a work queue): it cannot give the buffered
            # records again, so a restore starts a fresh buffer where upstream is now (a read
            # position: the buffered records were not delivered, see ReadPosition)
            return {"seed": self.seed, "parent_start": ReadPosition(self.parent.get_state()), "consumed": 0,
                    "replayable": False}
        state = {"seed": self.seed, "parent_start": self.parent_start, "consumed": self.consumed,
                 "read": self.read, "exhausted": self.exhausted, "anchor": None}
        if self.read == 0:
            state["anchor"] = [0, self.parent_start]
            return state
        oldest = min(self.pos) if self.pos else self.read
        for p, st in reversed(self.anchors):
            if p <= oldest:
                state["anchor"] = [p, st]
                break
        if self.recorder is not None and self.pos:
            state["frames"] = self._frames(oldest)
        return state

    def close(self) -> None:
        self.buf = []
        self.pos = []
        self.anchors.clear()
        self.parent.close()
