"""The recycled batch-buffer pool between passes: kept warm, given back when idle.

Large buffer-form bytes columns and ``decode_images`` batches are backed by blocks of a
small process-wide pool in the native core (``_native/bufpool.c``: at most 8 blocks and
512 MiB held while unused). A block goes back to the pool when the last array using it
dies and is taken by a later batch, so that batch is copied into memory that is already
mapped instead of pages the kernel must fault in and zero (which cost more than the copy).

This module decides how long unused blocks stay:

- **When a pass closes** the pool is kept, so the next pass starts warm. It holds only
  blocks that batches had in use at once (a block is made only when none held fits), and
  at most the hard caps above.
- **A block left unused for** :func:`pool_idle_seconds` (``$SHARDFEED_POOL_IDLE_SECONDS``,
  default 10) **is given back to the system** (``munmap``) by a daemon thread started when
  a pass closes and ending once the pool is empty with no block in use: it sleeps until
  the oldest held block expires (a block still in use when the pass closed, a batch you
  kept, is looked at again every idle period, so it goes within about twice that after it
  comes back). During a pass blocks are taken again within milliseconds, so none expires.
  ``0`` gives everything back when each pass closes.
- :func:`release_pooled_memory` gives every unused block back at once; so does the
  interpreter's exit, and so does a child made by ``os.fork`` (a DataLoader worker, say)
  for the blocks it inherited: their pages are shared with the parent until one side
  writes, so the child would pay a copy where the parent pays nothing, and the parent's
  next reuse would copy what the child holds. Processes started with ``spawn`` (the
  pipeline's ``in_subprocess`` child) start with an empty pool of their own.

Arrays in use are never touched by any of this: only blocks no array refers to are freed.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
from typing import NamedTuple

from .native import _ext, release_pooled_memory

__all__ = ["DEFAULT_IDLE_SECONDS", "ENV_IDLE", "PoolInfo", "pool_idle_seconds", "pool_info",
           "release_pooled_memory", "set_pool_idle_seconds"]

ENV_IDLE = "SHARDFEED_POOL_IDLE_SECONDS"
"""The environment variable that sets :func:`pool_idle_seconds`."""
DEFAULT_IDLE_SECONDS = 10.0
"""How long an unused pooled block is kept when nothing says otherwise."""

_idle_override: float | None = None
_lock = threading.Lock()
_wake = threading.Condition(_lock)
_keeper: threading.Thread | None = None
_stopping = False
_warned = False
logger = logging.getLogger(__name__)


class PoolInfo(NamedTuple):
    """What the pool holds now and has done since the process started."""

    blocks: int  # blocks held, unused, for later batches
    bytes: int  # their size in bytes
    reused: int  # batches that took a held block
    allocated: int  # blocks mapped fresh


def pool_info() -> PoolInfo:
    """The pool's counters (all zero without the native core)."""
    if _ext is None:
        return PoolInfo(0, 0, 0, 0)
    return PoolInfo(*_ext.pool_info())


def _check_seconds(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise ValueError(f"{what} must be a number of seconds >= 0 (0: give unused blocks back when each "
                         f"pass closes; inf: keep them until release_pooled_memory()), got {value!r}")
    return float(value)


def pool_idle_seconds() -> float:
    """How long an unused pooled block is kept before it goes back to the system: the value
    given to :func:`set_pool_idle_seconds`, else ``$SHARDFEED_POOL_IDLE_SECONDS``, else 10.
    Raises ``ValueError`` naming the variable when it is not a number >= 0."""
    if _idle_override is not None:
        return _idle_override
    text = os.environ.get(ENV_IDLE)
    if not text:
        return DEFAULT_IDLE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    return _check_seconds(value, f"{ENV_IDLE} (set to {text!r})")


def set_pool_idle_seconds(seconds: float | None) -> None:
    """Keep unused pooled blocks for ``seconds`` (0: give them back when each pass closes;
    ``math.inf``: until :func:`release_pooled_memory`); ``None`` goes back to
    ``$SHARDFEED_POOL_IDLE_SECONDS`` or the default. Applies to blocks already held.
    Raises ``ValueError`` for a negative or non-numeric value."""
    global _idle_override
    _idle_override = None if seconds is None else _check_seconds(seconds, "set_pool_idle_seconds(seconds)")
    if _ext is None:
        return
    if pool_idle_seconds() == 0:
        _ext.pool_clear()
    with _lock:
        _wake.notify_all()  # a sleeping keeper re-reads the setting


def _idle_or_default() -> float:
    """:func:`pool_idle_seconds`, or the default with a warning when the variable is not a
    number of seconds (closing a pass never fails for it, and the pool is still looked after)."""
    try:
        return pool_idle_seconds()
    except ValueError as exc:
        global _warned
        if not _warned:
            _warned = True
            logger.warning("%s; using %s", exc, DEFAULT_IDLE_SECONDS)
        return DEFAULT_IDLE_SECONDS


def pass_closed() -> None:
    """Called when a pass that may have filled the pool closes: frees what has been idle too
    long (everything when the idle time is 0) and makes sure the rest is freed once it has
    been idle that long, if no later batch takes it first."""
    if _ext is None:
        return
    idle = _idle_or_default()
    if idle == 0:
        _ext.pool_clear()
        return
    wait, in_use = _ext.pool_trim(idle)
    if (wait < 0 and in_use == 0) or math.isinf(idle):
        return  # nothing held or to come back, or kept until asked
    global _keeper
    with _lock:
        if _keeper is not None or _stopping:
            return  # the running keeper sees the new blocks when it next wakes
        _keeper = threading.Thread(target=_keep, name="shardfeed-pool-idle", daemon=True)
        _keeper.start()


def _keep() -> None:
    """The keeper: sleeps until the oldest unused block has been idle long enough and frees
    it; while arrays still hold blocks (a batch kept after its pass, a pass still running),
    it looks again every idle period; it ends when nothing is held or to come back."""
    global _keeper
    with _lock:
        try:
            while not _stopping:
                idle = _idle_or_default()
                if math.isinf(idle):
                    break
                wait, in_use = _ext.pool_trim(idle)
                if (wait < 0 and in_use == 0) or idle == 0:
                    break  # (0: each pass's close gives everything back)
                # only blocks in use: look again after an idle period (a second at least, never a busy loop)
                _wake.wait((max(idle, 1.0) if wait < 0 else wait) + 0.01)
        finally:
            _keeper = None


def _after_fork_in_child() -> None:
    global _lock, _wake, _keeper, _stopping
    _lock = threading.Lock()  # the parent's keeper may have held it at the fork
    _wake = threading.Condition(_lock)
    _keeper = None
    _stopping = False
    if _ext is not None:
        _ext.pool_clear()


def _at_exit() -> None:
    global _stopping
    with _lock:
        _stopping = True
        _wake.notify_all()
    release_pooled_memory()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
