"""URL parsing and masking of secrets.

Every URL that reaches a log line or an error message goes through :func:`mask` first:
``user:password@`` becomes ``user:***@``, signed query parameters become ``***``, and any
secret registered with :func:`register_secret` (keys given as arguments) is replaced too.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

# Query parameters whose values are secrets (compared case-insensitively).
_SECRET_PARAMS = {
    "signature", "x-amz-signature", "x-amz-credential", "x-amz-security-token",
    "x-goog-signature", "x-goog-credential", "sig", "token", "access_token",
    "security-token", "securitytoken", "password", "secret", "secret_key",
    "access_key_secret", "accesskeysecret", "ossaccesskeyid", "accesskeyid",
    "access_key_id", "key",
}
# the password runs to the last '@' before a blank: passwords may hold '@', and a '/'
# (malformed, but typed: "postgresql://bob:pa/ss@host/db"); a port and a path with an '@'
# in them ("http://h:80/a@b") are masked too: too much hidden rather than a password shown
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:/@\s]*):(?P<pw>\S+)@")
_QUERY_PARAM = re.compile(r"(?P<sep>[?&;])(?P<name>[A-Za-z0-9_.\-]+)=(?P<value>[^&#\s'\"]*)")

_secrets: set[str] = set()
_secrets_lock = threading.Lock()

# Protocols handled by fsspec implementations that shardfeed knows about.
LOCAL_PROTOCOLS = ("file", "local")
KNOWN_PROTOCOLS = ("file", "memory", "s3", "oss", "gs", "gcs", "http", "https")


def register_secret(value: str | None) -> None:
    """Mask ``value`` wherever it appears in shardfeed's log lines and error messages."""
    if value and len(value) >= 4:
        with _secrets_lock:
            _secrets.add(value)


def mask(text: object, also: Iterable[str | None] = ()) -> str:
    """Return ``str(text)`` with passwords, signatures and registered secrets replaced by ``***``.

    ``also``: secrets of this one message (a URL's own password, which a library may
    quote without its URL), hidden as the registered ones are (those of 4 characters or
    more: a shorter one would hide every such piece of text; in a URL it is masked anyway)."""
    s = str(text)
    with _secrets_lock:
        secrets = sorted(_secrets.union(a for a in also if a and len(a) >= 4), key=len, reverse=True)
    for secret in secrets:  # first: the patterns below may split a secret that holds '@'
        s = s.replace(secret, "***")
    s = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", s)
    s = _QUERY_PARAM.sub(
        lambda m: f"{m['sep']}{m['name']}=***" if m["name"].lower() in _SECRET_PARAMS else m.group(0), s
    )
    return s


@dataclass(frozen=True, repr=False)
class ParsedURL:
    """A storage URL split into what fsspec needs.

    ``protocol`` is ``"file"`` for plain paths; ``path`` is what the filesystem expects
    (bucket/key for object stores, an absolute path locally); ``query`` holds parameters
    shardfeed consumes (``endpoint``/``host`` for ``oss://``) and is re-attached to URLs
    built from this one, so globbing ``oss://b/*?endpoint=...`` yields routable URLs.
    """

    protocol: str
    path: str
    query: tuple[tuple[str, str], ...] = field(default=())
    original: str = ""

    def with_path(self, path: str) -> str:
        """A URL of the same protocol and query for another path of the same filesystem."""
        if self.protocol == "file" and "://" not in self.original:
            return path
        url = f"{self.protocol}://{path}"
        if self.query:
            url += "?" + "&".join(f"{k}={v}" for k, v in self.query)
        return url

    @property
    def is_local(self) -> bool:
        return self.protocol in LOCAL_PROTOCOLS

    def __repr__(self) -> str:  # the dataclass's would show a signed URL's signature
        query = tuple((k, "***" if k.lower() in _SECRET_PARAMS else v) for k, v in self.query)
        return (f"ParsedURL(protocol={self.protocol!r}, path={mask(self.path)!r}, query={query!r}, "
                f"original={mask(self.original)!r})")


URL_PARAMETERS = frozenset({"endpoint", "host", "role_arn"})
"""The query parameters an object-store URL may carry (``oss://bucket/key?endpoint=...``);
a ``?`` followed by anything else belongs to the key."""


def parse_url(url: str) -> ParsedURL:
    """Split ``url`` into protocol, filesystem path and shardfeed's own query parameters.

    Plain paths and ``file://`` URLs are local. Query strings are kept for ``http(s)``
    (part of the object's address) and parsed for object stores when they hold only
    :data:`URL_PARAMETERS` (a key may hold ``?``).
    """
    if not isinstance(url, str):
        url = str(url)  # os.PathLike
    if not url:
        raise ValueError("empty storage URL")
    if "://" not in url:
        return ParsedURL("file", url, (), url)
    protocol, rest = url.split("://", 1)
    protocol = protocol.lower()
    if protocol in ("http", "https"):
        return ParsedURL(protocol, url, (), url)
    if protocol in LOCAL_PROTOCOLS:
        return ParsedURL("file", rest if rest.startswith("/") else "/" + rest, (), url)
    query: tuple[tuple[str, str], ...] = ()
    if "?" in rest:
        head, qs = rest.split("?", 1)
        pairs = tuple(parse_qsl(qs, keep_blank_values=True))
        # shardfeed's own parameters (and a signature's, kept out of requests and logs);
        # anything else after a "?" is part of the key (S3 keys may hold "?": a listing
        # gives such URLs back)
        if pairs and all(k in URL_PARAMETERS or k.lower() in _SECRET_PARAMS for k, _ in pairs):
            rest, query = head, pairs
    if protocol == "gcs":
        protocol = "gs"
    if protocol in ("s3", "oss", "gs"):
        parts = urlsplit(f"{protocol}://{rest}")
        if not parts.netloc:
            raise ValueError(f"{mask(url)}: an object-store URL needs a bucket, as {protocol}://bucket/key")
        if "@" in parts.netloc:
            raise ValueError(
                f"{mask(url)}: put credentials in storage_options or environment variables, not in the URL"
            )
    if protocol == "oss":
        rest, query = _pai_oss_form(url, rest, query)
    return ParsedURL(protocol, rest, query, url)


_role_arn_told = False


def _pai_oss_form(url: str, rest: str, query: tuple) -> tuple[str, tuple]:
    """PAI's OSS URL forms as plain ``bucket/key`` plus ``endpoint``: the endpoint in the
    host (``oss://bucket.oss-cn-hangzhou.aliyuncs.com/key``; OSS bucket names hold no
    dot, so the first dot ends the bucket) and ``role_arn`` in the query (accepted and
    dropped: a RAM role is assumed only inside PAI)."""
    global _role_arn_told
    netloc, sep, key = rest.partition("/")
    if "." in netloc:
        bucket, host = netloc.split(".", 1)
        given = dict(query).get("endpoint") or dict(query).get("host")
        if given and given.split("://")[-1].rstrip("/") != host:
            raise ValueError(f"{mask(url)}: the endpoint in the host ({host}) and in the query ({given}) differ")
        if not given:
            query = query + (("endpoint", host),)
        rest = bucket + sep + key
    if any(k == "role_arn" for k, _ in query):
        query = tuple((k, v) for k, v in query if k != "role_arn")
        if not _role_arn_told:
            _role_arn_told = True
            logging.getLogger(__name__).warning(
                "%s: role_arn is accepted but not used: a RAM role is assumed only inside PAI; give OSS keys "
                "through OSS_ACCESS_KEY_ID / OSS_ACCESS_KEY_SECRET or storage_options={'key': ..., 'secret': ...}",
                mask(url))
    return rest, query


def has_magic(url: str) -> bool:
    """True when ``url`` holds glob characters (``*``, ``?`` outside a query, ``[``)."""
    p = parse_url(url)
    path = p.path if p.protocol not in ("http", "https") else url.split("?", 1)[0]
    return any(c in path for c in "*?[")


def endpoint_option(storage_options: Mapping[str, Any] | None) -> str:
    """The endpoint ``storage_options`` name (``endpoint_url``, directly or in
    ``client_kwargs``), or ``""``: part of what identifies a store beside its URL."""
    so = storage_options or {}
    return so.get("endpoint_url") or (so.get("client_kwargs") or {}).get("endpoint_url") or ""
