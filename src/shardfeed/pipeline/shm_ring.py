"""The control block of an ``in_subprocess`` ring: what crosses per element without a pipe.

A small shared-memory block, made by the consumer and mapped by the child, holds:

- a ring of ``nslots`` element descriptors (which slot and generation, where in the slot
  the element's layout numbers, structure, layout kinds, state and statistics lie, its size
  and work time),
  written by the child, read by the consumer in order;
- per slot, how many times the consumer handed it back (the child counts how many times it
  filled it: a slot is free when the two agree).

Two semaphores go with it (futexes: a post with nobody waiting and a wait on a positive
count are atomic instructions, no system call). ``ready`` counts descriptors published
and messages on the child's pipe (the end of a pass, an error): while elements are ready
the consumer takes one with no system call, and blocks on it only when the ring is empty.
``free`` wakes the child for a slot handed back, only while the child says (a word here)
that it sleeps on it: a consumer that hands a slot back while the child is busy makes no
system call.

The ring cannot overrun: the child publishes a descriptor only for a free slot, so at most
``nslots`` are published and not yet taken, and descriptor ``n`` reuses the place of
``n - nslots``, taken before its slot came back.
"""

from __future__ import annotations

from typing import Any

from . import shm

FIELDS = ("seq", "slot", "gen", "size", "ref", "at", "numbers", "structure", "kinds", "state", "snap", "work_s")
_SEQ, _SLOT, _GEN, _SIZE, _REF, _AT, _NUMBERS, _STRUCTURE, _KINDS, _STATE, _SNAP, _WORK = range(len(FIELDS))
DESC = 16  # int64 words per descriptor (two cache lines)
_PUBLISHED = 0  # word 0: descriptors published (the child's)
_BLOCKED = 8  # word 8: the child sleeps on ``free`` (the child's); words 9-15: padding
_RETURNED = 16  # words 16...: per slot, times handed back (the consumer's)


def _round8(n: int) -> int:
    return -(-n // 8) * 8


def block_bytes(nslots: int) -> int:
    """The size of the control block of a ring of ``nslots`` slots."""
    return 8 * (_RETURNED + _round8(nslots) + DESC * nslots)


class ControlBlock:
    """One side's view of the control block in ``buf`` (a writable buffer of
    :func:`block_bytes` bytes, zeroed when made)."""

    def __init__(self, buf: Any, nslots: int) -> None:
        self.nslots = nslots
        self.buf = buf
        self.q = memoryview(buf).cast("B").cast("q")  # word reads and writes: no numpy scalar per access
        self.d = self.q.cast("B").cast("d")  # the same words, for the work time
        self.ring_at = _RETURNED + _round8(nslots)
        self.sent = [0] * nslots  # the child's: times each slot was filled
        self.taken = 0  # the consumer's: descriptors taken

    # -- the child's side -------------------------------------------------------------------
    def free_slot(self, limit: int | None = None) -> int | None:
        """A slot the consumer has handed back, or None when there is none, or (``limit``)
        when that many slots are not back yet (published, or held by the consumer)."""
        q, base = self.q, _RETURNED
        free = None
        busy = 0
        for k, n in enumerate(self.sent):
            if q[base + k] == n:
                if free is None:
                    free = k
                    if limit is None:
                        return k
            else:
                busy += 1
        return None if limit is not None and busy >= limit else free

    def publish(self, slot: int, gen: int, size: int, ref: int | None, at: int,
                lengths: tuple[int, int, int, int, int], work_s: float) -> None:
        """Describe the element just written into ``slot`` (its arrays, then at ``at`` its
        layout's numbers, structure, layout's kinds, state and statistics, of ``lengths``
        bytes); the consumer sees it once the caller posts ``ready``."""
        q = self.q
        n = q[_PUBLISHED]
        i = self.ring_at + (n % self.nslots) * DESC
        q[i + _SLOT], q[i + _GEN], q[i + _SIZE], q[i + _AT] = slot, gen, size, at
        q[i + _REF] = -1 if ref is None else ref
        q[i + _NUMBERS], q[i + _STRUCTURE], q[i + _KINDS], q[i + _STATE], q[i + _SNAP] = lengths
        self.d[i + _WORK] = work_s
        q[i + _SEQ] = n
        self.sent[slot] += 1
        q[_PUBLISHED] = n + 1

    def sleeping(self, yes: bool) -> None:
        """Say the child is about to block on ``free`` (or has woken): the consumer then
        posts it with each slot it hands back. A hand-back that misses the word is seen
        at the child's next tick (it blocks with a timeout and counts again)."""
        self.q[_BLOCKED] = 1 if yes else 0

    # -- the consumer's side ----------------------------------------------------------------
    def waiting(self) -> int:
        """Descriptors published and not yet taken."""
        return self.q[_PUBLISHED] - self.taken

    def take(self) -> tuple | None:
        """The next descriptor ``(slot, gen, size, ref, at, lengths, work_s)``, or None when
        the child has published no other (the ``ready`` token is for its pipe)."""
        q, n = self.q, self.taken
        if q[_PUBLISHED] <= n:
            return None
        i = self.ring_at + (n % self.nslots) * DESC
        if q[i + _SEQ] != n:
            raise RuntimeError(f"in_subprocess ring: descriptor {n} reads as {q[i + _SEQ]} (the control block is "
                               "corrupt)")
        self.taken = n + 1
        ref = q[i + _REF]
        return (q[i + _SLOT], q[i + _GEN], q[i + _SIZE], None if ref < 0 else ref, q[i + _AT],
                (q[i + _NUMBERS], q[i + _STRUCTURE], q[i + _KINDS], q[i + _STATE], q[i + _SNAP]),
                self.d[i + _WORK])

    def hand_back(self, slot: int) -> bool:
        """Count ``slot`` handed back; True when the child sleeps on ``free`` (the caller
        posts it). One thread at a time per slot: a slot is handed back once per element,
        after the child filled it."""
        q = self.q
        q[_RETURNED + slot] += 1
        return q[_BLOCKED] != 0


MIN_IN_FLIGHT = 4
"""Elements a child with a budget of slot bytes may always have out (published or held):
the consumer then keeps views of at most ``MIN_IN_FLIGHT - 1`` (it copies the others out),
so a child is never kept waiting by a consumer that waits for it."""


def in_flight_limit(nslots: int, slot_bytes: int | None, size: int) -> int:
    """Elements of ``size`` bytes a child may have out at once: ``nslots``, or within a
    budget of ``slot_bytes`` (never fewer than :data:`MIN_IN_FLIGHT`)."""
    if slot_bytes is None:
        return nslots
    return min(nslots, max(MIN_IN_FLIGHT, slot_bytes // max(1, size)))


def open_block(name: str, nslots: int) -> ControlBlock:
    """The existing control block segment ``name``, mapped here."""
    return ControlBlock(shm.map_segment(name), nslots)


__all__ = ["ControlBlock", "block_bytes", "open_block"]
