"""Summaries of what a sample of Example records holds, for ``shardfeed inspect``."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .example import decode_example
from .spec import FixedLen, VarLen


def _kind(v) -> str:
    if isinstance(v, np.ndarray):
        return "int64_list" if v.dtype == np.int64 else "float_list"
    return "bytes_list" if v else "empty"


def inspect_records(records: Iterable[bytes]) -> dict:
    """Feature names, kinds and value counts seen in ``records``, with a suggested spec per
    feature (``FixedLen`` when every record holds the same count, else ``VarLen``)."""
    n = 0
    seen: dict[str, dict] = {}
    for record in records:
        n += 1
        for name, value in decode_example(record).items():
            kind = _kind(value)
            f = seen.setdefault(name, {"kinds": set(), "lengths": []})
            if kind != "empty":
                f["kinds"].add(kind)
            f["lengths"].append(len(value))
    features = {}
    for name in sorted(seen):
        f = seen[name]
        lengths = np.array(f["lengths"], dtype=np.int64)
        kinds = sorted(f["kinds"]) or ["empty"]
        kind = kinds[0] if len(kinds) == 1 else "mixed:" + "+".join(kinds)
        dtype = {"int64_list": "int64", "float_list": "float32", "bytes_list": "bytes"}.get(kind)
        fixed = len(lengths) == n and lengths.min() == lengths.max()
        if dtype is None:
            suggested = "-"
        elif fixed:
            shape = "" if lengths[0] == 1 else f", shape=[{int(lengths[0])}]"
            suggested = f"FixedLen('{dtype}'{shape})"
        else:
            suggested = f"VarLen('{dtype}')"
        features[name] = {
            "kind": kind,
            "present": len(lengths) / n if n else 0.0,
            "min_len": int(lengths.min()),
            "max_len": int(lengths.max()),
            "mean_len": float(lengths.mean()),
            "suggested_spec": suggested,
        }
    return {"records": n, "features": features}


def spec_of(report: dict) -> dict:
    """The spec an :func:`inspect_records` report suggests, as ``FixedLen``/``VarLen``
    objects: ``FixedLen`` for a feature every sampled record holds with the same count,
    else ``VarLen``; features seen only empty or with mixed kinds are left out."""
    out = {}
    for name, f in report["features"].items():
        dtype = {"int64_list": "int64", "float_list": "float32", "bytes_list": "bytes"}.get(f["kind"])
        if dtype is None:
            continue
        if f["present"] == 1.0 and f["min_len"] == f["max_len"]:
            out[name] = FixedLen(dtype, shape=() if f["min_len"] == 1 else (f["min_len"],))
        else:
            out[name] = VarLen(dtype)
    return out


def feature_table(report: dict) -> list[str]:
    """The lines ``shardfeed inspect`` prints for an :func:`inspect_records` report."""
    lines = [f"{'feature':<32} {'kind':<11} {'present':>8} {'min':>6} {'max':>6} {'mean':>8}  suggested spec"]
    for name, f in report["features"].items():
        lines.append(f"{name:<32} {f['kind']:<11} {f['present']:>8.1%} {f['min_len']:>6} {f['max_len']:>6} "
                     f"{f['mean_len']:>8.2f}  {f['suggested_spec']}")
    return lines
