"""``shardfeed queue status|drain|reset|list --backend URL --name NAME``: look at and manage
work queues without knowing their works (the backend holds them)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import ShardfeedError
from ..storage.urls import mask


def _open(args: argparse.Namespace, read_only: bool = False) -> Any:
    """The backend ``--backend`` names; ``read_only``: a SQLite file is only looked at (opened
    read-only, so a file this user may not write can still be looked at)."""
    import os  # noqa: PLC0415

    from ..distributed.backend import default_backend_url, open_queue_backend, sqlite_file_of  # noqa: PLC0415

    url = os.fspath(args.backend) if args.backend is not None else default_backend_url()
    path = sqlite_file_of(url)
    if path is not None and not os.path.exists(path):  # looking at a queue never makes its file
        raise FileNotFoundError(f"{path}: no SQLite queue file there (check --backend)")
    return open_queue_backend(url, read_only=read_only)


def _status(args: argparse.Namespace) -> int:
    from ..distributed.workqueue import summarize  # noqa: PLC0415

    backend = _open(args, read_only=True)
    try:
        meta, snap = backend.get_meta(args.name), backend.snapshot(args.name)
        if meta is None or snap is None:
            print(f"shardfeed queue status: no queue named {args.name!r} on {backend.url}", file=sys.stderr)
            return 1
        m = summarize(meta, snap, args.name)
    finally:
        backend.close()
    if args.json:
        print(json.dumps(m, sort_keys=True))
        return 0
    total = "forever" if m["num_epochs"] is None else m["num_epochs"]
    print(f"queue {args.name!r} on {mask(backend.url)}: {m['items_per_epoch']} items per epoch, epoch "
          f"{m['epoch']} of {total}{' (drained)' if m['drained'] else ''}")
    print(f"  pending {m['pending']}  in flight {m['in_flight']}  done {m['done']}  remaining {m['remaining']}  "
          f"fraction full {m['fraction_full']:.2f}")
    print(f"  lease expiries {m['expired']}  late acks refused {m['late_acks']}  released {m['released']}  "
          f"redelivered {m['redelivered']}")
    for w, st in sorted(m["workers"].items()):
        rate = "-" if st["items_per_s"] is None else f"{st['items_per_s']:.2f}/s"
        print(f"  worker {w}: taken {st['taken']}  acked {st['acked']}  in flight {st['in_flight']}  {rate}")
    return 0


def _drain(args: argparse.Namespace) -> int:
    backend = _open(args)
    try:
        n = backend.drain(args.name)
    except KeyError as exc:
        print(f"shardfeed queue drain: {exc.args[0]}", file=sys.stderr)
        return 1
    finally:
        backend.close()
    print(f"drained queue {args.name!r}: {n} pending items dropped; leased items finish as they are")
    return 0


def _reset(args: argparse.Namespace) -> int:
    backend = _open(args)
    try:
        existed = backend.reset(args.name)
    finally:
        backend.close()
    print(f"queue {args.name!r} {'deleted' if existed else 'did not exist'} on {mask(backend.url)}")
    return 0


def _list(args: argparse.Namespace) -> int:
    backend = _open(args, read_only=True)
    try:
        for name in backend.names():
            print(name)
    finally:
        backend.close()
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``queue`` and its subcommands to the ``shardfeed`` parser's subparsers."""
    p = subparsers.add_parser("queue", help="status, drain or reset a work queue")
    sub = p.add_subparsers(dest="queue_command", required=True)

    def common(sp: argparse.ArgumentParser, name: bool = True) -> argparse.ArgumentParser:
        sp.add_argument("--backend", default=None,
                        help="memory, sqlite:///path.db or redis://host:port/db (default: "
                             "$SHARDFEED_WORKQUEUE_BACKEND or the SQLite file under ~/.cache/shardfeed)")
        if name:
            sp.add_argument("--name", default="work_queue", help="queue name (default: work_queue)")
        return sp

    sp = common(sub.add_parser("status", help="items pending, in flight, done; per-worker throughput"))
    sp.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    sp.set_defaults(func=_status)
    common(sub.add_parser("drain", help="drop pending items and epochs not started (workers finish)")) \
        .set_defaults(func=_drain)
    common(sub.add_parser("reset", help="delete the queue and all progress")).set_defaults(func=_reset)
    common(sub.add_parser("list", help="names of the queues on the backend"), name=False).set_defaults(func=_list)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``queue`` alone (``python -m shardfeed.cli.queue_cmd status --name ...``)."""
    parser = argparse.ArgumentParser(prog="shardfeed")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["queue", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except (ShardfeedError, ValueError, ImportError, OSError) as exc:
        print(f"shardfeed queue: error: {mask(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
