"""PAI-TF job IO parameters: ``--buckets``, ``--tables``, ``--outputs``, ``--checkpointDir``.

A PAI-TF job (source document 002, "PAI-TF任务参数介绍") receives its inputs and outputs
as command-line flags, each a comma-separated list::

    pai -name tensorflow1120_ext ... -Dbuckets='oss://bkt.oss-cn-beijing-internal.aliyuncs.com/data/'
        -Dtables='odps://prj/tables/train,odps://prj/tables/eval/pt=20240101'
        -Doutputs='odps://prj/tables/scores' -DcheckpointDir='oss://bkt.oss-cn-beijing-internal.aliyuncs.com/ckpt/'

and the script reads them through ``tf.app.flags``. :func:`pai_flags` parses the same
flags, so the script runs unchanged apart from its IO calls::

    flags = sf.pai_flags()                  # sys.argv[1:] by default
    ds = sf.read_table(flags.tables[0], record_defaults=[1.0] * 4)
    files = sf.read_tfrecord(flags.buckets[0] + "train/*.tfrecord", spec)

Every URL is checked as shardfeed reads it: OSS URLs in PAI's forms (the endpoint in the
host, ``?host=``, ``?role_arn=``) and table URLs with partitions
(``odps://project/tables/name/pt=1/ds=2``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from .storage.urls import parse_url

FLAGS = ("buckets", "tables", "outputs", "checkpointDir")


@dataclass
class PaiFlags:
    """The IO flags of a PAI-TF job: ``buckets``, ``tables``, ``outputs`` (lists of URLs,
    in the order given), ``checkpointDir`` (one URL or ``None``); ``rest`` holds every
    other argument, untouched (for the script's own flags)."""

    buckets: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    checkpointDir: str | None = None  # noqa: N815 - PAI's flag name
    rest: list[str] = field(default_factory=list)

    @property
    def checkpoint_dir(self) -> str | None:
        return self.checkpointDir


def _split(name: str, value: str) -> list[str]:
    """A comma-separated flag value as its URLs (blanks and surrounding spaces dropped)."""
    urls = [u.strip() for u in value.split(",")]
    urls = [u for u in urls if u]
    for u in urls:
        if "://" not in u:
            raise ValueError(f"--{name}: {u!r} is not a URL (PAI gives oss://... or odps://...)")
    return urls


def _check_bucket(url: str) -> str:
    p = parse_url(url)  # raises for a malformed object-store URL
    if p.protocol not in ("oss", "s3", "gs", "file"):
        raise ValueError(f"--buckets: {url!r} is not an object-store URL")
    # PAI requires each bucket URL to end with '/': a prefix that paths are appended to
    base, sep, query = url.partition("?")
    return (base if base.endswith("/") else base + "/") + sep + query


def _check_table(url: str, flag: str) -> str:
    from .tables.urls import parse_table_url  # noqa: PLC0415 - table URLs need no driver to parse

    parse_table_url(url)
    return url.rstrip("/")


def pai_flags(argv: Sequence[str] | None = None) -> PaiFlags:
    """Parse PAI-TF's IO flags from ``argv`` (default ``sys.argv[1:]``): ``--name=value``
    or ``--name value`` (also ``-Dname=value``, the ``pai`` command's own spelling). Bucket
    URLs get the trailing ``/`` PAI requires; table URLs are checked; several values are
    comma-separated. Raises ``ValueError`` naming the flag for a value that is not a URL."""
    args = list(sys.argv[1:] if argv is None else argv)
    out = PaiFlags()
    i = 0
    while i < len(args):
        arg = args[i]
        name = value = None
        for prefix in ("--", "-D"):
            if arg.startswith(prefix) and arg[len(prefix):].split("=", 1)[0] in FLAGS:
                name, eq, value = arg[len(prefix):].partition("=")
                if not eq:
                    if i + 1 >= len(args):
                        raise ValueError(f"--{name} needs a value")
                    i += 1
                    value = args[i]
                break
        i += 1
        if name is None:
            out.rest.append(arg)
            continue
        value = value.strip().strip("'\"")
        if name == "buckets":
            out.buckets += [_check_bucket(u) for u in _split(name, value)]
        elif name in ("tables", "outputs"):
            out.__dict__[name] += [_check_table(u, name) for u in _split(name, value)]
        else:
            urls = _split(name, value)
            if len(urls) != 1:
                raise ValueError(f"--checkpointDir takes one URL, got {len(urls)}")
            out.checkpointDir = urls[0]
    return out


__all__ = ["PaiFlags", "pai_flags"]
