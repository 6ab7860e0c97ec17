"""Reading a converted output: its manifest, and a dataset over one split of it. Light on
purpose: ``sf.read_converted`` imports the read path and these few helpers, not the
conversion stack (sources, plans, runners, image codecs)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from .. import storage
from ..deprecation import renamed_argument
from ..errors import ShardfeedError
from ..storage.urls import mask
from .layout import join, manifest_url, spec_from_json
from .options import fspath

logger = logging.getLogger(__name__)


class ShardChangedError(ShardfeedError, ValueError):
    """A shard of a converted output is not the file its manifest lists (another size, or
    missing): cut by a partial copy, appended to, or replaced since the conversion. ``url``
    (masked), ``expected`` and ``found`` (bytes; ``None`` when missing)."""

    def __init__(self, url: str, expected: int, found: int | None) -> None:
        now = "is missing" if found is None else f"is {found:,} bytes"
        super().__init__(f"{url} {now}, its manifest lists {expected:,}: the shard changed since the conversion "
                         "(a partial copy or sync?); copy it again, or convert again")
        self.url, self.expected, self.found = url, expected, found

    def __reduce__(self):  # pickles (process pools) with its custom init
        return (type(self), (self.url, self.expected, self.found), self.__dict__)


def _check_shard_sizes(out: str, shards: list, storage_options: Mapping[str, Any] | None,
                       on_corrupt: str, listed: bool) -> set[str]:
    """The shards whose size is not the manifest's: a :class:`ShardChangedError` for the
    first, or with ``on_corrupt="skip"`` a warning each and their URLs (the read then delivers
    what they hold, and the dataset's cardinality is unknown). The sizes come from a listing
    of ``out`` (``listed``: the one that found the manifest), not a request a shard;
    manifests of older versions list no sizes and are not checked."""
    sized = [s for s in shards if "bytes" in s]
    if not sized:
        return set()
    if not listed:
        try:
            storage.list_dir(out, storage_options)  # one request: the sizes below are answered from it
        except FileNotFoundError:
            pass
    changed = set()
    for s in sized:
        url = join(out, s["file"])
        try:
            found: int | None = storage.size(url, storage_options)
        except FileNotFoundError:
            found = None
        if found != int(s["bytes"]):
            err = ShardChangedError(mask(url), int(s["bytes"]), found)
            if on_corrupt != "skip":
                raise err
            logger.warning("%s (on_corrupt='skip': reading what it holds)", err)
            changed.add(url)
    return changed


def find_manifest(output_dir: str | os.PathLike, prefix: str | None = None,
                  storage_options: Mapping[str, Any] | None = None) -> str:
    """URL of the conversion manifest in ``output_dir`` (``<prefix>-manifest.json``).

    Raises ``FileNotFoundError`` when there is none, ``ValueError`` when there are several
    and no ``prefix`` says which.
    """
    out = fspath(output_dir)
    if prefix is not None:
        url = manifest_url(out, prefix)
        if not storage.exists(url, storage_options):
            raise FileNotFoundError(f"{mask(url)}: no conversion manifest (was the conversion finished?)")
        return url
    try:
        found = [u for u in storage.list_dir(out, storage_options) if u.endswith("-manifest.json")]
    except (FileNotFoundError, NotADirectoryError):
        found = []
    if not found:
        raise FileNotFoundError(f"{mask(out)}: no '<prefix>-manifest.json' here; not a finished conversion output")
    if len(found) > 1:
        names = ", ".join(u.rsplit("/", 1)[-1] for u in found)
        raise ValueError(f"{mask(out)} holds several conversions ({names}); pass prefix=")
    return found[0]


def load_manifest(output_dir: str | os.PathLike, prefix: str | None = None,
                  storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of a converted output directory, as a dict."""
    return json.loads(storage.read_bytes(find_manifest(output_dir, prefix, storage_options),
                                         storage_options=storage_options))


def manifest_spec(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The feature spec (``FixedLen``/``VarLen``) a manifest records."""
    return spec_from_json(manifest["feature_spec"])


@renamed_argument("output_dir", "source")
def read_converted(source: str | os.PathLike, split: str = "train", *, prefix: str | None = None,
                   storage_options: Mapping[str, Any] | None = None, **read_kwargs: Any):
    """A dataset over one split of a converted output, its spec taken from the manifest:
    ``shardfeed.read_tfrecord(<that split's shards>, spec=...)``; other keyword arguments go
    to ``read_tfrecord`` (``num_parallel_reads``, ``on_corrupt`` ...).

    The manifest's record counts make the dataset's ``cardinality()`` known (so
    ``to_tf()`` tells Keras the epoch length) even for compressed shards.

    ``source`` may also be what TFRecorder wrote (no manifest; ``train-*``,
    ``validation-*``, ``test-*`` GZIP shards, directly or in the one ``tfrecorder-*`` job
    folder under it): the split's records are parsed with a spec inferred from a sample of
    them, and ``image`` (TFRecorder's base64 of raw pixels) comes decoded into a uint8
    array of shape ``(image_height, image_width, image_channels)``;
    ``split="discarded-data"`` reads the rows TFRecorder discarded
    (:mod:`shardfeed.convert.tfrecorder`).

    Each shard's size is checked against the manifest's (one listing of ``source``): a shard
    cut, appended to or missing since the conversion raises :class:`ShardChangedError` naming
    it (with ``on_corrupt="skip"``: a warning, what it holds is read, and the cardinality is
    unknown), instead of an epoch short of records while ``cardinality()`` says otherwise.

    Raises ``ValueError`` naming the splits there are when ``split`` has no shards,
    ``FileNotFoundError`` when ``source`` holds neither layout.
    """
    from ..pipeline import read_tfrecord
    from ..pipeline.spans import StaticSpans, file_spans

    out = fspath(source)
    try:
        manifest = load_manifest(out, prefix, storage_options)
    except FileNotFoundError:
        if prefix is not None:
            raise
        from .tfrecorder import find_layout, read_split

        layout = find_layout(out, storage_options)
        if layout is None:
            raise
        return read_split(layout, split, storage_options, **read_kwargs)
    split = split.lower()
    info = manifest["splits"].get(split)
    if not info or not info["shards"]:
        have = ", ".join(manifest["splits"]) or "none"
        raise ValueError(f"{mask(out)}: no shards for split {split!r} (splits: {have})")
    files = [join(out, s["file"]) for s in info["shards"]]
    changed = _check_shard_sizes(out, info["shards"], storage_options, read_kwargs.get("on_corrupt", "raise"),
                                 listed=prefix is None)
    counts = {join(out, s["file"]): int(s["records"]) for s in info["shards"] if "records" in s}
    if changed:  # what they hold now is not the manifest's count
        counts = {}
    return read_tfrecord(StaticSpans(file_spans(files), counts), spec=manifest_spec(manifest),
                         compression=manifest["compression"], storage_options=storage_options, **read_kwargs)


read_dataset = read_converted
"""The earlier name of :func:`read_converted`."""
