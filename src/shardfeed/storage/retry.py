"""Retries with exponential backoff and equal jitter on transient storage errors.

Transient: HTTP 5xx, throttling (``SlowDown``, ``Throttling``, ``RequestTimeout``),
timeouts, connection resets and refused connections. Never retried: 4xx answers,
missing files, denied access, bad arguments. Every retry is counted; read the counts
with :func:`retry_stats`.
"""

from __future__ import annotations

import errno
import logging
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .urls import mask

logger = logging.getLogger(__name__)
T = TypeVar("T")

_TRANSIENT_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeoutException",
    "InternalError", "ServiceUnavailable", "503 SlowDown", "RequestLimitExceeded",
    "TooManyRequests", "ProvisionedThroughputExceededException", "BandwidthLimitExceeded",
    "Busy", "ServerBusy", "InternalServerError",
}
_TRANSIENT_ERRNOS = {
    errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE,
    errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETRESET, errno.EAGAIN,
}
_TRANSIENT_TEXT = re.compile(r"\b(SlowDown|Service Unavailable|503|InternalError|RequestTimeout)\b")
_TRANSIENT_NAMES = {
    # by class name, so that optional libraries need not be imported to classify them
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ResponseStreamingError", "IncompleteReadError", "ServerDisconnectedError", "ClientPayloadError",
    "ClientConnectorError", "ClientOSError", "ServerTimeoutError", "FSTimeoutError", "IncompleteRead",
    "RemoteDisconnected", "ProtocolError", "ChunkedEncodingError", "BadStatusLine",
}


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry. Delays in seconds: after attempt ``n`` (from 1) a
    wait of ``d = min(max_delay, base_delay * 2**(n-1))``, half of it fixed and half a
    uniform random time (equal jitter: clients spread out, and the attempts reach the
    deadline, so an outage shorter than it is ridden out; with full jitter 8 attempts spanned
    2-5 s and a 3 s outage ended the pass, found from outside)."""

    max_attempts: int = 12
    base_delay: float = 0.05
    max_delay: float = 5.0
    deadline_s: float = 10.0
    """No attempt starts later than this many seconds after the first failure: with the
    default connect (5 s) and read (10 s) timeouts a dead or stalled endpoint fails within
    30 s, and a long transfer that fails late still gets its retries."""

    def delay(self, attempt: int, rng: random.Random) -> float:
        d = min(self.max_delay, self.base_delay * (2 ** (attempt - 1)))
        return d / 2 + rng.uniform(0.0, d / 2)


DEFAULT_POLICY = RetryPolicy()


class _Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.retries = 0
        self.gave_up = 0
        self.by_reason: Counter[str] = Counter()
        self.by_op: Counter[str] = Counter()

    def record(self, op: str, reason: str) -> None:
        with self._lock:
            self.retries += 1
            self.by_reason[reason] += 1
            self.by_op[op] += 1

    def record_give_up(self) -> None:
        with self._lock:
            self.gave_up += 1

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "retries": self.retries,
                "gave_up": self.gave_up,
                "by_reason": dict(self.by_reason),
                "by_op": dict(self.by_op),
            }

    def reset(self) -> None:
        with self._lock:
            self.retries = 0
            self.gave_up = 0
            self.by_reason.clear()
            self.by_op.clear()


_STATS = _Stats()
_rng = random.Random()


def retry_stats() -> dict:
    """Counts of retries since start (or the last reset): ``retries``, ``gave_up`` (operations
    that failed after the last attempt), ``by_reason`` and ``by_op``."""
    return _STATS.snapshot()


def reset_retry_stats() -> None:
    """Set every retry count back to zero."""
    _STATS.reset()


def _status_and_code(exc: BaseException) -> tuple[int | None, str | None]:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        meta = response.get("ResponseMetadata", {}) or {}
        err = response.get("Error", {}) or {}
        status = meta.get("HTTPStatusCode")
        return (int(status) if status else None), err.get("Code")
    status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
    if isinstance(status, int):
        # an S3 error code (SlowDown) kept as an attribute, not a client's property
        code = vars(exc).get("code") if hasattr(exc, "__dict__") else None
        return status, code if isinstance(code, str) and code else None
    return None, None


def transient_reason(exc: BaseException) -> str | None:
    """Why ``exc`` is worth retrying (a short tag), or ``None`` when it is not.

    Follows the ``__cause__``/``__context__`` chain, since fsspec backends wrap client errors.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
            return None
        status, code = _status_and_code(e)
        if code in _TRANSIENT_CODES:
            return code
        if status is not None:
            if status >= 500 or status in (408, 429):
                return f"HTTP {status}"
            if 400 <= status < 500:
                return None
        name = type(e).__name__
        if name in _TRANSIENT_NAMES:
            return name
        if isinstance(e, (TimeoutError, ConnectionError)):
            return type(e).__name__
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return errno.errorcode.get(e.errno, str(e.errno))
        if not isinstance(e, ValueError):
            # whole words only: "503" inside an ETag, a byte offset or a file name is no status
            found = _TRANSIENT_TEXT.search(str(e))
            if found:
                return found.group(0)
        e = e.__cause__ or e.__context__
    return None


def call_with_retry(
    fn: Callable[[], T],
    *,
    op: str,
    url: str,
    policy: RetryPolicy = DEFAULT_POLICY,
    counters: Any = None,
    stop: Callable[[], bool] | None = None,
) -> T:
    """Run ``fn()``; on a transient error sleep with backoff and try again, up to
    ``policy.max_attempts`` attempts and no later than ``policy.deadline_s`` after the
    first. Non-transient errors propagate at once, and so does any error once ``stop()``
    says nobody waits for the result (a read ahead of a pass that ended). Each retry is
    counted once, in :func:`retry_stats` and in ``counters`` (an :class:`~.counters.IOCounters`)
    if given."""
    attempt = 1
    failed_at: float | None = None  # the deadline counts from the first failure
    while True:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below
            reason = transient_reason(exc)
            if reason is None or (stop is not None and stop()):
                raise  # not transient, or nobody waits for it any more (its pass ended)
            delay = policy.delay(attempt, _rng)
            if failed_at is None:
                failed_at = time.monotonic()
            if attempt >= policy.max_attempts or time.monotonic() - failed_at + delay > policy.deadline_s:
                _STATS.record_give_up()
                raise
            _STATS.record(op, reason)
            if counters is not None:
                counters.add(retries=1)
            logger.debug("%s %s: transient error (%s), retry %d in %.3fs", op, mask(url), reason, attempt, delay)
            time.sleep(delay)
            attempt += 1
