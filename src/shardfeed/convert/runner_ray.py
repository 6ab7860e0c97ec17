"""The Ray runner: the same plan, shards and records as the local runner, each pending shard
converted and written by one Ray task on whichever node has a CPU.

The driver plans as for the local runner (the rows, the split rule, the shard assignment);
the plan is put into Ray's object store once, without its rows, and each task gets its own
shard's rows, converts them (reading the images itself) and commits the shard the way every
runner does: the shard file appears whole (a hidden temporary file renamed into place, or
one upload), then its state file. A task whose worker dies (SIGKILL, an OOM kill, a lost
node) is retried by Ray (``max_retries``): it writes the same shard again from the start, so
the output never holds a partial shard or a row twice. The driver then checks every
shard's state file and writes the manifest.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from ..progress import progress_bar
from ..registry import require
from .plan import Plan, Shard
from .runner_local import pending_shards
from .tasks import make_converter
from .writer import ShardSink, convert_rows, finished_state, remove_staging

logger = logging.getLogger(__name__)

DEFAULT_MAX_RETRIES = 3
"""Times Ray runs a shard's task again after its worker died."""


def write_shard(plan: Plan, shard: Shard, output_dir: str, storage_options: Mapping[str, Any] | None
                ) -> tuple[str, dict[str, Any]]:
    """Convert ``shard``'s rows and commit the shard (what one task runs); returns its name
    and state."""
    converter = make_converter(plan.context(storage_options), plan.has_image)
    sink = ShardSink(plan, shard, output_dir, storage_options)
    try:
        sink.add_framed(shard.rows, convert_rows(converter, shard.rows))
    except BaseException:
        sink.abort()
        raise
    return plan.shard_name(shard), sink.commit()


def run_ray(plan: Plan, output_dir: str, storage_options: Mapping[str, Any] | None = None, resume: bool = False,
            progress: bool = True, max_retries: int = DEFAULT_MAX_RETRIES,
            ray_remote_args: Mapping[str, Any] | None = None) -> dict[str, dict]:
    """Write every pending shard of ``plan`` in Ray tasks (on the cluster ``ray.init`` joined,
    or a local one Ray starts); returns all shards' states by name. ``ray_remote_args`` are
    the tasks' resources (``{"num_cpus": 2, "memory": ...}``)."""
    ray = require("ray", extra="ray", what="runner='ray'")
    todo, states = pending_shards(plan, output_dir, storage_options, resume)
    if not todo:
        return states
    shipped = ray.put(dataclasses.replace(plan, shards=[Shard(s.split, s.index, s.count, []) for s in plan.shards],
                                          discards=[]))
    task = ray.remote(max_retries=max_retries, retry_exceptions=False, **dict(ray_remote_args or {}))(write_shard)
    pending = {task.remote(shipped, shard, output_dir, storage_options): plan.shard_name(shard) for shard in todo}
    written: dict[str, dict] = {}
    with progress_bar(total=len(todo), unit="shard", desc="ray", disable=not progress) as bar:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                pending.pop(ref)
                name, state = ray.get(ref)  # a task's own error (after its retries) raises here
                written[name] = state
                bar.update(1)
    for shard in todo:
        name = plan.shard_name(shard)
        st = finished_state(plan, shard, output_dir, storage_options)
        if st is None or name not in written:
            raise RuntimeError(f"the Ray tasks finished but shard {name} was not written")
        states[name] = st
    removed = remove_staging(plan, output_dir, storage_options)
    if removed:
        logger.info("removed %d staging file(s) of task attempts whose worker died", removed)
    return states
