"""TableRecordReader edges found from outside: an input is named by its value (a table URL
built anew for each call reads on and ends; it started over forever), and read-ahead
threads left running by a reader not closed no longer abort the interpreter at exit."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import shardfeed as sf

duckdb = pytest.importorskip("duckdb")


def _csv(path, rows):
    path.write_text("itemid,name\n" + "".join(f"{i},n{i}\n" for i in range(rows)))
    return str(path)


def _rows(reader, url_of_call, limit=20):
    """``read`` until ``EOFError`` (the rows' values, then ``"EOF"``), each call given
    ``url_of_call()``; stops after ``limit`` rows."""
    out = []
    while len(out) < limit:
        try:
            out.append(reader.read(url_of_call())[1])
        except EOFError:
            return out + ["EOF"]
    return out


# -- F2: an equal URL string reads on ---------------------------------------------------------------
def test_read_of_an_equal_table_url_built_for_each_call_reads_on_and_ends(tmp_path):
    _csv(tmp_path / "t.csv", 5)
    d = str(tmp_path)
    want = [f"{i},n{i}" for i in range(5)] + ["EOF"]
    # os.path.join, an f-string, a pathlib.Path: a new object for each call, the same table
    assert _rows(sf.TableRecordReader(), lambda: os.path.join(d, "t.csv")) == want
    assert _rows(sf.TableRecordReader(), lambda: f"{d}/t.csv") == want
    assert _rows(sf.TableRecordReader(), lambda: pathlib.Path(d) / "t.csv") == want
    reader = sf.TableRecordReader()
    got = [reader.read_up_to(os.path.join(d, "t.csv"), 2)[1].tolist() for _ in range(4)]
    assert got == [["0,n0", "1,n1"], ["2,n2", "3,n3"], ["4,n4"], []]
    with pytest.raises(EOFError):
        reader.read(os.path.join(d, "t.csv"))  # and after the end, still the end
    reader.close()


def test_an_equal_list_of_tables_built_for_each_call_reads_on(tmp_path):
    path = tmp_path / "t.db"
    con = duckdb.connect(str(path))
    for name, lo in (("a", 0), ("b", 100)):
        con.execute(f"CREATE TABLE {name} AS SELECT range AS id FROM range({lo}, {lo + 3})")
    con.close()
    with sf.TableRecordReader(num_threads=2) as reader:
        got = _rows(reader, lambda: [f"duckdb://{path}/{t}" for t in ("a", "b")])
        assert got == ["0", "1", "2", "100", "101", "102", "EOF"]
        # a tuple of the same URLs is the same input: at its end too
        assert reader.read_up_to((f"duckdb://{path}/a", f"duckdb://{path}/b"), 5)[1].tolist() == []


def test_a_different_table_has_its_own_place_and_the_first_keeps_its_own(tmp_path):
    a, b = _csv(tmp_path / "a.csv", 3), _csv(tmp_path / "b.csv", 3)
    reader = sf.TableRecordReader()
    order = [a, b, a, "list", b, a, "list", a]
    got = []
    for which in order:
        source = [str(a), str(b)] if which == "list" else str(pathlib.Path(which))  # new objects each time
        try:
            key, value = reader.read(source)
            got.append(f"{os.path.basename(key.rsplit(':', 1)[0])}:{value}")
        except EOFError:
            got.append("EOF")
    assert got == ["a.csv:0,n0", "b.csv:0,n0", "a.csv:1,n1", "a.csv:0,n0", "b.csv:1,n1", "a.csv:2,n2",
                   "a.csv:1,n1", "EOF"]
    reader.close()


# -- F3: a reader not closed at interpreter exit --------------------------------------------------
_CHILD = textwrap.dedent('''
    import itertools, os, sys, time
    import pyarrow as pa
    import shardfeed as sf
    from shardfeed.tables import record_reader as rr

    d = sys.argv[1]
    real_open = rr.open_table_backend


    class SlowTeardown:
        """Batches through a pyarrow RecordBatchReader whose source takes 0.3 s to let go
        (as a query's stream may): its C++ destructor is still running, in the reader's
        thread, when the main thread reaches exit. The teardown is the risky moment: a
        thread taking the GIL back in there after finalization began aborted the process."""

        def __init__(self, backend):
            self.b = backend

        def __getattr__(self, name):
            return getattr(self.b, name)

        def read(self, columns, start, stop, batch_rows):
            batches = self.b.read(columns, start, stop, batch_rows)
            first = next(batches)

            class Source:  # held by the C++ reader until it is destroyed
                def __init__(self):
                    self.it = itertools.chain([first], batches)

                def __iter__(self):
                    return self

                def __next__(self):
                    return next(self.it)

                def __del__(self):
                    end = time.monotonic() + 0.3
                    while time.monotonic() < end:
                        time.sleep(0.002)

            yield from pa.RecordBatchReader.from_batches(first.schema, Source())


    rr.open_table_backend = lambda turl, so=None: (SlowTeardown(real_open(turl, so)) if "slow" in turl.url
                                                   else real_open(turl, so))
    keep = []
    # mid-table, each left open, URLs built for each call as users write them: a small table
    # read ahead to its end (its teardown races the exit), the same behind a slow teardown,
    # a large one whose thread waits for room (stopped at exit, then torn down slowly), and
    # a list of two read two at a time
    for url, n, capacity in ((os.path.join(d, "small.csv"), 3, 0), (os.path.join(d, "slow_small.csv"), 3, 0),
                             (f"duckdb://{d}/t.db/slow", 3, 64)):
        r = sf.TableRecordReader(capacity=capacity)
        for _ in range(n):
            r.read(url)
        keep.append(r)
    r = sf.TableRecordReader(num_threads=2, capacity=128)
    r.read_up_to([f"duckdb://{d}/t.db/a", f"duckdb://{d}/t.db/b"], 10)
    keep.append(r)
    print("done", flush=True)
''')


@pytest.mark.timeout(120)
def test_readers_left_open_mid_table_do_not_abort_the_interpreter_at_exit(tmp_path):
    for name in ("small.csv", "slow_small.csv"):
        _csv(tmp_path / name, 10)
    con = duckdb.connect(str(tmp_path / "t.db"))
    for name in ("a", "slow"):
        con.execute(f"CREATE TABLE {name} AS SELECT range AS id, range * 0.5 AS price FROM range(0, 20000)")
    con.execute("CREATE TABLE b AS SELECT range AS id, range * 0.5 AS price FROM range(0, 10)")
    con.close()
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    failed = []
    for _ in range(10):
        p = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                           timeout=60)
        if p.returncode or "terminate called" in p.stderr or "done" not in p.stdout:
            failed.append((p.returncode, p.stderr.strip()[:200]))
    assert not failed, f"{len(failed)} of 10 runs: {failed[:2]}"
