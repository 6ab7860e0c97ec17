"""SQLite work-queue backend: processes on one host, or hosts sharing a filesystem.

Every operation is one ``BEGIN IMMEDIATE`` transaction, so concurrent takers are
serialized by SQLite's file lock. The journal is WAL by default (about 0.5 ms per take and
acknowledgement here, against 20 ms with the rollback journal's fsyncs); WAL needs shared
memory, which a network filesystem does not give, so for a file that hosts share give
``sqlite:///shared/queue.db?journal=delete``. Each thread (and each process after a fork)
opens its own connection.

A take or an acknowledgement costs the same however many items the queue holds: each
statement finds its rows through an index, and a queue's meta (its item list: megabytes
for 100,000 items) lives in ``wq_meta``, apart from the ``wq_queues`` row of counters that
every take and acknowledgement rewrites (files made before keep working: their meta is
moved there when they are opened).

A file that cannot be used (not a SQLite database, read-only here) is reported as a
:class:`~shardfeed.errors.ShardfeedError` naming the file, the queue and what is wrong, by
the first call that names a queue (``WorkQueue(...)`` itself). A file deleted or replaced
under a worker stops it (:class:`~shardfeed.errors.WorkQueueLostError`) at its next take,
acknowledgement or renewal, instead of going on with the deleted file while later workers
make the queue afresh in a new one.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..errors import ShardfeedError, WorkQueueLostError
from .backend import COUNTERS, QueueBackend, gone

_SCHEMA = """
CREATE TABLE IF NOT EXISTS wq_queues (
    name TEXT PRIMARY KEY, meta TEXT NOT NULL, num_epochs INTEGER, next_epoch INTEGER NOT NULL DEFAULT 0,
    token INTEGER NOT NULL DEFAULT 0, restore_id TEXT,
    taken INTEGER NOT NULL DEFAULT 0, acked INTEGER NOT NULL DEFAULT 0, expired INTEGER NOT NULL DEFAULT 0,
    late_acks INTEGER NOT NULL DEFAULT 0, released INTEGER NOT NULL DEFAULT 0,
    redelivered INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS wq_items (
    name TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, worker TEXT, token INTEGER, deadline REAL,
    returned INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (name, id));
CREATE INDEX IF NOT EXISTS wq_items_order ON wq_items (name, worker, seq);
CREATE INDEX IF NOT EXISTS wq_items_seq ON wq_items (name, seq);
CREATE INDEX IF NOT EXISTS wq_items_deadline ON wq_items (name, deadline) WHERE deadline IS NOT NULL;
CREATE TABLE IF NOT EXISTS wq_meta (name TEXT PRIMARY KEY, meta TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS wq_epochs (name TEXT NOT NULL, epoch INTEGER NOT NULL, done INTEGER NOT NULL,
    PRIMARY KEY (name, epoch));
CREATE TABLE IF NOT EXISTS wq_workers (name TEXT NOT NULL, worker TEXT NOT NULL, taken INTEGER NOT NULL,
    acked INTEGER NOT NULL, first REAL NOT NULL, last REAL NOT NULL, PRIMARY KEY (name, worker));
"""

# columns added since the first release, added to a file made before them
_ADDED = (("wq_queues", "redelivered", "INTEGER NOT NULL DEFAULT 0"),
          ("wq_items", "returned", "INTEGER NOT NULL DEFAULT 0"))

# what is wrong with the file, by SQLite's error name (the primary code: extended ones such
# as SQLITE_READONLY_DIRECTORY start with it)
_WHY = (("SQLITE_NOTADB", "{path} is not a SQLite database (another file at that path, or an encrypted one)"),
        ("SQLITE_CORRUPT", "{path} is damaged (its pages do not hold a valid SQLite database)"),
        ("SQLITE_READONLY", "{path} is read-only here (its permissions, an immutable flag, or a read-only "
                            "filesystem; or its directory, where the -wal, -shm or -journal file beside it is "
                            "made), and a work queue writes it at every take and acknowledgement"),
        ("SQLITE_CANTOPEN", "{path} cannot be opened (or the -wal, -shm or -journal file beside it: is its "
                            "directory there and writable?)"),
        ("SQLITE_FULL", "the disk holding {path} is full"),
        ("SQLITE_IOERR", "reading or writing {path} failed (a disk or network filesystem error)"),
        ("SQLITE_BUSY", "{path} stayed locked by another connection for the whole timeout ({timeout:.0f} s)"),
        ("SQLITE_LOCKED", "{path} stayed locked by another connection for the whole timeout ({timeout:.0f} s)"))


class SQLiteBackend(QueueBackend):
    """Queues in the SQLite file at ``path`` (created with its directory if missing).
    ``read_only``: only look (``shardfeed queue status`` and ``list``): the file is opened
    read-only and never made, migrated or written, so a queue file this user may only read
    (another user's, a read-only filesystem) can still be looked at; an operation that
    writes is refused as on a read-only file."""

    def __init__(self, path: str, timeout_s: float = 60.0, journal: str | None = None, *,
                 read_only: bool = False) -> None:
        if "?" in path:
            path, query = path.split("?", 1)
            opts = dict(urllib.parse.parse_qsl(query))
            unknown = set(opts) - {"journal"}
            if unknown:
                raise ValueError(f"unknown SQLite backend option(s) {sorted(unknown)}: only ?journal=wal|delete")
            journal = journal or opts.get("journal")
        journal = (journal or "wal").lower()
        if journal not in ("wal", "delete"):
            raise ValueError(f"journal must be 'wal' (one host) or 'delete' (shared filesystem), got {journal!r}")
        self.journal = journal
        self.path = os.path.abspath(os.path.expanduser(path))
        self.url = "sqlite://" + self.path + ("" if journal == "wal" else "?journal=delete")
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._file: tuple[int, int] | None = None  # (device, inode) of the file the connections have open
        self._joined: dict[str, tuple[int, int]] = {}  # queue name -> the file this worker joined it in
        self.read_only = read_only
        self._immutable = False  # read_only, and the file is read without locks (see _open_file)
        if not read_only:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with self._errors(None, "open"):
            try:
                self._open_file()
            except sqlite3.Error as e:
                if (getattr(e, "sqlite_errorname", "") or "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
                    raise
                # the file is unusable (not a database, read-only...): the first call, which
                # names a queue (WorkQueue's constructor), says so with the queue's name (_tx)

    def _open_file(self) -> None:
        """Make the tables (and indexes) if missing, move metas out of ``wq_queues``, check
        the file can be written, and remember which file it is; ``read_only``: only check
        that it reads as a database."""
        conn = self._conn()
        if self.read_only:  # only looked at: a read that fails on a file that is not a database
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.OperationalError as e:
                wal = self.path + "-wal"
                if not (getattr(e, "sqlite_errorname", "") or "").startswith("SQLITE_CANTOPEN") or self._immutable \
                        or (os.path.exists(wal) and os.path.getsize(wal) > 0):
                    raise
                # a WAL file in a folder this user cannot write, without its -shm file and with
                # nothing in a -wal file: no worker can be writing it (a writer keeps the -shm
                # file there), so it is read as it is, without SQLite's shared-memory locks
                self.close()
                self._immutable = True
                self._conn().execute("SELECT count(*) FROM sqlite_master").fetchone()
        else:
            self._while_busy(lambda: conn.executescript(_SCHEMA))
            self._migrate()
        self._file = self._stat()

    def _stat(self) -> tuple[int, int] | None:
        """The (device, inode) of the file at ``path`` now; ``None`` when there is none."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def _while_busy(self, op: Callable[[], object]) -> None:
        """Run ``op`` again while another connection's lock refuses it, for up to ``timeout_s``.
        SQLite answers "database is locked" at once, without waiting in its busy handler, where
        waiting could deadlock: a connection that holds a read lock and asks for a write one
        (``PRAGMA journal_mode=wal`` on a new file while another process makes the tables), so
        workers started together on a new queue file failed."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                op()
                return
            except sqlite3.OperationalError as e:
                text = str(e).lower()
                if ("locked" not in text and "busy" not in text) or time.monotonic() >= deadline:
                    raise
            time.sleep(random.uniform(0.005, 0.05))

    def _migrate(self) -> None:
        with self._begin() as c:
            for table, column, decl in _ADDED:
                have = {row[1] for row in c.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    c.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
            # metas written into wq_queues (by earlier versions) move to wq_meta: every take
            # and acknowledgement rewrites the wq_queues row, and read its columns past the meta
            c.execute("INSERT OR REPLACE INTO wq_meta (name, meta) SELECT name, meta FROM wq_queues WHERE meta<>''")
            c.execute("UPDATE wq_queues SET meta='' WHERE meta<>''")
            # a write that changes nothing, still refused by a read-only file: so such a file
            # is reported when the queue is opened, not at the first take
            c.execute("UPDATE wq_queues SET name=name WHERE 0")

    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None or self._local.pid != os.getpid():
            if self.read_only:
                if not os.path.exists(self.path):  # mode=ro never makes the file: say which is missing
                    raise sqlite3.OperationalError("unable to open database file: there is no file at that path")
                uri = "file:" + urllib.parse.quote(self.path) + "?mode=ro" + ("&immutable=1" if self._immutable else "")
                c = sqlite3.connect(uri, uri=True, timeout=self.timeout_s, isolation_level=None,
                                    check_same_thread=False)
            else:
                c = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False)
                try:
                    self._while_busy(lambda: self._set_journal(c))
                    c.execute("PRAGMA synchronous=NORMAL")
                except BaseException:
                    c.close()
                    raise
            self._local.conn, self._local.pid = c, os.getpid()
            with self._all_lock:
                self._all.append(c)
        return c

    def _set_journal(self, c: sqlite3.Connection) -> None:
        """The file's journal mode (it persists in the file: changed once, by the first to open it)."""
        if c.execute("PRAGMA journal_mode").fetchone()[0].lower() != self.journal:
            c.execute(f"PRAGMA journal_mode={self.journal}")

    @contextmanager
    def _begin(self) -> Iterator[sqlite3.Connection]:
        c = self._conn()
        c.execute("BEGIN" if self.read_only else "BEGIN IMMEDIATE")  # a reader takes no write lock
        try:
            yield c
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    @contextmanager
    def _errors(self, name: str | None, what: str) -> Iterator[None]:
        """SQLite's errors as :class:`ShardfeedError`, naming the queue, the file and what is wrong."""
        try:
            yield
        except sqlite3.Error as e:
            code = getattr(e, "sqlite_errorname", "") or ""
            why = next((text for prefix, text in _WHY if code.startswith(prefix)), "{path}: SQLite failed")
            whose = f"work queue {name!r}" if name is not None else "work queues"
            raise ShardfeedError(f"{whose} on {self.url}: {what} failed: the queue file "
                                 f"{why.format(path=self.path, timeout=self.timeout_s)} ({code or type(e).__name__}: "
                                 f"{e})") from e

    @contextmanager
    def _tx(self, name: str | None, what: str, joined: bool = False) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction for an operation on queue ``name`` (``None``:
        on the file). The file is opened first if it could not be before. ``joined``: the
        operation works on the queue this worker joined (a take, an acknowledgement, a
        renewal...): when the file at ``path`` is no longer the one it was joined in (deleted,
        or replaced), it raises :class:`WorkQueueLostError`. The other operations (open,
        restore, reset, list) follow the path to whatever file is there now."""
        with self._errors(name, "open" if self._file is None else what):
            if self._file is None:
                self._open_file()
            now = self._stat()
            if now != self._file or (name is not None and self._joined.get(name, now) != now):
                if joined and name in self._joined:
                    how = "was deleted" if now is None else "was replaced by another file"
                    raise WorkQueueLostError(f"{gone(name, self.url)} (here: the queue file {self.path} {how} "
                                             "since this worker joined the queue)")
                self.close()  # the connections have the old file open: open the one at the path now
                self._open_file()
        with self._errors(name, what), self._begin() as c:
            yield c

    def _join(self, name: str) -> None:
        """Remember that this worker joined queue ``name`` in the file open now."""
        if self._file is not None:
            self._joined[name] = self._file

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for c in conns:
            try:
                c.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()

    # -- queues ------------------------------------------------------------------------
    def open(self, name: str, meta: dict) -> tuple[dict, bool]:
        with self._tx(name, "open") as c:
            got = self._meta(c, name)
            if got is not None:
                self._join(name)
                return got[0], False
            c.execute("INSERT INTO wq_queues (name, meta, num_epochs) VALUES (?, '', ?)",
                      (name, meta.get("num_epochs")))
            c.execute("INSERT OR REPLACE INTO wq_meta (name, meta) VALUES (?, ?)", (name, json.dumps(meta)))
            self._join(name)
            return meta, True

    @staticmethod
    def _meta(c: sqlite3.Connection, name: str) -> tuple[dict, str | None] | None:
        """``(meta, restore_id)`` of queue ``name``, or ``None``; the meta in ``wq_meta``, or
        in ``wq_queues`` where an earlier version wrote it after this file was opened (its
        reset left the ``wq_meta`` row, stale: the one in ``wq_queues`` comes first)."""
        row = c.execute("SELECT q.restore_id, q.meta, m.meta FROM wq_queues q LEFT JOIN wq_meta m ON m.name=q.name "
                        "WHERE q.name=?", (name,)).fetchone()
        if row is None:
            return None
        return json.loads(row[1] or row[2]), row[0]

    def get_meta(self, name: str) -> dict | None:
        with self._tx(name, "open") as c:
            got = self._meta(c, name)
        if got is None:
            return None
        self._join(name)  # the queue this worker joins
        return dict(got[0], restore_id=got[1])

    def _queue(self, c: sqlite3.Connection, name: str) -> tuple:
        row = c.execute("SELECT num_epochs, next_epoch, token FROM wq_queues WHERE name=?", (name,)).fetchone()
        if row is None:
            raise WorkQueueLostError(gone(name, self.url))
        return row

    def take(self, name: str, worker: str, lease_s: float) -> dict:
        with self._tx(name, "take", joined=True) as c:
            num_epochs, next_epoch, token = self._queue(c, name)
            now = time.time()
            # a lease has a deadline exactly while it is out (worker set): the index of the
            # leases' (name, deadline) finds the expired ones without visiting the others
            expired = c.execute("SELECT id FROM wq_items WHERE name=? AND deadline<=? ORDER BY seq DESC",
                                (name, now)).fetchall()
            if expired:
                (low,) = c.execute("SELECT MIN(seq) FROM wq_items WHERE name=?", (name,)).fetchone()
                for k, (item_id,) in enumerate(expired, 1):
                    c.execute("UPDATE wq_items SET worker=NULL, token=NULL, deadline=NULL, returned=1, seq=? "
                              "WHERE name=? AND id=?", (low - k, name, item_id))
                c.execute("UPDATE wq_queues SET expired=expired+? WHERE name=?", (len(expired), name))
            row = c.execute("SELECT id, returned FROM wq_items WHERE name=? AND worker IS NULL ORDER BY seq LIMIT 1",
                            (name,)).fetchone()
            if row is not None:
                token += 1
                deadline = now + lease_s
                c.execute("UPDATE wq_items SET worker=?, token=?, deadline=?, returned=0 WHERE name=? AND id=?",
                          (worker, token, deadline, name, row[0]))
                c.execute("UPDATE wq_queues SET token=?, taken=taken+1, redelivered=redelivered+? WHERE name=?",
                          (token, 1 if row[1] else 0, name))
                c.execute("INSERT INTO wq_workers (name, worker, taken, acked, first, last) VALUES (?, ?, 1, 0, ?, ?) "
                          "ON CONFLICT (name, worker) DO UPDATE SET taken=taken+1", (name, worker, now, now))
                return {"status": "item", "id": row[0], "token": token, "deadline": deadline}
            if num_epochs is None or next_epoch < num_epochs:
                return {"status": "need_epoch", "epoch": next_epoch}
            (soonest,) = c.execute("SELECT MIN(deadline) FROM wq_items WHERE name=? AND deadline IS NOT NULL",
                                   (name,)).fetchone()
            if soonest is not None:
                return {"status": "wait", "retry_s": max(0.0, soonest - now)}
            return {"status": "drained"}

    def fill_epoch(self, name: str, epoch: int, order: list[int]) -> bool:
        with self._tx(name, "fill_epoch", joined=True) as c:
            _, next_epoch, _ = self._queue(c, name)
            if next_epoch != epoch:
                return False
            (high,) = c.execute("SELECT MAX(seq) FROM wq_items WHERE name=?", (name,)).fetchone()
            base = (high or 0) + 1
            c.executemany("INSERT INTO wq_items (name, id, seq) VALUES (?, ?, ?)",
                          ((name, f"{epoch}:{i}", base + k) for k, i in enumerate(order)))
            c.execute("UPDATE wq_queues SET next_epoch=? WHERE name=?", (epoch + 1, name))
            return True

    def ack(self, name: str, item_id: str, token: int, worker: str) -> bool:
        with self._tx(name, "ack", joined=True) as c:
            self._queue(c, name)
            cur = c.execute("DELETE FROM wq_items WHERE name=? AND id=? AND token=? AND worker IS NOT NULL",
                            (name, item_id, token))
            if cur.rowcount != 1:
                c.execute("UPDATE wq_queues SET late_acks=late_acks+1 WHERE name=?", (name,))
                return False
            now = time.time()
            c.execute("UPDATE wq_queues SET acked=acked+1 WHERE name=?", (name,))
            c.execute("INSERT INTO wq_epochs (name, epoch, done) VALUES (?, ?, 1) "
                      "ON CONFLICT (name, epoch) DO UPDATE SET done=done+1", (name, int(item_id.split(":")[0])))
            c.execute("INSERT INTO wq_workers (name, worker, taken, acked, first, last) VALUES (?, ?, 0, 1, ?, ?) "
                      "ON CONFLICT (name, worker) DO UPDATE SET acked=acked+1, last=excluded.last",
                      (name, worker, now, now))
            return True

    def renew(self, name: str, item_id: str, token: int, lease_s: float) -> bool:
        with self._tx(name, "renew", joined=True) as c:
            cur = c.execute("UPDATE wq_items SET deadline=? WHERE name=? AND id=? AND token=? AND worker IS NOT NULL",
                            (time.time() + lease_s, name, item_id, token))
            if cur.rowcount != 1:
                self._queue(c, name)  # the lease is lost, or the whole queue (raises)
            return cur.rowcount == 1

    def release(self, name: str, item_id: str, token: int) -> bool:
        with self._tx(name, "release", joined=True) as c:
            (low,) = c.execute("SELECT MIN(seq) FROM wq_items WHERE name=?", (name,)).fetchone()
            cur = c.execute("UPDATE wq_items SET worker=NULL, token=NULL, deadline=NULL, returned=1, seq=? "
                            "WHERE name=? AND id=? AND token=? AND worker IS NOT NULL",
                            ((low or 0) - 1, name, item_id, token))
            if cur.rowcount == 1:
                c.execute("UPDATE wq_queues SET released=released+1 WHERE name=?", (name,))
            return cur.rowcount == 1

    def snapshot(self, name: str) -> dict | None:
        with self._tx(name, "snapshot", joined=True) as c:
            row = c.execute("SELECT next_epoch, num_epochs, " + ", ".join(COUNTERS) + " FROM wq_queues WHERE name=?",
                            (name,)).fetchone()
            if row is None:
                return None
            items = c.execute("SELECT id, worker, token, deadline FROM wq_items WHERE name=? ORDER BY seq",
                              (name,)).fetchall()
            epochs = c.execute("SELECT epoch, done FROM wq_epochs WHERE name=?", (name,)).fetchall()
            workers = c.execute("SELECT worker, taken, acked, first, last FROM wq_workers WHERE name=?",
                                (name,)).fetchall()
        return {
            "next_epoch": row[0],
            "num_epochs": row[1],
            "pending": [i for i, w, _, _ in items if w is None],
            "inflight": {i: {"worker": w, "token": t, "deadline": d} for i, w, t, d in items if w is not None},
            "counters": dict(zip(COUNTERS, row[2:])),
            "epoch_done": {str(e): d for e, d in epochs},
            "workers": {w: {"taken": t, "acked": a, "first": f, "last": la} for w, t, a, f, la in workers},
            "now": time.time(),
        }

    def restore(self, name: str, meta: dict, state: dict, restore_id: str) -> bool:
        with self._tx(name, "restore") as c:
            row = c.execute("SELECT restore_id, token FROM wq_queues WHERE name=?", (name,)).fetchone()
            self._join(name)  # the restored queue is the one this worker now works on
            if row is not None and row[0] == restore_id:
                return False
            token = row[1] if row is not None else 0
            self._delete(c, name)
            counters = {k: int(state.get("counters", {}).get(k, 0)) for k in COUNTERS}
            c.execute("INSERT INTO wq_queues (name, meta, num_epochs, next_epoch, token, restore_id, "
                      + ", ".join(COUNTERS) + ") VALUES (?, '', ?, ?, ?, ?" + ", ?" * len(COUNTERS) + ")",
                      (name, meta.get("num_epochs"), int(state["next_epoch"]), token, restore_id, *counters.values()))
            c.execute("INSERT INTO wq_meta (name, meta) VALUES (?, ?)", (name, json.dumps(meta)))
            c.executemany("INSERT INTO wq_items (name, id, seq) VALUES (?, ?, ?)",
                          ((name, i, k) for k, i in enumerate(state["pending"])))
            c.executemany("INSERT INTO wq_epochs (name, epoch, done) VALUES (?, ?, ?)",
                          ((name, int(e), int(d)) for e, d in state.get("epoch_done", {}).items()))
            return True

    def drain(self, name: str) -> int:
        with self._tx(name, "drain", joined=True) as c:
            _, next_epoch, _ = self._queue(c, name)
            n = c.execute("DELETE FROM wq_items WHERE name=? AND worker IS NULL", (name,)).rowcount
            c.execute("UPDATE wq_queues SET num_epochs=? WHERE name=?", (next_epoch, name))
            return n

    @staticmethod
    def _delete(c: sqlite3.Connection, name: str) -> int:
        n = c.execute("DELETE FROM wq_queues WHERE name=?", (name,)).rowcount
        for table in ("wq_meta", "wq_items", "wq_epochs", "wq_workers"):
            c.execute(f"DELETE FROM {table} WHERE name=?", (name,))  # noqa: S608 - fixed table names
        return n

    def reset(self, name: str) -> bool:
        with self._tx(name, "reset") as c:
            return self._delete(c, name) > 0

    def names(self) -> list[str]:
        with self._tx(None, "list") as c:
            return [r[0] for r in c.execute("SELECT name FROM wq_queues ORDER BY name").fetchall()]
