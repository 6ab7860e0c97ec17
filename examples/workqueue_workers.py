"""Three worker processes share one WorkQueue (SQLite file); one is slow, so it takes less.

    python examples/workqueue_workers.py OUTDIR

Writes 6 small indexed TFRecord shards to OUTDIR, splits them into 24 record ranges
(num_slices), runs 3 workers (worker 0 is 3x slower) that read records through
``read_queue``, and prints how many items and records each one did, then the queue's metrics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import shardfeed as sf  # noqa: E402
from shardfeed.distributed import WorkQueue, read_queue  # noqa: E402


def queue(outdir: str, **kw) -> WorkQueue:
    works = sorted(os.path.join(outdir, n) for n in os.listdir(outdir) if n.endswith(".tfrecord"))
    return WorkQueue(works, num_epochs=1, shuffle=True, seed=42, num_slices=24, name="example",
                     backend=f"sqlite://{outdir}/queue.db", lease_timeout=10, **kw)


def worker(outdir: str, rank: int) -> None:
    q = queue(outdir, worker_id=f"worker-{rank}")
    n = 0
    for _record in read_queue(q):
        time.sleep(0.003 if rank == 0 else 0.001)  # the "training step"; worker 0 is slow
        n += 1
    print(json.dumps({"worker": rank, "records": n}))
    q.close()


def main(outdir: str) -> None:
    os.makedirs(outdir, exist_ok=True)
    total = 0
    for i in range(6):
        records = [sf.encode_example({"shard": [i], "row": [j]}) for j in range(50 + 10 * i)]
        sf.write_records(os.path.join(outdir, f"part-{i}.tfrecord"), records, index=True)
        total += len(records)
    q = queue(outdir)
    q.reset()  # a fresh run each time the example is started
    q = queue(outdir)
    print(f"{len(q)} items (record ranges) from 6 shards, {total} records, queue on {q.backend.url}")
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", outdir, str(r)], stdout=subprocess.PIPE,
                              text=True) for r in range(3)]
    done = 0
    for p in procs:
        out, _ = p.communicate(timeout=300)
        d = json.loads(out.strip().splitlines()[-1])
        done += d["records"]
        print(f"worker {d['worker']} read {d['records']} records")
    m = q.metrics()
    print(f"records read in all: {done} of {total}; items done {m['done']}, drained: {m['drained']}")
    for w, st in sorted(m["workers"].items()):
        print(f"  {w}: {st['acked']} items acknowledged")
    q.close()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit(__doc__)
