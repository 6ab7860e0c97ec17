"""Where a Spark conversion's CPU goes: per process and per JVM thread, conversion by
conversion, in one SparkSession.

Converts the same ``--images`` JPEGs (``convert_spark.py``'s input) ``--rounds`` times with
``runner="spark"`` on ``--master`` and reads, from ``/proc``, the CPU seconds each process
of the session (this driver, the driver JVM, the executor JVMs, their Python workers) and
each JVM thread, grouped by name (``C2 CompilerThre``, ``Executor task launch``, ``G1
Conc``...), spent during each conversion. Round 1 is the one ``convert_spark.py`` times
(the second conversion in a session); round 0 starts the executors' Python workers. Linux
only (``/proc``). A diagnostic, not part of ``shardfeed bench``'s suite (no anchor to compare
against: run it from two checkouts to compare code).

Usage::

    python benchmarks/_spark_cpu_split.py [--images 5000] [--rounds 4] [--master local-cluster[2,1,1024]]
                                         [--json bench-out/spark_cpu_split.json]

Extra JVM options for a run (to compare, e.g. ``-XX:TieredStopAtLevel=4``): a
``spark-defaults.conf`` with ``spark.driver.extraJavaOptions`` and
``spark.executor.extraJavaOptions`` in a folder named by ``SPARK_CONF_DIR``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
if os.path.isdir(SRC):
    sys.path.insert(0, SRC)
sys.path.insert(0, HERE)

from convert_spark import make_images  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
KINDS = (("CoarseGrainedExecutorBackend", "executor JVMs"), ("SparkSubmit", "driver JVM"),
         ("pyspark.daemon", "Python workers"))


def _stat_cpu(path: str) -> tuple[int, float, str]:
    """(parent pid, CPU seconds, name) of a /proc stat file."""
    text = open(path).read()
    name = text[text.index("(") + 1:text.rindex(")")]
    f = text.rsplit(")", 1)[1].split()
    return int(f[1]), (int(f[11]) + int(f[12])) / TICK, name


def session_processes() -> dict[int, tuple[str, float]]:
    """pid -> (kind, CPU seconds) of this process and its descendants."""
    procs: dict[int, tuple[int, float, str]] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                ppid, cpu, _ = _stat_cpu(f"/proc/{p}/stat")
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    cmd = f.read().decode(errors="replace")
            except (OSError, ValueError):
                continue
            procs[int(p)] = (ppid, cpu, cmd)
    mine, grew = {os.getpid()}, True
    while grew:
        grew = False
        for p, (ppid, _, _) in procs.items():
            if ppid in mine and p not in mine:
                mine.add(p)
                grew = True
    out = {}
    for p in mine:
        if p in procs:
            cmd = procs[p][2]
            kind = next((k for key, k in KINDS if key in cmd), "Python driver" if p == os.getpid() else "other")
            out[p] = (kind, procs[p][1])
    return out


def jvm_threads(pids: list[int]) -> dict[tuple[int, int], tuple[str, float]]:
    """(pid, tid) -> (thread name without its number, CPU seconds) of the JVMs ``pids``."""
    out = {}
    for p in pids:
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tids:
            try:
                _, cpu, name = _stat_cpu(f"/proc/{p}/task/{t}/stat")
            except (OSError, ValueError):
                continue
            out[(p, int(t))] = (re.sub(r"[0-9#-]+$", "", name).strip(), cpu)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--master", default="local-cluster[2,1,1024]")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardfeed-bench-convert-spark"))
    ap.add_argument("--json", default=os.path.join("bench-out", "spark_cpu_split.json"))
    args = ap.parse_args(argv)
    from shardfeed.convert import api as sc
    from shardfeed.convert.runner_spark import spark_session

    os.makedirs(args.dir, exist_ok=True)
    inp = make_images(args.dir, args.images)
    spark = spark_session(args.master)
    java = spark.sparkContext.getConf().get("spark.driver.defaultJavaOptions", None)
    opts = {"max_image_size": 128, "test_ratio": 0.1, "num_samples_per_tfrecord": 64, "progress": False}
    out_base = tempfile.mkdtemp(prefix="spark-cpu-")
    rounds = []
    try:
        for r in range(args.rounds):
            jvms = [p for p, (kind, _) in session_processes().items() if kind in ("executor JVMs", "driver JVM")]
            threads0, procs0 = jvm_threads(jvms), session_processes()
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            sc.convert(inp, os.path.join(out_base, str(r)), runner="spark", **opts)
            wall = time.perf_counter() - t0
            procs1, threads1 = session_processes(), jvm_threads(jvms)
            by_kind: collections.Counter[str] = collections.Counter()
            for p, (kind, cpu) in procs1.items():
                by_kind[kind] += cpu - procs0.get(p, (kind, 0.0))[1]
            by_thread: collections.Counter[str] = collections.Counter()
            for key, (name, cpu) in threads1.items():
                by_thread[name] += cpu - threads0.get(key, (name, 0.0))[1]
            rounds.append({"round": r, "wall_s": wall, "load": load, "cpu_s": sum(by_kind.values()),
                           "cpu_by_process": dict(by_kind), "jvm_cpu_by_thread": dict(by_thread.most_common(10))})
            print(f"round {r}: {wall:.2f} s wall, {sum(by_kind.values()):.2f} s CPU (load {load:.1f}): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in by_kind.most_common()), flush=True)
            print("    JVM threads: " + ", ".join(f"{k} {v:.2f}" for k, v in by_thread.most_common(8)), flush=True)
    finally:
        spark.stop()
        shutil.rmtree(out_base, ignore_errors=True)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"master": args.master, "images": args.images, "driver_default_java_options": java,
                   "rounds": rounds}, f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
