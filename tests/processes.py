"""Helpers for tests that run real processes: free ports, waiting for a port, a request
whose client hangs up when the test says, and a process handle that is always stopped
(SIGTERM, then SIGKILL)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout_s: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port} after {timeout_s} s")


def open_request(port: int, path: str, body: dict, key: str | None = None) -> socket.socket:
    """POST ``body`` (JSON) to ``path`` on 127.0.0.1:``port`` from a raw socket and return
    it unread: the test closes it to hang up at the moment it chooses (once the engine
    has the request, say), not after a client timeout that a busy machine may outrun."""
    data = json.dumps(body).encode()
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def wait_until(predicate, timeout_s: float = 20.0, interval_s: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


class Proc:
    """A child process with its output in a log file; ``stop()`` always cleans it up."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None, new_session: bool = True):
        self.log_path = log_path
        self._log = open(log_path, "ab")
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(ROOT),
                                     env=full_env, start_new_session=new_session)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> None:
        """Signal the process (it stops its own children, as in production), then kill
        whatever is left of its process group."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self._log.close()


def fake_engine(port: int, log_dir: Path, *args: str, name: str = "fake-model", api_key: str = "",
                host: str = "127.0.0.1") -> Proc:
    """The fake engine on ``host:port``; with ``api_key`` it refuses requests without it
    (401), as the engines an agent starts do."""
    key = ["--api-key", api_key] if api_key else []
    return Proc([PYTHON, str(ROOT / "tests" / "fake_engine.py"), "--host", host, "--port", str(port),
                 "--served-name", name, *key, *args],
                log_dir / f"fake-engine-{port}.log")


def web_server(port: int, log_dir: Path, env: dict[str, str] | None = None) -> Proc:
    """The control plane's web process, started as ``llmgw up`` starts it (uvicorn)."""
    from llmgw.cli.web_processes import web_argv

    proc = Proc(web_argv("127.0.0.1", port, access_log=False),
                log_dir / f"web-{port}.log", env={"DJANGO_SETTINGS_MODULE": "llmgw.settings", **(env or {})})
    wait_for_port(port, proc=proc.proc)
    return proc


daphne = web_server  # the name older tests use
