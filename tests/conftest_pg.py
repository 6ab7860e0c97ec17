"""A real PostgreSQL server for the table tests: started once per session on 127.0.0.1
(a free port, a temporary data directory, as user ``postgres`` when running as root),
stopped at the end. Tests that use it skip, saying why, when the PostgreSQL binaries are
not installed (CI installs them: Debian package ``postgresql``)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest


def _bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if found:
        return os.path.dirname(found[0])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pg_server():
    """Yields a connection URL prefix ``postgresql://postgres@127.0.0.1:PORT/postgres``."""
    bindir = _bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed; "
                    "install the Debian package 'postgresql' to run these tests")
    pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install 'psycopg[binary]')")
    root = tempfile.mkdtemp(prefix="sf-pg-")
    data, sock = os.path.join(root, "data"), os.path.join(root, "sock")
    os.makedirs(sock)
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(sock, "postgres", "postgres")
        os.chmod(root, 0o755)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = _free_port()

    def run(*args: str) -> None:
        subprocess.run([*as_user, *args], check=True, cwd=root, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=120)

    run(f"{bindir}/initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
    run(f"{bindir}/pg_ctl", "-D", data, "-l", os.path.join(root, "server.log"), "-w", "-t", "60", "-o",
        f"-c listen_addresses=127.0.0.1 -p {port} -k {sock} -c fsync=off -c full_page_writes=off", "start")
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        import psycopg

        for _ in range(100):
            try:
                psycopg.connect(url).close()
                break
            except psycopg.OperationalError:
                time.sleep(0.1)
        yield url
    finally:
        subprocess.run([*as_user, f"{bindir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], cwd=root,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        shutil.rmtree(root, ignore_errors=True)
