"""Storage by URL: plain paths, ``file://``, ``memory://``, ``s3://``, ``oss://``, ``gs://``,
``http(s)://`` through fsspec, with ranged reads, atomic writes, retries and masked secrets."""

from .counters import IOCounters
from .fs import clear_cache, get_filesystem
from .io import (
    AtomicWriter,
    RangedReader,
    exists,
    expand,
    glob,
    list_dir,
    open_input,
    open_output,
    open_range,
    read_bytes,
    remove,
    size,
    write_bytes,
)
from .retry import RetryPolicy, reset_retry_stats, retry_stats
from .urls import mask, parse_url, register_secret

__all__ = [
    "AtomicWriter", "IOCounters", "RangedReader", "RetryPolicy", "clear_cache", "exists", "expand",
    "get_filesystem", "glob", "list_dir", "mask", "open_input", "open_output", "open_range", "parse_url",
    "read_bytes", "register_secret", "remove", "reset_retry_stats", "retry_stats", "size",
    "write_bytes",
]
