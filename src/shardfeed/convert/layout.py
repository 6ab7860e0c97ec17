"""Where a conversion's outputs lie and what its manifest says of the records: the few
helpers both the writer and the readers of a converted output need (the readers without
importing any conversion code)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from ..formats.spec import FixedLen, VarLen


def join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name if "://" in base else base.rstrip("/\\") + "/" + name


def manifest_url(output_dir: str, prefix: str) -> str:
    return join(output_dir, f"{prefix}-manifest.json")


def spec_from_json(d: Mapping[str, Any]) -> dict[str, Any]:
    spec = {}
    for k, s in d.items():
        if s["kind"] == "VarLen":
            spec[k] = VarLen(s["dtype"])
        else:
            default = s.get("default")
            if isinstance(default, dict) and "base64" in default:
                default = base64.b64decode(default["base64"])
            spec[k] = FixedLen(s["dtype"], tuple(s.get("shape") or ()), default)
    return spec
