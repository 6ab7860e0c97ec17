"""Summaries of what a sample of Example records holds, for ``shardfeed inspect``."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from .example import decode_example


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
