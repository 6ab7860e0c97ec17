"""SELF_DEFINED converters for the Spark runner's tests, importable by executors: one that,
on one chosen row, kills its own executor's JVM (once, across attempts), as a lost machine
would, mid-shard; one that is slow, for a test to kill an executor from outside mid-job."""

from __future__ import annotations

import os
import signal
import time

from shardfeed.formats.spec import FixedLen


def executor_jvm_pid() -> int | None:
    """The pid of the executor JVM above this Python worker (its cmdline names
    CoarseGrainedExecutorBackend), or None."""
    pid = os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            return None
        if b"CoarseGrainedExecutorBackend" in cmd:
            return pid
        pid = ppid
    return None


class KillingConverter:
    """``image/encoded`` and ``label`` of a row; on row ``kill_row`` the first attempt writes
    the executor's pid to ``marker`` and SIGKILLs that executor."""

    def __init__(self, options):
        self.marker = options["marker"]
        self.kill_row = int(options["kill_row"])

    def feature_spec(self):
        return {"image/encoded": FixedLen("bytes"), "image/source_id": FixedLen("bytes"), "label": FixedLen("bytes")}

    def convert(self, row, context):
        img = context.image(row, row.split)  # a corrupt image raises Discard, as for any converter
        if row.number == self.kill_row:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                fd = None
            if fd is not None:
                pid = executor_jvm_pid()
                os.write(fd, str(pid).encode())
                os.close(fd)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    os._exit(1)
        return {"image/encoded": img.data, "image/source_id": row.image_uri, "label": str(row.label)}


class SlowConverter:
    """``image/encoded``, ``image/source_id`` and ``label`` of a row, after sleeping
    ``sleep`` seconds: a write task that lasts long enough to lose its executor mid-job."""

    def __init__(self, options):
        self.sleep = float(options["sleep"])

    def feature_spec(self):
        return {"image/encoded": FixedLen("bytes"), "image/source_id": FixedLen("bytes"), "label": FixedLen("bytes")}

    def convert(self, row, context):
        time.sleep(self.sleep)
        img = context.image(row, row.split)
        return {"image/encoded": img.data, "image/source_id": row.image_uri, "label": str(row.label)}


def executor_jvms(driver_pid: int) -> list[int]:
    """Pids of the executor JVMs a ``local-cluster`` driver JVM started (its children whose
    cmdline names CoarseGrainedExecutorBackend)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if ppid == driver_pid and b"CoarseGrainedExecutorBackend" in cmd:
            found.append(int(name))
    return sorted(found)
