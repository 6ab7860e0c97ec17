"""Which worker am I, of how many: ``slice_id`` / ``slice_count`` from the environment.

Looked up in order: arguments; ``torch.distributed`` when it is already imported and
initialized (never imported here); ``TF_CONFIG`` (chief first, then workers); environment
variables ``SLICE_ID``/``SLICE_COUNT``, ``RANK``/``WORLD_SIZE``, Open MPI, PMI (MPICH,
Intel MPI), Slurm; finally ``(0, 1)``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping

logger = logging.getLogger(__name__)

ENV_PAIRS = (
    ("SLICE_ID", "SLICE_COUNT"),
    ("RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
)


def _from_torch() -> tuple[int, int] | None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001 - a half-initialized backend: fall through to the environment
        logger.debug("torch.distributed present but not usable", exc_info=True)
    return None


def _from_tf_config(env: Mapping[str, str]) -> tuple[int, int] | None:
    raw = env.get("TF_CONFIG")
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
        cluster, task = cfg.get("cluster", {}), cfg.get("task", {})
        kind, index = task.get("type"), int(task.get("index", 0))
    except (ValueError, AttributeError, TypeError) as exc:
        raise ValueError(f"TF_CONFIG is not valid JSON with 'cluster' and 'task': {exc}") from None
    order = [t for t in ("chief", "master", "worker") if cluster.get(t)]
    if kind not in order:
        return None  # ps, evaluator: not a training reader; caller falls back
    rank = sum(len(cluster[t]) for t in order[: order.index(kind)]) + index
    return rank, sum(len(cluster[t]) for t in order)


def _from_env(env: Mapping[str, str]) -> tuple[int, int] | None:
    for rk, sk in ENV_PAIRS:
        if rk in env and sk in env:
            try:
                return int(env[rk]), int(env[sk])
            except ValueError:
                raise ValueError(f"environment variables {rk}={env[rk]!r} and {sk}={env[sk]!r} must be ints") from None
    return None


def resolve_slice(slice_id: int | None = None, slice_count: int | None = None,
                  env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(slice_id, slice_count)``: the arguments when given, else found as the module says.

    Raises ``ValueError`` when only one of the two is given, or for an id outside
    ``0..slice_count-1``.
    """
    if (slice_id is None) != (slice_count is None):
        raise ValueError("give both slice_id and slice_count, or neither (then they are read from "
                         "torch.distributed, TF_CONFIG or RANK/WORLD_SIZE)")
    if slice_id is None:
        env = os.environ if env is None else env
        found = _from_torch() or _from_tf_config(env) or _from_env(env) or (0, 1)
        slice_id, slice_count = found
    for name, v in (("slice_id", slice_id), ("slice_count", slice_count)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {v!r}")
    if slice_count < 1 or not 0 <= slice_id < slice_count:
        raise ValueError(f"need 0 <= slice_id < slice_count, got slice_id={slice_id}, slice_count={slice_count}")
    return slice_id, slice_count
