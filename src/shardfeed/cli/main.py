"""The ``shardfeed`` command line: head, count, verify, index, inspect, demo."""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .. import __version__, storage
from ..errors import CorruptRecordError, DecodeError, ShardfeedError
from ..formats import tfrecord as tfr
from ..formats.example import decode_example
from ..formats.index import build_index
from ..progress import progress_bar
from ..storage.urls import mask


def _json_value(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, list):
        out = []
        for b in v:
            try:
                out.append(b.decode("utf-8"))
            except UnicodeDecodeError:
                out.append({"base64": base64.b64encode(b).decode("ascii")})
        return out
    return v


def _record_files(args) -> list[str]:
    """The TFRecord files the arguments name; what a folder or glob held besides them
    (index files, manifests, schema.pbtxt, reports) is left out, and said on stderr."""
    urls, skipped = tfr.record_files(args.urls)
    if skipped and not getattr(args, "quiet", False):
        names = ", ".join(os.path.basename(u.split("?", 1)[0]) for u in skipped[:8])
        more = f" and {len(skipped) - 8} more" if len(skipped) > 8 else ""
        print(f"skipped {len(skipped)} file(s) that are not TFRecords: {names}{more}", file=sys.stderr)
    return urls


def _records(args) -> Iterator[tuple[str, tfr.TFRecordReader]]:
    for url in _record_files(args):
        reader = tfr.TFRecordReader(url, compression=args.compression, on_corrupt="raise")
        yield url, reader


def cmd_head(args) -> int:
    n = 0
    for url, reader in _records(args):
        with reader:
            for i, record in enumerate(reader):
                if n >= args.n:
                    return 0
                if args.raw:
                    line = {"file": mask(url), "index": i, "base64": base64.b64encode(record).decode("ascii")}
                else:
                    try:
                        feats = decode_example(record)
                    except DecodeError as exc:
                        raise DecodeError(f"record is not a tf.train.Example ({exc})", record_index=i,
                                          url=mask(url), offset=reader.offset) from None
                    line = {k: _json_value(v) for k, v in feats.items()}
                print(json.dumps(line, ensure_ascii=False))
                n += 1
    return 0


def _total_bytes(urls: Sequence[str]) -> int | None:
    try:
        return sum(storage.size(u) for u in urls)
    except (OSError, ShardfeedError):
        return None


def cmd_count(args) -> int:
    urls = _record_files(args)
    compressed = any(tfr.normalize_compression(args.compression, u) for u in urls)
    total = None if compressed else _total_bytes(urls)
    counts = {}
    with progress_bar(total=total, unit="B", desc="count", disable=args.quiet) as bar:
        for url in urls:
            with tfr.TFRecordReader(url, compression=args.compression, verify_crc=not args.no_crc) as reader:
                before = 0
                for _ in reader:
                    if reader.stats.bytes - before >= 1 << 20:
                        bar.update(reader.stats.bytes - before)
                        before = reader.stats.bytes
                bar.update(reader.stats.bytes - before)
                counts[mask(url)] = reader.stats.records
    if args.json:
        print(json.dumps({"total": sum(counts.values()), "files": counts}))
    else:
        if args.per_file:
            for url, c in counts.items():
                print(f"{c}\t{url}")
        print(sum(counts.values()))
    return 0


def cmd_verify(args) -> int:
    urls = _record_files(args)
    compressed = any(tfr.normalize_compression(args.compression, u) for u in urls)
    total = None if compressed else _total_bytes(urls)
    stats = tfr.ReadStats()
    bad_files = 0
    with progress_bar(total=total, unit="B", desc="verify", disable=args.quiet) as bar:
        for url in urls:
            with tfr.TFRecordReader(url, compression=args.compression, on_corrupt="skip") as reader:
                before = 0
                for _ in reader:
                    if reader.stats.bytes - before >= 1 << 20:
                        bar.update(reader.stats.bytes - before)
                        before = reader.stats.bytes
                bar.update(reader.stats.bytes - before + reader.stats.skipped_bytes)
                if reader.stats.corrupt:
                    bad_files += 1
                stats.merge(reader.stats)
    report = {
        "files": len(urls),
        "records": stats.records,
        "corrupt_records": stats.skipped_records,
        "corrupt_bytes": stats.skipped_bytes,
        "errors": [{"file": mask(e.url), "offset": e.offset, "record": e.record_index, "check": e.check,
                    "detail": e.detail} for e in stats.corrupt],
    }
    if args.json:
        print(json.dumps(report))
    else:
        for e in stats.corrupt:
            print(f"CORRUPT {mask(e.url)} offset={e.offset} record={e.record_index} check={e.check!r}"
                  + (f" ({e.detail})" if e.detail else ""))
        verdict = "OK" if not stats.corrupt else f"CORRUPT ({bad_files} of {len(urls)} files)"
        print(f"{verdict}: {stats.records} good records in {len(urls)} files, "
              f"{stats.skipped_records} corrupt records ({stats.skipped_bytes} bytes)")
    return 1 if stats.corrupt else 0


def _count(low: int):
    """An argparse type: an int of at least ``low`` (a usage error otherwise, before any work)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {v}")
        return v
    return parse


def cmd_index(args) -> int:
    if not args.suffix:
        raise ValueError("--suffix must not be empty: the index file would be written over its shard")
    urls = _record_files(args)
    for url in progress_bar(urls, desc="index", unit="file", disable=args.quiet or len(urls) < 2):
        idx = build_index(url, (url + args.suffix))
        if not args.quiet:
            print(f"{len(idx)} records\t{mask(url + args.suffix)}")
    return 0


def cmd_inspect(args) -> int:
    from ..formats.inspect import feature_table, inspect_records  # noqa: PLC0415
    from .convert_cmd import inspect_output, is_converted_output  # noqa: PLC0415

    if len(args.urls) == 1 and is_converted_output(args.urls[0]):
        return inspect_output(args.urls[0], out=args.out, n=args.images, as_json=args.json, sample=args.sample)

    urls = _record_files(args)

    def sample() -> Iterator[bytes]:
        n = 0
        for url in urls:
            with tfr.TFRecordReader(url, compression=args.compression) as reader:
                for record in reader:
                    yield record
                    n += 1
                    if n >= args.sample:
                        return

    report = inspect_records(sample())
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{report['records']} records sampled from {len(urls)} file(s)")
    for line in feature_table(report):
        print(line)
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo  # noqa: PLC0415

    return run_demo(args.out, images=args.images, epochs=args.epochs, seed=args.seed, step_ms=args.step_ms)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardfeed", description="Read, check and convert TFRecord data on any storage.")
    p.add_argument("--version", action=_VersionAction, help="print the version and the active parsing path")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="-v: shardfeed's debug details (retries, skipped data); -vv: every library's too. "
                        "Secrets (signatures, tokens, passwords) are masked in every line either way")
    sub = p.add_subparsers(dest="command", required=True)

    def files(sp):
        sp.add_argument("urls", nargs="+", help="files, globs or directories on any storage (s3://, oss://, ...)")
        sp.add_argument("--compression", default="auto", help="auto (by extension), none, GZIP or ZLIB")
        sp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
        return sp

    sp = files(sub.add_parser("head", help="print the first N records decoded, as JSON lines"))
    sp.add_argument("-n", type=_count(0), default=5, help="how many records (default 5)")
    sp.add_argument("--raw", action="store_true", help="print records as base64 instead of decoding them")
    sp.set_defaults(func=cmd_head)

    sp = files(sub.add_parser("count", help="count the records"))
    sp.add_argument("--per-file", action="store_true", help="a count per file too")
    sp.add_argument("--no-crc", action="store_true", help="skip CRC checks (faster)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_count)

    sp = files(sub.add_parser("verify", help="check every CRC; list corrupt records; exit 1 on corruption"))
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_verify)

    sp = files(sub.add_parser("index", help="write an index file (offset length per record) beside each file"))
    sp.add_argument("--suffix", default=".idx", help="index file suffix (default .idx)")
    sp.set_defaults(func=cmd_index)

    sp = files(sub.add_parser("inspect", help="feature names, kinds and lengths seen in a sample; for a converted "
                                              "folder (shardfeed's or TFRecorder's), sample images with boxes and "
                                              "masks drawn, and a CSV"))
    sp.add_argument("--sample", type=_count(1), default=1000, help="records to sample (default 1000)")
    sp.add_argument("--out", default="inspect-out", help="for a converted folder: where sample images and "
                                                         "samples.csv go (default ./inspect-out)")
    sp.add_argument("--images", type=_count(0), default=8, help="for a converted folder: sample images to draw")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_inspect)

    from .bench_cmd import register as register_bench  # noqa: PLC0415
    from .convert_cmd import register as register_convert  # noqa: PLC0415
    from .queue_cmd import register as register_queue  # noqa: PLC0415

    register_convert(sub)
    register_queue(sub)
    register_bench(sub)

    sp = sub.add_parser("demo", help="draw a labeled image set, convert it to shards, train on it through the "
                                      "pipeline from a WorkQueue, compare with naive feeding")
    sp.add_argument("--out", default="demo-out", help="output directory (default ./demo-out)")
    sp.add_argument("--images", type=_count(1), default=2000, help="images to draw (default 2000)")
    sp.add_argument("--epochs", type=_count(1), default=6, help="training epochs (default 6)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--step-ms", type=float, default=25.0,
                    help="simulated accelerator time per batch of 32, the host CPU free meanwhile (default 25)")
    sp.set_defaults(func=cmd_demo)
    return p


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"shardfeed {__version__} ({_native_line()})")
        parser.exit()


def _native_line() -> str:
    try:
        from ..formats.native import native_info  # noqa: PLC0415

        return native_info()
    except Exception as exc:  # noqa: BLE001 - --version must always answer
        return f"pure-python ({type(exc).__name__})"


class RedactingFilter(logging.Filter):
    """Masks secrets (signed query parameters, passwords, registered keys and tokens) in
    every record a handler emits, whichever library logged it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is the library's; keep the line
            return True
        masked = mask(message)
        if masked != message or record.args:
            record.msg, record.args = masked, ()
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_info, record.exc_text = None, mask(text)
        return True


def configure_logging(verbosity: int) -> None:
    """The CLI's logging: warnings by default; ``-v`` debug lines from shardfeed; ``-vv``
    from every library (botocore, fsspec, aiohttp, ...). A :class:`RedactingFilter` on
    the handler masks secrets in all of them."""
    root = logging.getLogger()
    if not root.handlers:  # as logging.basicConfig: a host that set up logging keeps its own
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    for h in root.handlers:
        if not any(isinstance(f, RedactingFilter) for f in h.filters):
            h.addFilter(RedactingFilter())
    if verbosity >= 2:
        root.setLevel(logging.DEBUG)
    if verbosity >= 1:
        logging.getLogger("shardfeed").setLevel(logging.DEBUG)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    if getattr(args, "compression", None) and str(args.compression).lower() == "none":
        args.compression = None
    try:
        return args.func(args)
    except BrokenPipeError:  # `shardfeed head ... | head -1`
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (CorruptRecordError, DecodeError, FileNotFoundError, PermissionError, IsADirectoryError,
            ShardfeedError, ValueError, ImportError, OSError) as exc:
        print(f"shardfeed {args.command}: error: {mask(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
