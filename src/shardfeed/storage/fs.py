"""From a URL to an fsspec filesystem, with object-store endpoints and credentials resolved.

``oss://bucket/key`` is Alibaba OSS (or MinIO, or any S3-compatible store) over the S3
protocol; its endpoint comes, in this order, from the ``storage_options`` argument
(``endpoint_url``), the URL's ``?endpoint=`` or ``?host=`` query, or ``OSS_ENDPOINT``.
Its keys come from ``storage_options`` (``key``/``secret``) or ``OSS_ACCESS_KEY_ID`` and
``OSS_ACCESS_KEY_SECRET``. ``s3://`` takes ``endpoint_url`` from ``storage_options``,
``S3_ENDPOINT_URL`` or ``AWS_ENDPOINT_URL``, and keys the usual AWS way.

Retrying is done once, by shardfeed (:mod:`shardfeed.storage.retry`), so the S3 client's
own retry loops are switched off and every retry is counted.

Timeouts: ``storage_options={"connect_timeout": s, "read_timeout": s}`` for ``s3``,
``oss`` and ``http(s)`` (defaults :data:`CONNECT_TIMEOUT_S` and :data:`READ_TIMEOUT_S`);
with the retry deadline (no new attempt 10 s after the first failure) a dead or stalled
endpoint fails within 30 s.
``max_concurrency`` caps the ranged requests in flight (:mod:`.fetch`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from .. import registry
from .urls import ParsedURL, endpoint_option, mask, parse_url, register_secret

_cache: dict[tuple, Any] = {}
_cache_lock = threading.Lock()
_s3_classes: dict[str, type] = {}


def _s3_class(protocol: str) -> type:
    """An s3fs subclass with its own retries off; one per protocol name (s3, oss)."""
    cls = _s3_classes.get(protocol)
    if cls is None:
        s3fs = registry.load("storage", protocol)  # the s3fs module, or ImportError with the pip command

        cls = type(
            f"Shardfeed{protocol.upper()}FileSystem",
            (s3fs.S3FileSystem,),
            {"retries": 1, "protocol": (protocol,), "cachable": False},
        )
        _s3_classes[protocol] = cls
    return cls


def _endpoint(url: ParsedURL, options: dict) -> str | None:
    if options.get("endpoint_url"):
        return options.pop("endpoint_url")
    query = dict(url.query)
    ep = query.get("endpoint") or query.get("host")
    if not ep:
        if url.protocol == "oss":
            ep = os.environ.get("OSS_ENDPOINT")
        else:
            ep = os.environ.get("S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
    if ep and "://" not in ep:
        ep = "https://" + ep
    return ep


def _s3_options(url: ParsedURL, storage_options: Mapping[str, Any]) -> dict:
    options = dict(storage_options)
    timeouts = _pop_timeouts(options)
    max_pool = options.pop("max_concurrency", None) or _MAX_POOL
    options.pop("direct_get", None)
    endpoint = _endpoint(url, options)
    if url.protocol == "oss":
        if endpoint is None:
            raise ValueError(
                f"{mask(url.original)}: no OSS endpoint; add ?endpoint=oss-<region>.aliyuncs.com to the "
                "URL, set OSS_ENDPOINT, or pass storage_options={'endpoint_url': ...}"
            )
        options.setdefault("key", os.environ.get("OSS_ACCESS_KEY_ID"))
        options.setdefault("secret", os.environ.get("OSS_ACCESS_KEY_SECRET"))
        if not options.get("key"):
            options.pop("key", None)
            options.pop("secret", None)
        # OSS speaks virtual-hosted-style S3 only
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("s3", {"addressing_style": "virtual"} if "aliyuncs.com" in endpoint else {})
        options["config_kwargs"] = config
    if endpoint:
        client = dict(options.get("client_kwargs") or {})
        client.setdefault("endpoint_url", endpoint)
        options["client_kwargs"] = client
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
    config.setdefault("connect_timeout", timeouts[0])
    config.setdefault("read_timeout", timeouts[1])
    # enough pooled connections for the requests the fetcher keeps in flight
    config.setdefault("max_pool_connections", max_pool)
    session_cls = _counted_session_class()
    if session_cls is not None and _aioconfig_takes("http_session_cls"):
        config.setdefault("http_session_cls", session_cls)
    options["config_kwargs"] = config
    for secret_key in ("secret", "token", "password"):
        if isinstance(options.get(secret_key), str):
            register_secret(options[secret_key])
    return options


CONNECT_TIMEOUT_S = 5.0
"""Seconds to open a connection before the attempt fails (and is retried)."""
READ_TIMEOUT_S = 10.0
"""Seconds without a byte from an open connection before the attempt fails (and is retried)."""
_MAX_POOL = 64
_OWN_OPTIONS = ("max_concurrency", "connect_timeout", "read_timeout", "direct_get")


def _pop_timeouts(options: dict) -> tuple[float, float]:
    """``connect_timeout`` and ``read_timeout`` (seconds) taken out of ``options``."""
    out = []
    for name, default in (("connect_timeout", CONNECT_TIMEOUT_S), ("read_timeout", READ_TIMEOUT_S)):
        value = options.pop(name, None)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"storage_options[{name!r}] must be a number of seconds > 0, got {value!r}")
        out.append(float(value))
    return out[0], out[1]


def _http_options(storage_options: dict) -> dict:
    options = dict(storage_options)
    connect, read = _pop_timeouts(options)
    options.pop("max_concurrency", None)
    options.pop("direct_get", None)
    client = dict(options.get("client_kwargs") or {})
    if "timeout" not in client:
        import aiohttp  # noqa: PLC0415 - fsspec's HTTP backend needs it anyway

        client["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)
    options["client_kwargs"] = client
    return options


_session_class: Any = None


def _aioconfig_takes(name: str) -> bool:
    """Whether this aiobotocore's ``AioConfig`` accepts ``name`` (older ones do not)."""
    try:
        import inspect  # noqa: PLC0415

        from aiobotocore.config import AioConfig  # noqa: PLC0415
    except ImportError:
        return False
    return name in inspect.signature(AioConfig.__init__).parameters


def _counted_session_class() -> Any:
    """aiobotocore's HTTP session with aiohttp's own silent retry switched off.

    aiohttp re-sends an idempotent request once, without a word, when a pooled
    connection was closed under it; shardfeed retries that itself instead, so that every
    retry is counted once (:func:`~.retry.retry_stats`, ``stats().storage``).
    """
    global _session_class
    if _session_class is None:
        try:
            from aiobotocore.httpsession import AIOHTTPSession  # noqa: PLC0415 - optional
        except ImportError:
            return None

        class CountedRetriesSession(AIOHTTPSession):
            async def _get_session(self, proxy_url):
                session = await super()._get_session(proxy_url)
                if getattr(session, "_retry_connection", None) is True:
                    session._retry_connection = False
                return session

        _session_class = CountedRetriesSession
    return _session_class


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def get_filesystem(url: str | ParsedURL, storage_options: Mapping[str, Any] | None = None):
    """Return ``(filesystem, path)`` for ``url``. Filesystem objects are cached per
    protocol and options, and are safe to share between threads."""
    parsed = url if isinstance(url, ParsedURL) else parse_url(url)
    storage_options = dict(storage_options or {})
    key_query = parsed.query if parsed.protocol in ("s3", "oss") else ()
    key = (parsed.protocol, key_query, _freeze(storage_options), os.getpid())
    with _cache_lock:
        fs = _cache.get(key)
    if fs is None:
        fs = _make_filesystem(parsed, storage_options)
        with _cache_lock:
            fs = _cache.setdefault(key, fs)
    return fs, parsed.path


def _make_filesystem(parsed: ParsedURL, storage_options: dict):
    import fsspec  # noqa: PLC0415 - keep `import shardfeed` light

    protocol = parsed.protocol
    if protocol in ("s3", "oss"):
        return _s3_class(protocol)(**_s3_options(parsed, storage_options))
    if protocol not in ("http", "https"):
        storage_options = {k: v for k, v in storage_options.items() if k not in _OWN_OPTIONS}
    if protocol == "file":
        from fsspec.implementations.local import LocalFileSystem  # noqa: PLC0415

        return LocalFileSystem(**storage_options)
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        try:
            hint = registry.entry("storage", protocol).hint
        except KeyError:
            hint = f"install the fsspec backend for {protocol}://"
        raise ImportError(f"{protocol}:// URLs need an extra package: {hint}") from exc
    except ValueError as exc:
        raise ValueError(f"{mask(parsed.original)}: unknown storage protocol {protocol!r}") from exc
    for secret_key in ("secret", "token", "password"):
        if isinstance(storage_options.get(secret_key), str):
            register_secret(storage_options[secret_key])
    if protocol in ("http", "https"):
        storage_options = _http_options(storage_options)
    if protocol in ("gs", "gcs") and endpoint_option(storage_options):
        cls = _plain_gcs_class(cls)
    return cls(**storage_options)


def _plain_gcs_class(cls: type) -> type:
    """gcsfs's plain filesystem class, for a ``gs://`` endpoint of the user's own (an
    emulator, a proxy, a GCS-compatible store). Recent gcsfs registers an extended class
    that first asks the endpoint over gRPC (TLS) what kind of bucket it holds; anything but
    Google itself never answers, and every bucket then stalls 60 s before gcsfs falls back
    to this class."""
    try:
        from gcsfs.core import GCSFileSystem  # noqa: PLC0415 - optional, imported with gcsfs
    except ImportError:  # pragma: no cover - an old gcsfs: its one class is the plain one
        return cls
    return GCSFileSystem if issubclass(cls, GCSFileSystem) else cls


def clear_cache() -> None:
    """Forget cached filesystem objects (tests; after changing credentials)."""
    with _cache_lock:
        _cache.clear()
