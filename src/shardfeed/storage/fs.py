"""From a URL to an fsspec filesystem, with object-store endpoints and credentials resolved.

``oss://bucket/key`` is Alibaba OSS (or MinIO, or any S3-compatible store) over the S3
protocol; its endpoint comes, in this order, from the ``storage_options`` argument
(``endpoint_url``), the URL's ``?endpoint=`` or ``?host=`` query, or ``OSS_ENDPOINT``.
Its keys come from ``storage_options`` (``key``/``secret``) or ``OSS_ACCESS_KEY_ID`` and
``OSS_ACCESS_KEY_SECRET``. ``s3://`` takes ``endpoint_url`` from ``storage_options``,
``S3_ENDPOINT_URL`` or ``AWS_ENDPOINT_URL``, and keys the usual AWS way.

Retrying is done once, by shardfeed (:mod:`shardfeed.storage.retry`), so the S3 client's
own retry loops are switched off and every retry is counted.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Mapping

from .urls import ParsedURL, mask, parse_url, register_secret

_INSTALL_HINT = {
    "s3": "pip install 'shardfeed[s3]' (s3fs)",
    "oss": "pip install 'shardfeed[s3]' (s3fs; OSS is reached through the S3 protocol)",
    "gs": "pip install 'shardfeed[gcs]' (gcsfs)",
    "http": "pip install 'shardfeed[http]' (aiohttp)",
    "https": "pip install 'shardfeed[http]' (aiohttp)",
}

_cache: dict[tuple, Any] = {}
_cache_lock = threading.Lock()
_s3_classes: dict[str, type] = {}


def _s3_class(protocol: str) -> type:
    """An s3fs subclass with its own retries off; one per protocol name (s3, oss)."""
    cls = _s3_classes.get(protocol)
    if cls is None:
        try:
            import s3fs  # noqa: PLC0415 - optional dependency
        except ImportError as exc:
            raise ImportError(f"{protocol}:// URLs need s3fs: {_INSTALL_HINT[protocol]}") from exc

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
    options["config_kwargs"] = config
    for secret_key in ("secret", "token", "password"):
        if isinstance(options.get(secret_key), str):
            register_secret(options[secret_key])
    return options


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
    if protocol == "file":
        from fsspec.implementations.local import LocalFileSystem  # noqa: PLC0415

        return LocalFileSystem(**storage_options)
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        hint = _INSTALL_HINT.get(protocol, f"install the fsspec backend for {protocol}://")
        raise ImportError(f"{protocol}:// URLs need an extra package: {hint}") from exc
    except ValueError as exc:
        raise ValueError(f"{mask(parsed.original)}: unknown storage protocol {protocol!r}") from exc
    for secret_key in ("secret", "token", "password"):
        if isinstance(storage_options.get(secret_key), str):
            register_secret(storage_options[secret_key])
    return cls(**storage_options)


def clear_cache() -> None:
    """Forget cached filesystem objects (tests; after changing credentials)."""
    with _cache_lock:
        _cache.clear()
