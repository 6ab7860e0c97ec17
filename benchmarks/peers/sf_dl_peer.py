"""shardfeed through PyTorch's own DataLoader workers, as users write it:
``DataLoader(ds.to_torch(), batch_size=None, num_workers=2)`` (each worker reads its share
of the spans; batches cross PyTorch's worker queue). Only (g) and (h), on shardfeed's
copy of the data (the ``shardfeed`` peer, always in the plan, writes it first)."""

from __future__ import annotations

import os
from typing import Any

import sf_peer
from common import Ctx

IMPORTS = sf_peer.IMPORTS
NAME = "shardfeed"  # reads shardfeed's copy of the data
available = sf_peer.available
version = sf_peer.version


def supports() -> dict[str, str | None]:
    out: dict[str, str | None] = dict.fromkeys("abcdef", "the DataLoader-workers form only: (g), (h)")
    out["g"] = out["h"] = sf_peer.supports()["g"]
    return out


def prepare(data: str, ctx: Ctx, out: str) -> None:
    """Nothing to write (an empty folder for the runner's marker): the epochs read the
    ``shardfeed`` peer's copy."""
    os.makedirs(out, exist_ok=True)


def epoch_fn(workload: str, ctx: Any) -> Any:
    sf_peer.FORM = "dataloader"
    return sf_peer.epoch_fn(workload, ctx)
