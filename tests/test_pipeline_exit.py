"""The end of a process with a pass still open: the interpreter's exit closes every pass
(its threads stopped and joined), and a daemon thread still reading one is left waiting
for the end, never handed an error at exit (found from outside)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_CHILD = textwrap.dedent('''
    import sys, threading, time
    import shardfeed as sf

    url = sys.argv[1]
    sf.write_records(url, [sf.encode_example({"id": i}) for i in range(10_000)])
    ds = sf.read_tfrecord(url, spec={"id": sf.FixedLen("int64")}).batch(64)
    ds = {"prefetch": ds.prefetch(2), "map": ds.map(lambda b: b, num_parallel_calls=2),
          "records": sf.read_tfrecord(url).shuffle(100, seed=1)}[sys.argv[2]].repeat()
    started = threading.Event()
    after = []

    def consume():
        for _ in ds:
            started.set()
        after.append("the loop ended")  # never at exit: the pass did not end
        print("AFTER THE LOOP", flush=True)

    threading.Thread(target=consume, daemon=True).start()
    started.wait()
    time.sleep(0.1)
    print("MAIN DONE", flush=True)
''')


@pytest.mark.parametrize("chain", ["prefetch", "map", "records"])
def test_a_daemon_thread_reading_a_pass_at_exit_is_neither_an_error_nor_an_end(tmp_path, chain):
    """Before: the exit closed the pass under the daemon thread, which died with
    IteratorClosedError: "Exception in thread ..." on stderr at the end of 8 runs in 10."""
    for run in range(4):
        p = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / f"a{run}.tfrecord"), chain],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        assert p.stdout.strip() == "MAIN DONE", p.stdout
        assert p.stderr.strip() == "", p.stderr[-2000:]
