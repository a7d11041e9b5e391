"""A production-shaped cluster of real processes for fault tests: several web processes
(daphne) behind one address, several workers (``llmgw worker``), several agents, each agent
reaching the control plane through a link of its own that a test can cut. Engines are
fake engines. Which database and broker they use comes from the environment (the test
database of the run, or a private PostgreSQL)."""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from tests.cluster import FAST_ENV
from tests.netproxy import TcpProxy
from tests.processes import PYTHON, Proc, daphne, free_port, wait_until

#: Short periods: route grace < lost grace, fast heartbeats, visible backoff (capped).
FAULT_ENV = {
    **FAST_ENV,
    "LLMGW_RECONCILE_INTERVAL": "0.3s",
    "LLMGW_AGENT_ROUTE_GRACE": "2s",
    "LLMGW_AGENT_LOST_AFTER": "5s",
    "LLMGW_CONTROL_PLANE_HEARTBEAT": "0.5s",
    "LLMGW_BACKOFF_BASE": "0.5s",
    "LLMGW_BACKOFF_CAP": "4s",
    "LLMGW_BACKOFF_RESET_AFTER": "10s",
    "LLMGW_DRAIN_GRACE": "2s",
    "Q_WORKERS": "1",
}
AGENT_HEARTBEAT_S = 0.3


@dataclass
class AgentHandle:
    name: str
    token: str
    state_dir: Path
    ports: str
    link: TcpProxy
    proc: Proc | None = None
    starts: int = 0
    extra: list[str] = field(default_factory=list)
    #: Every agent process started under this name, the current one last: :meth:`MultiCluster.stop`
    #: stops each that still runs.
    started: list[Proc] = field(default_factory=list)


class MultiCluster:
    """``webs`` daphnes behind ``self.url`` (a round-robin proxy), ``workers`` qclusters, and
    the agents given as name → token. ``stop()`` ends everything, engines included."""

    def __init__(self, log_dir: Path, agents: dict[str, str], webs: int = 2, workers: int = 2,
                 env: dict[str, str] | None = None, worker_env: dict[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.env = {**FAULT_ENV, **(env or {})}
        self.worker_env = {**self.env, **(worker_env or {})}
        self.web_ports = [free_port() for _ in range(webs)]
        self.webs: list[Proc | None] = [None] * webs
        self.workers: list[Proc] = []
        self.balancer = TcpProxy(self.web_ports).start()
        self.url = f"http://127.0.0.1:{self.balancer.port}"
        self.agents: dict[str, AgentHandle] = {}
        try:
            for i in range(webs):
                self.start_web(i)
            for i in range(workers):
                self.start_worker(i)
            for n, (name, token) in enumerate(agents.items()):
                low = 22100 + 100 * n
                handle = AgentHandle(name, token, log_dir / f"agent-{name}", f"{low}-{low + 99}",
                                     TcpProxy(self.web_ports).start())
                self.agents[name] = handle
                self.start_agent(name)
        except BaseException:
            self.stop()
            raise

    # -- web processes ---------------------------------------------------------------------
    def web_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.web_ports[i]}"

    def start_web(self, i: int) -> Proc:
        self.webs[i] = daphne(self.web_ports[i], self.log_dir, env=self.env)
        return self.webs[i]

    def stop_web(self, i: int, sig: int = signal.SIGTERM) -> None:
        web, self.webs[i] = self.webs[i], None
        if web is not None:
            web.stop(sig, timeout_s=10)

    # -- workers ---------------------------------------------------------------------------
    def start_worker(self, i: int) -> Proc:
        """Start worker ``i`` (``llmgw worker``: the task cluster and the leader loop),
        appended to ``self.workers`` or replacing a stopped one."""
        proc = Proc([PYTHON, "manage.py", "llmgw", "worker"], self.log_dir / f"worker-{i}.log", env=self.worker_env)
        if i < len(self.workers):
            self.workers[i] = proc
        else:
            self.workers.append(proc)
        return proc

    # -- agents ----------------------------------------------------------------------------
    def start_agent(self, name: str, connect_timeout_s: float = 30.0) -> Proc:
        """Start (or bring back) agent ``name`` with its state directory: engines it left
        running are adopted. Returns once it has connected. One that has not connected within
        ``connect_timeout_s`` (TimeoutError) or exited (AssertionError) is killed (SIGKILL, as
        ``kill -9``: engines it adopted stay for the next one) before the error is raised, so
        a caller that tries again never has two agents of one name, one token and one state
        directory running: the older would keep engines that nobody tells to stop."""
        a = self.agents[name]
        log_path = self.log_dir / f"agent-{name}.log"
        before = log_path.stat().st_size if log_path.exists() else 0  # earlier agents of this name log there too
        proc = Proc([PYTHON, "manage.py", "llmgw", "agent", "--server", f"http://127.0.0.1:{a.link.port}",
                     "--name", name, "--state-dir", str(a.state_dir),
                     "--heartbeat-s", str(AGENT_HEARTBEAT_S), "--stop-grace-s", "2", "--port-range", a.ports,
                     "--unready-fail-s", "2", "--hung-fail-s", "2", "--stop-engines-on-exit", *a.extra],
                    log_path, env={**self.env, "LLMGW_AGENT_TOKEN": a.token})
        a.proc = proc
        a.started.append(proc)
        a.starts += 1
        try:
            wait_until(lambda: b"connected to " in _read_from(log_path, before) or proc.proc.poll() is not None,
                       timeout_s=connect_timeout_s, what=f"agent {name} to connect")
            assert proc.proc.poll() is None, proc.log()[-3000:]
        except BaseException:
            proc.stop(signal.SIGKILL, timeout_s=10)
            raise
        return proc

    def kill_agent(self, name: str) -> None:
        """SIGKILL the agent alone: its engines (own process groups) keep running."""
        a = self.agents[name]
        os.kill(a.proc.pid, signal.SIGKILL)
        a.proc.proc.wait(10)

    def engine_pids(self, name: str) -> dict[int, int]:
        """Replica id → engine pid, from the agent's state file (engines it holds, not ones
        it is stopping)."""
        from fleet.agent.processes import read_state

        return {int(r["replica_id"]): r["pid"] for r in read_state(self.agents[name].state_dir / "engines.json")
                if not r.get("stopping")}

    def _kill_orphans(self, a: AgentHandle) -> None:
        """Engines left by an agent that was killed and not brought back."""
        from fleet.agent.processes import process_start_time, read_state

        for item in read_state(a.state_dir / "engines.json"):
            pid = item.get("pid")
            if pid and process_start_time(pid) == item.get("start_time"):
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)

    # -- all -------------------------------------------------------------------------------
    def procs(self) -> list[Proc]:
        return [p for p in [*self.webs, *self.workers, *(a.proc for a in self.agents.values())] if p is not None]

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log()[-tail:]}" for p in self.procs())

    def stop(self) -> None:
        """Stop every process started, agents first (each one ever started under a name,
        not only the latest), then their orphan engines, workers and web processes."""
        for a in self.agents.values():
            a.link.resume()
            for proc in a.started:
                if proc.proc.poll() is None:
                    proc.stop()
            self._kill_orphans(a)
        for proc in [*self.workers, *self.webs]:
            if proc is not None:
                proc.stop(timeout_s=10)
        for a in self.agents.values():
            a.link.stop()
        self.balancer.stop()


def _read_from(path: Path, offset: int) -> bytes:
    """What ``path`` holds after its first ``offset`` bytes (b"" if it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read()
    except OSError:
        return b""


@dataclass
class Answer:
    at: float  # when it was sent (monotonic)
    status: int | None  # None: no HTTP answer at all (connection refused or reset)
    replica: str = ""  # X-Llmgw-Replica: "ID@agent"
    error: str = ""


class Traffic:
    """Chat requests for ``model`` sent back to back from ``threads`` threads until
    ``stop()``; every answer's status and the replica that served it."""

    def __init__(self, url: str, model: str, threads: int = 2, pause_s: float = 0.05, stream: bool = False) -> None:
        import threading

        self.url, self.model, self.pause_s, self.stream = url, model, pause_s, stream
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> list[Answer]:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        return self.answers

    def _run(self) -> None:
        import time

        import httpx

        body = {"model": self.model, "stream": self.stream, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    # A connection per request: clients land on either web process.
                    r = client.post("/v1/chat/completions", json=body, headers={"Connection": "close"})
                    self.answers.append(Answer(sent, r.status_code, r.headers.get("x-llmgw-replica", ""),
                                               "" if r.status_code == 200 else r.text[:300]))
                except httpx.HTTPError as exc:
                    self.answers.append(Answer(sent, None, "", f"{type(exc).__name__}: {exc}"))
                self._stop.wait(self.pause_s)

    def statuses(self) -> set[int | None]:
        return {a.status for a in self.answers}

    def served_by(self) -> list[str]:
        """Replicas that answered 200, in order, repeats collapsed."""
        out: list[str] = []
        for a in self.answers:
            if a.status == 200 and (not out or out[-1] != a.replica):
                out.append(a.replica)
        return out

    def summary(self) -> str:
        from collections import Counter

        errors = Counter(a.error[:120] for a in self.answers if a.status != 200)
        return f"{Counter(a.status for a in self.answers)}; served by {self.served_by()}; errors {dict(errors)}"
