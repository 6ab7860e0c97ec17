"""What a saved reader state depends on, and the check that it fits the reader restoring it.

A provider's state is an index into the spans of its pass (or, for ``shuffle="global"``,
a position in a permutation of all records): it means the same records only to a reader
over the same spans, in the same order, with the same seed, and (except under a global
shuffle, whose states any reader of any number may resume) the same reader of the same
number. A state records those (:func:`identity`), and a reader refuses one that does not
fit with a ``ValueError`` saying which and how to resume, instead of resuming into another
order (records repeated or missing without a word). States saved before these were
recorded carry none of them and are taken as they are.

URLs in a state are keyed (:func:`state_url`): signatures and credentials of a presigned
URL are left out (checkpoints get copied and shared), and the live URL is the dataset's.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode

from ..storage.urls import mask

_SIGNING = ("x-amz-", "x-goog-", "x-oss-")
_SIGNING_PARAMS = {"signature", "expires", "ossaccesskeyid", "awsaccesskeyid", "accesskeyid", "security-token",
                   "sig", "se", "st", "sp", "sv", "sr", "spr", "skoid", "sktid", "skt", "ske", "sks", "skv"}
"""Query parameters of a signed URL (S3 and OSS v2, Azure SAS), besides ``x-amz-*``, ``x-goog-*``, ``x-oss-*``."""


@functools.lru_cache(maxsize=4096)
def state_url(url: str) -> str:
    """``url`` as a saved state names it: without the parameters of a signature (a
    presigned URL's ``X-Amz-Signature``, ``X-Amz-Credential``, ``X-Amz-Date``, ``Expires``
    ...: they change each time it is signed again, and they are secrets), other secrets
    masked. The same object signed twice has one name."""
    base, sep, query = url.partition("?")
    if sep:
        kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True)
                if not (k.lower().startswith(_SIGNING) or k.lower() in _SIGNING_PARAMS)]
        url = base + ("?" + urlencode(kept) if kept else "")
    return mask(url)


def spans_digest(keys: Sequence[Sequence[Any]]) -> str:
    """``"<count>:<digest>"`` of the spans ``keys`` (``[url, offset, end]`` each, in order)."""
    h = hashlib.sha256()
    for url, offset, end in keys:
        h.update(f"{state_url(url)}\0{offset}\0{end}\n".encode())
    return f"{len(keys)}:{h.hexdigest()[:16]}"


def _reader(chain: Sequence[Sequence[int]]) -> str:
    if not chain:
        return "the only reader (no slice_id/slice_count, .shard() or DataLoader worker split)"
    return ", then ".join(f"reader {int(i)} of {int(c)}" for i, c in chain)


def check_state(saved: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` when provider state ``saved`` was made by a reader unlike the one
    whose :func:`identity` is ``mine``; a field the state lacks (an earlier version's) is
    not checked."""
    if "files" in saved and "shuffle" in mine and "shuffle" not in saved:
        raise ValueError(f"this state was saved by a reader without a source shuffle, but this one has "
                         f"shuffle={mine['shuffle']!r}: resume with the shuffle mode it was saved with")
    if "shuffle" in saved and saved["shuffle"] != mine.get("shuffle"):
        raise ValueError(f"this state was saved by a shuffle={saved['shuffle']!r} reader, but this one has "
                         f"shuffle={mine.get('shuffle')!r}: resume with the shuffle mode it was saved with")
    if "seed" in saved and "seed" in mine and saved["seed"] != mine["seed"]:
        raise ValueError(f"this state was saved with seed={saved['seed']!r}, but this reader has "
                         f"seed={mine['seed']!r}: resume with the seed it was saved with (another seed is another "
                         "order, and records would repeat or go missing)")
    if "files" in saved and saved["files"] != mine["files"]:
        n_saved, n_mine = str(saved["files"]).split(":")[0], str(mine["files"]).split(":")[0]
        what = (f"{n_saved} files or ranges, this reader {n_mine}" if n_saved != n_mine else
                f"{n_saved} files or ranges, and this reader as many but not the same ones (names or order differ)")
        raise ValueError(f"this state was saved by a reader of other files: it read {what}: resume with the same "
                         "files, at the same addresses, in the same order (a state is a position in their order)")
    if "slice" in saved and "slice" in mine and [list(p) for p in saved["slice"]] != [list(p) for p in mine["slice"]]:
        raise ValueError(f"this state was saved by {_reader(saved['slice'])}, but this is {_reader(mine['slice'])}: "
                         "a reader resumes its own state, with the same slice_id, slice_count, ranks and "
                         "DataLoader workers (only shuffle='global' resumes any reader's state into any number of "
                         "readers)")


def identity(files: str, slice_chain: Sequence[Sequence[int]] | None, shuffle: str | None = None,
             seed: int | None = None) -> dict[str, Any]:
    """The fields a provider's state carries so that a restore can be checked
    (:func:`check_state`): the spans' digest, which reader of how many (``None``: any
    reader may resume it), the shuffle mode and seed."""
    out: dict[str, Any] = {"files": files}
    if shuffle is not None:
        out["shuffle"] = shuffle
        out["seed"] = seed
    if slice_chain is not None:
        out["slice"] = [[int(i), int(c)] for i, c in slice_chain]
    return out
