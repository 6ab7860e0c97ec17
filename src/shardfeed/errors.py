"""The project's own exceptions.

Every error says what was wrong and where: the URL (with credentials masked), the byte
offset, the record index, the feature. Storage failures use the built-in exceptions
(``FileNotFoundError``, ``PermissionError``) or :class:`StorageError`, an ``OSError``.
"""

from __future__ import annotations

import threading
import time
from typing import Any


class SkipWarnings:
    """The warnings of errors skipped under a skipping policy: each logged while at most
    ``burst`` came in the last moments, then at most one a second, saying how many it stands
    for (a pass over a shard truncated or garbled from some point on would log one line a
    record: 150,000 lines for one cut file). Every skipped error is still counted (a pass's
    ``stats().errors``, ``read_stats``); this limits the log only. Thread-safe, one for the
    process."""

    def __init__(self, burst: int = 20, per_second: float = 1.0) -> None:
        self.burst, self.per_second = burst, per_second
        self.tokens = float(burst)
        self.at = time.monotonic()
        self.held = 0  # skipped and not logged since the last one logged
        self.quiet = False  # the burst is spent: one a second
        self.lock = threading.Lock()

    def warn(self, logger: Any, fmt: str, *args: Any) -> None:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.per_second)
            self.at = now
            announce = False
            if self.tokens >= 1.0:
                if self.tokens >= self.burst - 1:
                    self.quiet = False  # calm again: the next flood is said again
                self.tokens -= 1.0
                held, self.held = self.held, 0
            elif not self.quiet:
                self.quiet, held, announce = True, 0, True  # this one is logged, saying the next are held back
            else:
                self.held += 1
                return
        if held:
            fmt, args = fmt + " (and %d more skipped since the last one logged)", (*args, held)
        if announce:
            fmt += ("; more errors are being skipped: each is counted (a pass's stats().errors), and "
                    "logged at most one a second from now on")
        logger.warning(fmt, *args)


SKIP_WARNINGS = SkipWarnings()
"""The process's :class:`SkipWarnings` (every reader's and stage's skipped errors)."""


def warn_skipped(logger: Any, fmt: str, *args: Any) -> None:
    """Log a skipped error through :data:`SKIP_WARNINGS`."""
    SKIP_WARNINGS.warn(logger, fmt, *args)


def _rebuild(cls: type, args: tuple, kwargs: dict, state: dict) -> BaseException:
    exc = cls(*args, **kwargs)
    exc.__dict__.update(state)  # notes and any attribute set after construction
    return exc


class ShardfeedError(Exception):
    """Base class of every error raised by shardfeed itself."""


class StorageError(ShardfeedError, OSError):
    """A storage operation failed for a reason other than a missing file or a denied access.

    ``url`` is masked (no credentials, no signatures).
    """

    def __init__(self, message: str, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url


class CorruptRecordError(ShardfeedError, ValueError):
    """A TFRecord frame failed a check.

    Attributes: ``url`` (masked), ``offset`` (byte offset of the frame's start in the
    uncompressed stream), ``check`` (one of ``"length crc"``, ``"data crc"``,
    ``"truncated length"``, ``"truncated length crc"``, ``"truncated data"``,
    ``"truncated data crc"``, ``"absurd length"``), ``record_index`` (how many frames
    came before it in the file).
    """

    def __init__(
        self,
        check: str,
        url: str | None,
        offset: int,
        record_index: int | None = None,
        detail: str = "",
    ) -> None:
        super().__init__(self._message(check, url, offset, record_index, detail))
        self.check = check
        self.url = url
        self.offset = offset
        self.record_index = record_index
        self.detail = detail

    @staticmethod
    def _message(check: str, url: str | None, offset: int, record_index: int | None, detail: str) -> str:
        msg = f"corrupt TFRecord in {url or '<buffer>'} at byte offset {offset}: {check} check failed"
        if record_index is not None:
            msg += f" (record #{record_index})"
        if detail:
            msg += f"; {detail}"
        return msg

    def relocate(self, url: str, note: str) -> "CorruptRecordError":
        """Name ``url`` (masked by the caller) as the file, in the message too, and add
        ``note``: an error found reading a local copy (the object cache's) reported for the
        object it copies. Returns itself."""
        if self.url != url:
            self.url = url
            self.args = (self._message(self.check, url, self.offset, self.record_index, self.detail),)
            self.add_note(note)
        return self

    def __reduce__(self):  # keep pickling (process pools) working with the custom init
        return (type(self), (self.check, self.url, self.offset, self.record_index, self.detail), self.__dict__)


class DecodeError(ShardfeedError, ValueError):
    """Bytes given to a protobuf decoder are not a valid message of the expected type.

    ``record_index`` is the record's position in the batch or file when known, ``url``
    and ``offset`` where the record came from when known.
    """

    def __init__(
        self,
        message: str,
        *,
        record_index: int | None = None,
        url: str | None = None,
        offset: int | None = None,
    ) -> None:
        parts = [message]
        if record_index is not None:
            parts.append(f"record #{record_index}")
        if url is not None:
            parts.append(f"in {url}")
        if offset is not None:
            parts.append(f"at byte offset {offset}")
        super().__init__(", ".join(parts) if len(parts) > 1 else message)
        self.message = message
        self.record_index = record_index
        self.url = url
        self.offset = offset

    def with_record_index(self, record_index: int | None) -> "DecodeError":
        """The same error naming another record index (its place in a larger batch)."""
        return type(self)(self.message, record_index=record_index, url=self.url, offset=self.offset)

    def __reduce__(self):  # pickled with its attributes (process pools)
        return (_rebuild, (type(self), (self.message,), {"record_index": self.record_index, "url": self.url,
                                                          "offset": self.offset}, self.__dict__))


class ParseError(ShardfeedError, ValueError):
    """A record does not match the feature spec (wrong type, wrong length, missing).

    ``feature`` names the feature key, ``record_index`` the record's position in the batch.
    """

    def __init__(self, message: str, *, feature: str | None = None, record_index: int | None = None) -> None:
        parts = []
        if feature is not None:
            parts.append(f"feature {feature!r}")
        if record_index is not None:
            parts.append(f"record #{record_index}")
        prefix = (", ".join(parts) + ": ") if parts else ""
        super().__init__(prefix + message)
        self.message = message
        self.feature = feature
        self.record_index = record_index

    def with_record_index(self, record_index: int | None) -> "ParseError":
        """The same error naming another record index (its place in a larger batch)."""
        return type(self)(self.message, feature=self.feature, record_index=record_index)

    def __reduce__(self):  # pickled with its attributes (process pools)
        return (_rebuild, (type(self), (self.message,), {"feature": self.feature, "record_index": self.record_index},
                           self.__dict__))


class IteratorClosedError(ShardfeedError, RuntimeError):
    """A pipeline iterator was closed (``close()`` from another thread) while its consumer
    was reading it: raised to the consumer instead of a quiet end that would hide the
    records not yet read."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message or "the iterator was closed while it was being read (close() from another "
                         "thread?); the records after the last one delivered were not read")


class WorkQueueLostError(ShardfeedError, KeyError):
    """A work queue's backend lost the queue this worker joined (a Redis restart without
    persistence): the worker stops instead of running the epoch again."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""



class ImageDecodeError(ShardfeedError, ValueError):
    """An encoded image that could not be decoded (``decode_images``): ``feature`` is its
    column and ``index`` its row in the batch; the decoder's exception is the cause."""

    def __init__(self, message: str, feature: str = "", index: int = -1) -> None:
        super().__init__(message)
        self.feature = feature
        self.index = index

    def __reduce__(self):  # pickled with its attributes (process pools)
        return (_rebuild, (type(self), (self.args[0], self.feature, self.index), {}, self.__dict__))


class SubprocessError(ShardfeedError, RuntimeError):
    """The child process of an ``in_subprocess`` stage died (the message names the exit
    code or signal), or failed with an exception that could not be sent back as itself
    (its type and text are in the message, the child's traceback in ``__cause__``)."""
