"""A rank started by ``torch.multiprocessing.spawn`` in test_record_source (not a test module)."""

from __future__ import annotations

import json
import os


def run_rank(rank: int, world: int, port: int, files: list[str], out_dir: str) -> None:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import shardfeed as sf

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        spec = {"id": sf.FixedLen("int64")}
        ds = sf.read_tfrecord(files, spec=spec).batch(4).to_torch()  # rank and world from torch.distributed
        loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
        ids = [v for b in loader for v in b["id"].tolist()]
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(ids, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
