"""PostgreSQL and Redis for tests: a private PostgreSQL instance that a fault test may stop
and restart (never the machine's shared server), and the rule for services that are absent:
a failure naming what is missing, never a skip (docs/architecture.md, "Testing")."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.processes import free_port

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379


def require(available: bool, what: str) -> None:
    """Fail the calling test unless ``available``, saying what is missing: these tests are
    never skipped (.ci/run starts the services they need)."""
    if not available:
        pytest.fail(f"missing: {what} (.ci/run starts PostgreSQL and Redis; install them to run these tests)",
                    pytrace=False)


def postgres_bin() -> Path | None:
    """The directory of initdb and pg_ctl, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or ([shutil.which("initdb")] if shutil.which("initdb") else [])
    return Path(found[-1]).parent if found else None


def redis_available() -> bool:
    try:
        with socket.create_connection((REDIS_HOST, REDIS_PORT), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class PrivatePostgres:
    """A PostgreSQL instance of the test's own: ``initdb`` in a temp directory, its own port,
    trust authentication, fsync off. Run as the ``postgres`` user when the tests run as root
    (PostgreSQL refuses root)."""

    def __init__(self) -> None:
        bindir = postgres_bin()
        if bindir is None:
            raise RuntimeError("initdb not found")
        self.bin = bindir
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="llmgw-pg-"))
        self.data = self.dir / "data"
        self.log_path = self.dir / "postgres.log"
        self._as = []
        if os.geteuid() == 0:
            os.chown(self.dir, pwd.getpwnam("postgres").pw_uid, -1)
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, *argv: str, timeout_s: float = 60) -> None:
        done = subprocess.run([*self._as, *argv], capture_output=True, text=True, timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stdout}{done.stderr}{self.log()[-2000:]}")

    def _ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log_path), "-w", "-o", options,
                  action, *extra)

    def start(self) -> PrivatePostgres:
        if not self.data.exists():
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                      "--no-sync", "-E", "UTF8")
        self._ctl("start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._ctl("stop", "-m", mode)

    def createdb(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateRedis:
    """A Redis server of the test's own (its port, no persistence) that a fault test may stop
    and start again on the same port; the machine's shared Redis is never touched."""

    def __init__(self) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RuntimeError("redis-server not found")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="llmgw-redis-"))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "PrivateRedis":
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        from tests.processes import wait_for_port

        wait_for_port(self.port, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def private_redis():
    """A started :class:`PrivateRedis`, removed afterwards."""
    require(shutil.which("redis-server") is not None, "redis-server")
    server = PrivateRedis().start()
    try:
        yield server
    finally:
        server.close()
