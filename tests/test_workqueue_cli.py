"""`shardfeed queue status|drain|reset|list`, and the TensorBoard summary."""

from __future__ import annotations

import json

import pytest

from shardfeed.cli import queue_cmd
from shardfeed.distributed import WorkQueue

WORKS = [f"memory://w/{i}.tfrecord" for i in range(5)]


def test_status_drain_reset_list(tmp_path, capsys):
    backend = f"sqlite://{tmp_path}/q.db"
    q = WorkQueue(WORKS, num_epochs=2, backend=backend, name="train", worker_id="w1")
    q.ack(q.take())
    q.release(q.take())  # given back: its next take is a re-delivery
    q.take()
    assert queue_cmd.main(["status", "--backend", backend, "--name", "train", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert (m["pending"], m["in_flight"], m["done"], m["remaining"], m["redelivered"]) == (3, 1, 1, 8, 1)
    assert queue_cmd.main(["status", "--backend", backend, "--name", "train"]) == 0
    out = capsys.readouterr().out
    assert "pending 3" in out and "worker w1" in out and "released 1  redelivered 1" in out
    assert queue_cmd.main(["list", "--backend", backend]) == 0
    assert capsys.readouterr().out.split() == ["train"]
    assert queue_cmd.main(["drain", "--backend", backend, "--name", "train"]) == 0
    assert "3 pending items dropped" in capsys.readouterr().out
    assert q.metrics()["remaining"] == 0
    assert queue_cmd.main(["reset", "--backend", backend, "--name", "train"]) == 0
    assert queue_cmd.main(["status", "--backend", backend, "--name", "train"]) == 1
    assert "no queue named" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["status", "--name", "train"], ["list"], ["drain", "--name", "train"],
                                     ["reset", "--name", "train"]])
def test_looking_at_a_missing_sqlite_queue_file_makes_nothing(tmp_path, capsys, command):
    """`queue status` and `queue list` on a mistyped path made its directory and an empty
    40 KB database (found from outside): now an error naming the path, nothing made."""
    backend = f"sqlite://{tmp_path}/no/such/q.db"
    assert queue_cmd.main([command[0], "--backend", backend, *command[1:]]) == 2
    assert "no SQLite queue file there" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_redis_password_masked_in_cli_errors(capsys):
    pytest.importorskip("redis")
    url = "redis://:hunter2-secret@127.0.0.1:1/0"  # nothing listens on port 1
    assert queue_cmd.main(["status", "--backend", url, "--name", "x"]) == 2
    err = capsys.readouterr().err
    assert "hunter2-secret" not in err and "***" in err


@pytest.mark.tf
def test_add_summary_writes_tensorboard_scalars(tmp_path):
    tf = pytest.importorskip("tensorflow")
    q = WorkQueue(WORKS, backend="memory://summary", name="s")
    q.ack(q.take())
    writer = tf.summary.create_file_writer(str(tmp_path))
    m = q.add_summary(step=3, writer=writer)
    writer.flush()
    assert m["done"] == 1
    events = list(tmp_path.glob("events.out.tfevents.*"))
    tags = {v.tag for e in tf.compat.v1.train.summary_iterator(str(events[0])) for v in e.summary.value}
    assert {"s/remaining", "s/in_flight", "s/done", "s/fraction_full"} <= tags


def test_sqlite_journal_for_shared_filesystems(tmp_path):
    from shardfeed.distributed import open_queue_backend

    b = open_queue_backend(f"sqlite://{tmp_path}/shared.db?journal=delete")
    assert b.url.endswith("?journal=delete")
    q = WorkQueue(WORKS, backend=b, name="j", shuffle=False)
    assert [str(x) for x in q] == WORKS
    with pytest.raises(ValueError, match="journal"):
        open_queue_backend(f"sqlite://{tmp_path}/x.db?journal=memory")


def _immutable(*paths):
    """Make ``paths`` unwritable even for root (``chattr +i``), or by mode for others; returns the undo."""
    import os
    import subprocess

    if os.geteuid() == 0:
        for p in paths:
            if subprocess.run(["chattr", "+i", str(p)], capture_output=True).returncode != 0:
                for q in paths:
                    subprocess.run(["chattr", "-i", str(q)], capture_output=True)
                pytest.skip("running as root on a filesystem without chattr +i: cannot make a file read-only")
        return lambda: [subprocess.run(["chattr", "-i", str(p)], check=True) for p in reversed(paths)]
    modes = [(p, p.stat().st_mode) for p in paths]
    for p in paths:
        p.chmod(0o555 if p.is_dir() else 0o444)
    return lambda: [p.chmod(m) for p, m in modes]


@pytest.mark.parametrize("folder_writable", [True, False])
def test_status_and_list_look_at_a_queue_file_this_user_cannot_write(tmp_path, capsys, folder_writable):
    """`queue status` on a queue file the operator may only read (another user's, a
    read-only filesystem) was an error: the open made the tables and checked it could
    write. Now status and list open it read-only and change nothing; drain, which writes,
    is still refused naming the file."""
    folder = tmp_path / "queues"
    folder.mkdir()
    path = folder / "q.db"
    backend = f"sqlite://{path}"
    q = WorkQueue(WORKS, num_epochs=2, backend=backend, name="train", worker_id="w1")
    q.ack(q.take())
    q.take()
    q.close()  # the last connection: SQLite checkpoints and removes the -wal and -shm files
    assert sorted(p.name for p in folder.iterdir()) == ["q.db"]
    before = path.read_bytes()
    undo = _immutable(path) if folder_writable else _immutable(path, folder)
    try:
        assert queue_cmd.main(["status", "--backend", backend, "--name", "train", "--json"]) == 0
        m = json.loads(capsys.readouterr().out)
        assert (m["items_per_epoch"], m["pending"], m["done"], m["remaining"]) == (5, 4, 1, 9)
        assert queue_cmd.main(["list", "--backend", backend]) == 0
        assert capsys.readouterr().out.split() == ["train"]
        assert queue_cmd.main(["drain", "--backend", backend, "--name", "train"]) == 2
        err = capsys.readouterr().err
        assert str(path) in err and ("read-only" in err if folder_writable else "writable?" in err)
    finally:
        undo()
    assert path.read_bytes() == before
