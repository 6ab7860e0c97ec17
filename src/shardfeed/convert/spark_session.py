"""The SparkSession a conversion runs in: the running one or one started here (its executors
importing this process's shardfeed, its JVMs set for short jobs), and the settings a
conversion changes on it for a while and restores after (:func:`session_conf`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
from collections.abc import Iterator, Mapping
from typing import Any


def _pyspark():
    try:
        import pyspark
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise ImportError("runner='spark' needs pyspark: pip install 'shardfeed[spark]'") from exc
    return pyspark, SparkSession


def is_spark_dataframe(obj: Any) -> bool:
    """Whether ``obj`` is a ``pyspark.sql.DataFrame`` (classic or Spark Connect), without importing pyspark."""
    return type(obj).__module__.startswith("pyspark.sql") and hasattr(obj, "rdd") and hasattr(obj, "columns")


def executor_pythonpath() -> str:
    """The driver's import path for the executors' Python workers: its ``PYTHONPATH`` and
    the ``sys.path`` entries outside the interpreter's own prefix (a source checkout, an
    editable install's ``src``), so executors import the same shardfeed and user converters."""
    prefixes = tuple(os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
    entries: list[str] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for p in sys.path:
        full = os.path.realpath(p or os.getcwd())
        if os.path.exists(full) and not full.startswith(prefixes) and full not in entries:
            entries.append(full)
    return os.pathsep.join(entries)


_MASTER_FORMS = ("local", "local[", "local-cluster[", "spark://", "yarn", "k8s://", "mesos://")

# JVM options for the driver and executors of a session this module starts: a conversion is
# a few short Spark jobs whose JVM side (scheduling, reading the input, Arrow batches, the
# shuffle of paths or records) is small next to the Python workers' converting, and the
# JVMs' C2 JIT compiler spent more CPU than that work itself (on local-cluster[2,1,1024],
# the second conversion of 5,000 images: 1.9 s of the JVMs' 3.0 s of CPU in C1/C2
# compiler threads; with C1 only, 0.4 s of 1.3 s). Set as Spark's *default* Java options,
# so a user's ``spark.driver.extraJavaOptions`` / ``spark.executor.extraJavaOptions``
# (e.g. ``-XX:TieredStopAtLevel=4``) come after them and win. Only on a local master
# (``local[N]``, ``local-cluster[...]``), where the JVMs and the Python workers share one
# machine's cores and that was measured: on a cluster an executor converts for long, its
# JIT cost is paid once, and its admin's default Java options are not replaced.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


def _check_master(master: str) -> None:
    if not master.startswith(_MASTER_FORMS):
        raise ValueError(f"spark_master {master!r} is not a Spark master URL: local[N], local-cluster[N,cores,MB], "
                         "spark://host:port, yarn or k8s://https://host:port")
    if master.startswith("spark://"):
        for hostport in master[len("spark://"):].split(","):
            host, _, port = hostport.rpartition(":")
            try:
                socket.create_connection((host, int(port)), timeout=5).close()
            except (OSError, ValueError) as exc:
                raise RuntimeError(f"cannot reach the Spark master {master!r} at {hostport}: {exc}") from None


def session_settings(master: str, python: str) -> dict[str, str]:
    """The settings of a session :func:`spark_session` starts on ``master``: the executors'
    Python and import path, and on a local master the JIT of short jobs (:data:`JVM_OPTIONS`)."""
    settings = {"spark.pyspark.python": python, "spark.executorEnv.PYTHONPATH": executor_pythonpath(),
                "spark.ui.showConsoleProgress": "false"}
    if master.startswith("local"):
        settings["spark.driver.defaultJavaOptions"] = JVM_OPTIONS
        settings["spark.executor.defaultJavaOptions"] = JVM_OPTIONS
    return settings


def spark_session(master: str | None = None, app_name: str = "shardfeed-convert") -> Any:
    """The ``SparkSession`` to convert with: the running one (``spark-submit``, Databricks,
    a notebook) when ``master`` is None or names it, else a new one on ``master``
    (default ``local[*]``) whose executors run this interpreter with this process's import
    path (``spark.executorEnv.PYTHONPATH``, see :func:`executor_pythonpath`) and, on a local
    master, the JIT settings of short jobs (:data:`JVM_OPTIONS`, as Spark's default Java
    options of the driver and the executors; ``spark.driver.extraJavaOptions`` /
    ``spark.executor.extraJavaOptions``, which the JVMs read after them, override them).

    Raises ``ImportError`` without pyspark, ``RuntimeError`` naming the cause when Java is
    missing or Spark does not start on ``master`` (a wrong URL, an unreachable master),
    ``ValueError`` when another session on another master is running in this process.
    """
    pyspark, SparkSession = _pyspark()
    active = SparkSession.getActiveSession()
    if active is None:
        inst = getattr(SparkSession, "_instantiatedSession", None)
        if inst is not None and getattr(inst.sparkContext, "_jsc", None) is not None:
            active = inst
    if active is not None:
        if master is None or active.sparkContext.master == master:
            return active
        raise ValueError(f"a SparkSession on master {active.sparkContext.master!r} is running in this process; "
                         f"Spark allows one, so spark_master={master!r} cannot start another: leave spark_master "
                         "out to use the running one, or stop it first")
    master = master or "local[*]"
    _check_master(master)
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        raise RuntimeError("runner='spark' needs Java 17 or newer (Spark runs in a JVM) and found none on PATH "
                           "nor JAVA_HOME: install it (Debian/Ubuntu: apt-get install default-jre-headless; "
                           "scripts/system-deps.sh test does) or set JAVA_HOME")
    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    # pyspark starts the executors' Python workers with PYSPARK_PYTHON (default: python3 on PATH)
    python = os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in session_settings(master, python).items():
        builder = builder.config(key, value)
    try:
        return builder.getOrCreate()
    except Exception as exc:
        msg = str(exc).strip().splitlines()
        raise RuntimeError(f"Spark did not start on master {master!r}: {type(exc).__name__}: "
                           f"{' '.join(msg[:3])[:400]}") from exc


# -- settings a conversion sets on the session for a while -------------------------------------------------------------

OPEN_COST = "spark.sql.files.openCostInBytes"
MIN_SPLIT_BYTES = 128 << 10  # job 1 splits an input file no finer than this


def byte_size(text: str) -> int:
    """Bytes of a Spark size setting: ``"4194304"``, ``"4MB"``, ``"128k"``..."""
    t = text.strip().lower().rstrip("b")
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}.get(t[-1:], 1)
    return int(t[:-1] if scale > 1 else t or "0") * scale


ADAPTIVE = "spark.sql.adaptive.enabled"


@contextlib.contextmanager
def session_conf(spark: Any, settings: Mapping[str, str]) -> Iterator[None]:
    """Within: the session's SQL ``settings`` set, each restored after (unset where it was
    unset). A setting the session does not let us read or change is left as it is."""
    old: dict[str, str | None] = {}
    try:
        for key, value in settings.items():
            try:
                was = spark.conf.get(key, None)
                spark.conf.set(key, value)
            except Exception:  # a session that refuses it (a locked conf): leave it as it is
                continue
            old[key] = was
        yield
    finally:
        for key, was in old.items():
            if was is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, was)


@contextlib.contextmanager
def small_input_splits(spark: Any) -> Iterator[None]:
    """Within: Spark splits input files for job 1 into about as many partitions as the
    cluster has cores, down to :data:`MIN_SPLIT_BYTES` a split, restoring the session's
    setting after (:func:`session_conf`).

    Spark cuts files into splits of ``min(maxPartitionBytes, max(openCostInBytes,
    (bytes + files * openCostInBytes) / cores))``: with the default 4 MiB
    ``openCostInBytes`` a file under 4 MiB is one split, so a 20,000-row CSV was one job-1
    task on one core while the others waited. Lowering ``openCostInBytes`` for the read
    lets the bytes-per-core term decide (large inputs keep their ``maxPartitionBytes``
    splits). The splits are fixed when the scan is planned (in ``persist``), so a lost
    cached partition is re-read from the same byte range after the setting is restored:
    the same rows in the same order."""
    try:
        old = spark.conf.get(OPEN_COST)
        lower = old is None or byte_size(old) > MIN_SPLIT_BYTES
    except Exception:  # a session whose conf cannot be read or parsed: leave it as it is
        lower = False
    with session_conf(spark, {OPEN_COST: str(MIN_SPLIT_BYTES)} if lower else {}):
        yield
