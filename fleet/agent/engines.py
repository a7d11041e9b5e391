"""Engine processes on this machine: start from a profile's template, watch readiness and
exit, read load, stop (SIGTERM to the group, SIGKILL after a grace), adopt after a restart.

Each engine runs in its own session (process group), logs to its own file (never a pipe to
the agent, which would break when the agent re-executes) and is recorded in a state file
(:mod:`fleet.agent.processes`: pid, process start time, address, port, its spec with the
engine key; mode 0600) from its spawn until its whole group is seen gone, stops included, so
a restarted agent adopts it or finishes stopping it: no orphan engines.

An engine is ready only when the process listening on its port is one of its own group
(:mod:`fleet.agent.sockets`) and, for an OpenAI readiness path (``/v1/models``), it serves
the replica's name; another process on the port fails the start on that port, retried on
another (``PORT_TRIES``).

Engines are reachable only through the gateway (docs/architecture.md, "Security": engine keys):
each listens on the address the agent advertises (never every interface unless ``--bind-host``
says so), is started with its replica's engine key, which the probes here send too, and
inherits none of the agent's secrets (:func:`engine_environment`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx

from fleet.agent import sockets
from fleet.agent.cache import WeightsCache
from fleet.agent.metrics import read_load
from fleet.agent.launch import engine_environment, probe_host, render_command, resolve_bind_host, url_path
from fleet.agent.processes import (group_gone, kill_group, kill_leftovers, process_alive, process_start_time,
                                   read_state, reap_children, wait_exit, write_state)
from fleet.agent.weights import WeightsError, fetch_weights, weights_context_length
from fleet.protocol import AssignedReplica, ReplicaReport, error_excerpt, port_free
from fleet.states import ReplicaState

log = logging.getLogger(__name__)
S = ReplicaState

#: How much of an engine's log end is read for its error: enough for a long traceback (vLLM
#: prefixes each of its lines), whose cause the error keeps ahead of the last lines.
LOG_WINDOW_BYTES = 32768


@dataclass
class AgentConfig:
    """Where the agent keeps things and how it runs engines (durations in seconds)."""

    state_dir: Path
    #: The address engines listen on; empty: the address the agent advertises
    #: (:meth:`EngineManager.advertise`), loopback until it has one.
    bind_host: str = ""
    port_min: int = 20000
    port_max: int = 20999
    stop_grace_s: float = 10.0
    readiness_poll_s: float = 0.1  # the longest pause between readiness checks (local GETs are cheap)
    load_poll_s: float = 5.0
    #: While ready, readiness is checked every ``readiness_watch_s``. An engine that refuses
    #: or errors for ``unready_fail_s`` is failed (and replaced); one that does not answer at
    #: all for ``hung_fail_s`` too — longer, because a busy engine may answer late
    #: (llama-cpp-python serves its readiness path behind the running generation).
    readiness_watch_s: float = 2.0
    unready_fail_s: float = 30.0
    hung_fail_s: float = 300.0
    cache_max_bytes: int = 0  # size limit of the mirror: weights cache (LRU eviction); 0 = none

    @property
    def cache_dir(self) -> Path:
        return self.state_dir / "weights"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "engines.json"


def _port_free(host: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``host`` (IPv4 or IPv6) right now
    (:func:`fleet.protocol.port_free`); a host that is not this machine's fails the engine."""
    try:
        return port_free(host, port)
    except OSError as exc:
        raise _EngineFailed(f"cannot listen on {host}: not an address of this machine "
                            "(set the agent's --bind-host, or --advertise-address)") from exc


@dataclass
class Engine:
    """One replica's engine on this machine."""

    spec: AssignedReplica
    state: ReplicaState = S.DOWNLOADING
    pid: int | None = None
    #: The address it listens on (the agent's advertised one unless ``--bind-host``).
    host: str = "127.0.0.1"
    port: int | None = None
    start_time: str | None = None
    error: str = ""
    running: int | None = None
    waiting: int | None = None
    proc: subprocess.Popen | None = None
    task: asyncio.Task | None = None
    log_path: Path | None = None
    adopted: bool = False
    stopping: bool = False
    #: Fraction (0..1) of its weights downloaded while ``downloading``; None otherwise.
    progress: float | None = None
    #: Tokens of context its weights' own metadata gives (GGUF), once they are local; None unknown.
    weights_context_length: int | None = None
    #: Wall-clock seconds when its process was spawned (the startup timeout runs from it,
    #: across an agent restart).
    started_at: float | None = None

    @property
    def replica_id(self) -> int:
        return self.spec["replica_id"]

    @property
    def probe_headers(self) -> dict[str, str]:
        """The replica's engine key for readiness and metrics probes (none if it has none)."""
        key = self.spec.get("api_key") or ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def base_url(self) -> str:
        return f"http://{probe_host(self.host)}:{self.port}"

    def report(self) -> ReplicaReport:
        return {
            "replica_id": self.replica_id,
            "state": self.state.value,
            "pid": self.pid,
            "port": self.port,
            "error": self.error,
            "running": self.running,
            "waiting": self.waiting,
            "progress": self.progress,
            **({"weights_context_length": self.weights_context_length} if self.weights_context_length else {}),
        }

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        if self.pid is None:
            return False
        return process_alive(self.pid, self.start_time)

    def exit_words(self) -> str:
        """How it ended, for its error line: "engine exited with code 1", "engine killed by
        signal 9", or, for an engine adopted after an agent restart (not our child, so its
        status is not ours to read), "engine exited (adopted: exit status unknown)"."""
        code = self.exit_code()
        if code == "?":
            return "engine exited (adopted: exit status unknown)"
        if isinstance(code, int) and code < 0:
            return f"engine killed by signal {-code}"
        return f"engine exited with code {code}"

    def exit_code(self) -> int | str:
        """Its exit code, "?" when it was not our child (adopted after the agent restarted)."""
        return self.proc.returncode if self.proc is not None and self.proc.returncode is not None else "?"

    def record(self) -> dict:
        """Its state-file record (:mod:`fleet.agent.processes`), not stopping."""
        return {"pid": self.pid, "start_time": self.start_time, "replica_id": self.replica_id, "host": self.host,
                "port": self.port, "served_name": self.spec.get("served_name", ""), "spec": self.spec,
                "log_path": str(self.log_path) if self.log_path else None, "started_at": self.started_at,
                "stopping": False}

    def log_tail(self, lines: int = 15, secret: str = "") -> str:
        """The log's last ``lines`` lines, within its last :data:`LOG_WINDOW_BYTES`, each
        whole: a line cut by the window is left out (a key printed on it would be cut too,
        and its end would pass the masking of the whole key). The line that says what went
        wrong comes first when it lies above them, and ``secret`` is masked before any cut
        (``fleet.protocol.error_excerpt``)."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                start = max(0, fh.tell() - LOG_WINDOW_BYTES)
                if start:
                    fh.seek(start - 1)  # the byte before the window: is its first line whole?
                    whole = fh.read(1) == b"\n"
                else:
                    fh.seek(0)
                    whole = True
                data = fh.read()
        except OSError:
            return ""
        if not whole:
            data = data.partition(b"\n")[2]
        return error_excerpt(data.decode("utf-8", "replace"), lines, secret)


class EngineManager:
    """Keeps this machine's engines equal to the last desired set received."""

    def __init__(self, config: AgentConfig, on_change: Callable[[], None], server_url: str = "",
                 token: str = "") -> None:
        self.config = config
        self.on_change = on_change
        #: The control plane and this agent's token, for ``mirror:`` weights.
        self.server_url, self.token = server_url, token
        self.weights_cache = WeightsCache(config.cache_dir / "mirror", max_bytes=config.cache_max_bytes,
                                          in_use=self._mirror_in_use)
        self.engines: dict[int, Engine] = {}
        #: The address the agent advertises (set on connecting); engines bind to it
        #: unless the config names a bind host.
        self.advertised = ""
        #: Reports of engines stopped since the last status, sent once then forgotten.
        self.finished: dict[int, ReplicaReport] = {}
        #: Every engine process started (or adopted) and not yet seen gone, by pid: the state
        #: file's records. Kept through stopping, so an agent killed mid-stop still knows it.
        self.spawned: dict[int, dict] = {}
        #: Whether an ``assign`` arrived since this process started: before it, engines
        #: adopted are kept; the first one says which the control plane still wants.
        self.assigned = False
        self._detached: set[asyncio.Task] = set()
        for directory in (config.state_dir, config.cache_dir, config.log_dir):
            directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # it holds engine keys (state file) and logs
            config.state_dir.chmod(0o700)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(2.0, connect=1.0))

    # -- reports ---------------------------------------------------------------------------
    def reports(self) -> list[ReplicaReport]:
        """A report for every engine this agent runs, and one for each engine stopped since
        its stop was last sent (``finished``, kept until :meth:`sent` is told it went out)."""
        out = [e.report() for e in self.engines.values()]
        out += [r for rid, r in self.finished.items() if rid not in self.engines]
        return out

    def sent(self, reports: list[ReplicaReport]) -> None:
        """``reports`` (from :meth:`reports`) reached the control plane: forget the stops
        among them. Only those: an engine that stopped while the message was being built or
        sent (both wait) is reported in the next one — clearing every stop lost it, and its
        replica stayed ``stopping`` for ever."""
        for report in reports:
            rid = report.get("replica_id")
            if self.finished.get(rid) is report:
                del self.finished[rid]
        for rid in [rid for rid in self.finished if rid in self.engines]:  # running again: superseded
            del self.finished[rid]

    def advertise(self, address: str) -> None:
        """The address the agent advertises to the control plane (the gateway reaches
        engines there); engines started from now on listen on it."""
        self.advertised = address

    def bind_host(self) -> str:
        """Where a new engine listens: ``--bind-host`` if given, else the advertised
        address (resolved to an IP), else loopback. ValueError if it does not resolve."""
        if self.config.bind_host:
            return self.config.bind_host
        return resolve_bind_host(self.advertised) if self.advertised else "127.0.0.1"

    def _changed(self) -> None:
        self._forget_gone()
        self.save_state()
        self.on_change()

    # -- state file (adoption) -------------------------------------------------------------
    def save_state(self) -> None:
        """Write every engine process not yet seen gone to the state file
        (:func:`fleet.agent.processes.write_state`): a record is "stopping" once a stop began,
        or when no engine this agent holds has that pid any more."""
        records = []
        for pid, record in self.spawned.items():
            engine = self.engines.get(record.get("replica_id"))
            held = engine is not None and engine.pid == pid and not engine.stopping
            records.append({**record, "stopping": bool(record.get("stopping")) or not held})
        write_state(self.config.state_file, records)

    def _spawned(self, engine: Engine) -> None:
        """Record ``engine``'s new process and write the state file at once, before anything
        awaits: from here the engine may outlive this agent."""
        self.spawned[engine.pid] = engine.record()
        self.save_state()

    def _forget_gone(self) -> bool:
        """Drop the records of processes whose whole group is gone; True if any was. Our own
        children are asked through their Popen (which must reap them to keep the exit code)."""
        children = {e.pid: e.proc for e in self.engines.values() if e.proc is not None}
        gone = [pid for pid, r in self.spawned.items()
                if not (pid in children and children[pid].poll() is None) and group_gone(pid, r.get("start_time"))]
        for pid in gone:
            del self.spawned[pid]
        return bool(gone)

    async def adopt(self) -> int:
        """On start, take over every engine process the state file lists that is still alive
        (pid and start time match; docs/architecture.md, "Decisions": no orphan engines).
        One being stopped when the previous agent went away is stopped (SIGTERM to its group,
        SIGKILL after the grace), reported ``stopping`` until gone. The others are held as
        they are: ready if they pass the readiness check (:meth:`_await_ready`'s identity
        rules), else starting, with the rest of their startup timeout; the first ``assign``
        stops those not wanted (:meth:`apply`). Dead ones are forgotten, their groups' leftovers
        killed. Returns how many were adopted ready."""
        reap_children()
        adopted = 0
        # Engines held first: of two processes recorded for one replica, the one being
        # stopped is the one that goes.
        for record in sorted(read_state(self.config.state_file), key=lambda r: bool(r.get("stopping"))):
            pid, start = record["pid"], record.get("start_time")
            if not process_alive(pid, start):
                kill_leftovers(pid, start)
                if not group_gone(pid, start):
                    self.spawned[pid] = {**record, "stopping": True}  # looked at again on the next change
                continue
            self.spawned[pid] = dict(record)
            # The spec recorded holds the engine key the engine was started with, so the
            # readiness check below (and every later probe) presents it.
            engine = Engine(spec=record["spec"], state=S.STARTING, pid=pid, port=record.get("port"),
                            host=record.get("host") or "127.0.0.1", start_time=start, adopted=True,
                            started_at=record.get("started_at"))
            if record.get("log_path"):
                engine.log_path = Path(record["log_path"])
            rid = engine.replica_id
            if record.get("stopping") or rid in self.engines:
                log.info("replica %s: its engine (pid %s) was being stopped when the agent went away: stopping it",
                         rid, pid)
                self.spawned[pid]["stopping"] = True
                engine.state, engine.stopping = S.STOPPING, True
                if rid in self.engines:  # a second process of one replica: nothing to report
                    self._detach(self._terminate(engine))
                else:
                    self.engines[rid] = engine
                    self._detach(self._stop(engine))
                continue
            self.engines[rid] = engine
            if await self._ready(engine):
                engine.state = S.READY
                engine.task = asyncio.create_task(self._watch(engine))
                adopted += 1
                log.info("adopted engine of replica %s (pid %s, port %s)", rid, pid, engine.port)
            else:
                log.info("adopted engine of replica %s (pid %s, port %s), not ready yet", rid, pid, engine.port)
                engine.task = asyncio.create_task(self._resume_start(engine))
        self.save_state()
        return adopted

    def _detach(self, coro) -> None:
        """Run ``coro`` (a stop) as a task kept until done: :meth:`stop_all` waits for it."""
        task = asyncio.create_task(coro)
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)

    # -- desired set -----------------------------------------------------------------------
    def apply(self, replicas: list[AssignedReplica]) -> None:
        """Start what is newly assigned; stop what no longer is. On the first assign since
        this agent started, an adopted engine not in it is an orphan of the previous agent:
        its report says "stopped after the agent's restart: not assigned"."""
        first, self.assigned = not self.assigned, True
        wanted = {int(r["replica_id"]): r for r in replicas}
        for rid, spec in wanted.items():
            if rid not in self.engines:
                engine = Engine(spec=spec)
                self.engines[rid] = engine
                engine.task = asyncio.create_task(self._run(engine))
        for rid, engine in list(self.engines.items()):
            if rid not in wanted and not engine.stopping:
                engine.stopping = True
                if first and engine.adopted:
                    engine.error = ORPHAN_STOPPED
                    log.info("replica %s (pid %s): %s", rid, engine.pid, ORPHAN_STOPPED)
                self._detach(self._stop(engine))
        self._changed()

    # -- lifecycle -------------------------------------------------------------------------
    async def _run(self, engine: Engine) -> None:
        spec = engine.spec
        try:
            engine.state = S.DOWNLOADING
            self._changed()
            loop = asyncio.get_running_loop()

            def progress(done: int, total: int) -> None:  # called in the download thread
                with contextlib.suppress(RuntimeError):  # the loop closed while the thread ran on
                    loop.call_soon_threadsafe(self._download_progress, engine, done, total)

            weights = await asyncio.to_thread(
                fetch_weights, spec["weights"], self.config.cache_dir, server=self.server_url, token=self.token,
                cache=self.weights_cache, progress=progress,
            )
            engine.progress = None
            engine.weights_context_length = await asyncio.to_thread(weights_context_length, weights)
            engine.host = self.bind_host()
            tried: list[int] = []
            taken: list[str] = []
            while True:
                engine.port = self._pick_port(engine.host, avoid=tried)
                tried.append(engine.port)
                self._spawn(engine, weights)
                problem = await self._await_ready(engine, time.monotonic() + float(spec["startup_timeout_s"]))
                if problem is None:
                    break
                # Another process on the port: a failed start on that port, never a route there.
                taken.append(problem)
                await self._terminate(engine)
                engine.proc, engine.pid, engine.start_time = None, None, None
                if len(taken) >= PORT_TRIES:
                    raise _EngineFailed("; ".join(taken) + f": gave up after {PORT_TRIES} ports")
                log.warning("replica %s: %s; starting it on another port", engine.replica_id, problem)
                engine.error = "; ".join(taken) + ": starting on another port"
                self._changed()
            engine.error = ""
            await self._serve(engine)
        except asyncio.CancelledError:
            raise
        except (WeightsError, _EngineFailed, OSError, ValueError, KeyError, IndexError) as exc:
            await self._fail(engine, str(exc))

    def _spawn(self, engine: Engine, weights: Path) -> None:
        """Start ``engine``'s process on its host and port (in a session of its own, logging
        to its file) and record it in the state file before anything awaits."""
        spec = engine.spec
        engine.log_path = self.config.log_dir / f"replica-{engine.replica_id}.log"
        key = str(spec.get("api_key") or "")
        values = {
            "python": sys.executable,
            "weights_path": str(weights),
            "host": engine.host,
            "port": engine.port,
            "served_name": spec["served_name"],
            "gpus": ",".join(str(i) for i in spec["gpu_indices"]),
            "tp_size": max(1, len(spec["gpu_indices"])),
            "threads": max(1, int(spec.get("cpu_cores") or 1)),
            "api_key": key,
        }
        argv = render_command(spec["command"], values)
        env = engine_environment(dict(os.environ), spec.get("env"), values["gpus"], key)
        shown = " ".join(argv).replace(key, "***") if key else " ".join(argv)
        log.info("starting replica %s on %s:%s: %s", engine.replica_id, engine.host, engine.port, shown)
        with open(engine.log_path, "ab") as log_file:
            engine.proc = subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True, cwd=str(self.config.state_dir),
            )
        engine.pid = engine.proc.pid
        engine.start_time = process_start_time(engine.pid)
        engine.started_at = time.time()
        self._spawned(engine)
        engine.state = S.STARTING
        self._changed()

    async def _await_ready(self, engine: Engine, deadline: float) -> str | None:
        """Wait until ``engine`` is ready: alive, its readiness path answers 200 (naming its
        served model, for a ``/v1/models`` path) and the process listening on its port is of
        its own group (:func:`fleet.agent.sockets.port_holders`; docs/architecture.md,
        "Decisions": readiness proves identity). Returns None when ready, or the words for its
        port taken by another process ("port 20002 taken by pid 4711 (python3)"). Raises
        _EngineFailed when it exits, serves another model or is not ready by ``deadline``
        (monotonic seconds)."""
        pause = 0.02  # poll fast at first: somebody may be holding a request for this
        next_holders = 0.0
        while True:
            # Alive first: if our engine died (say its port was taken), whatever else
            # answers on that port must not pass for it.
            if not engine.alive():
                holders = await self._holders(engine)
                if holders is not None and holders.foreign:
                    return holders.taken_by(engine.port)
                raise _EngineFailed(f"{engine.exit_words()} while starting")
            problem = await self._probe(engine)
            answered = problem is None or isinstance(problem, _WrongModel)
            # Something accepted the connection: who? (at most once a second unless it is an
            # answer that would make it ready: /proc is read whole)
            if answered or (problem not in CONNECT_PROBLEMS and time.monotonic() >= next_holders):
                next_holders = time.monotonic() + 1.0
                holders = await self._holders(engine)
                if holders is not None and holders.foreign:
                    return holders.taken_by(engine.port)
                if answered and (holders is None or holders.ours):
                    if problem is not None:
                        raise _EngineFailed(str(problem))
                    return None
            if time.monotonic() > deadline:
                raise _EngineFailed(f"not ready after {engine.spec['startup_timeout_s']} s"
                                    + (f" ({problem})" if problem else ""))
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, self.config.readiness_poll_s)

    async def _holders(self, engine: Engine) -> sockets.PortHolders | None:
        """Who listens on ``engine``'s port (None where /proc cannot be read: then readiness
        is the readiness path answering, as before, said once in the log)."""
        global _NO_PROC_SAID
        if engine.port is None or engine.pid is None:
            return None
        holders = await asyncio.to_thread(sockets.port_holders, engine.port, engine.host, engine.pid)
        if holders is None and not _NO_PROC_SAID:
            _NO_PROC_SAID = True
            log.warning("cannot read /proc/net/tcp: an engine's readiness is its readiness path answering, "
                        "without checking which process listens on its port")
        return holders

    async def _resume_start(self, engine: Engine) -> None:
        """An adopted engine that was still starting: wait for it with what is left of its
        startup timeout (from ``started_at``), then watch it; fail it otherwise (a port taken
        cannot be retried here: the engine was started on it)."""
        try:
            left = float(engine.spec.get("startup_timeout_s") or 0)
            if engine.started_at:
                left -= time.time() - engine.started_at
            problem = await self._await_ready(engine, time.monotonic() + max(0.0, left))
            if problem is not None:
                raise _EngineFailed(problem)
            await self._serve(engine)
        except asyncio.CancelledError:
            raise
        except (_EngineFailed, OSError, ValueError, KeyError) as exc:
            await self._fail(engine, str(exc))

    def _download_progress(self, engine: Engine, done: int, total: int) -> None:
        """From the download thread (via the loop): report the fraction while downloading."""
        if engine.state == S.DOWNLOADING and not engine.stopping:
            engine.progress = round(done / total, 4) if total else None
            self.on_change()

    def _mirror_in_use(self) -> set[str]:
        """Names of mirrored weights this machine's engines use: never evicted."""
        return {e.spec["weights"].partition(":")[2] for e in list(self.engines.values())
                if str(e.spec.get("weights", "")).startswith("mirror:")}

    async def _serve(self, engine: Engine) -> None:
        """An engine that proved ready (a fresh start or a resumed one): report it ready, then
        watch it until it stops or fails."""
        engine.state = S.READY
        log.info("replica %s ready on port %s", engine.replica_id, engine.port)
        self._changed()
        await self._watch(engine)

    async def _watch(self, engine: Engine) -> None:
        """While ready: notice the engine exiting or no longer answering readiness; read its
        load every few seconds."""
        next_load = 0.0
        next_check = time.monotonic() + self.config.readiness_watch_s
        unready: dict[str, float] = {}  # kind of failure -> since when (monotonic)
        while not engine.stopping:
            if not engine.alive():
                await self._fail(engine, engine.exit_words())
                return
            if time.monotonic() >= next_check:
                problem = await self._probe(engine)
                now = time.monotonic()
                next_check = now + self.config.readiness_watch_s
                if problem is None:
                    if unready:
                        log.info("replica %s answers readiness again", engine.replica_id)
                    unready.clear()
                else:
                    kind = "hung" if problem == "no answer" else "unready"
                    if not unready:
                        log.warning("replica %s: readiness check failed (%s)", engine.replica_id, problem)
                    since = unready.setdefault(kind, now)
                    limit = self.config.hung_fail_s if kind == "hung" else self.config.unready_fail_s
                    if now - since >= limit:
                        path = engine.spec.get("readiness_path") or "/"
                        await self._fail(engine, f"engine stopped answering readiness ({path}: {problem}) "
                                                 f"for {now - since:.0f} s")
                        return
            if engine.spec.get("metrics_path") and time.monotonic() >= next_load:
                next_load = time.monotonic() + self.config.load_poll_s
                running, waiting = await read_load(
                    self._http, f"{engine.base_url()}{url_path(engine.spec['metrics_path'])}",
                    engine.spec.get("metric_running", ""), engine.spec.get("metric_waiting", ""),
                    headers=engine.probe_headers,
                )
                if (running, waiting) != (engine.running, engine.waiting):
                    engine.running, engine.waiting = running, waiting
                    self.on_change()
            if engine.pid is not None:
                await wait_exit(engine.pid, 0.5)  # wakes the moment the engine exits
            else:
                await asyncio.sleep(0.5)

    async def _fail(self, engine: Engine, why: str) -> None:
        # Engines may print their arguments (SGLang its server_args): the key stays here.
        tail = engine.log_tail(secret=str(engine.spec.get("api_key") or ""))
        engine.error = why + (f"\n--- last log lines ---\n{tail}" if tail else "")
        log.warning("replica %s failed: %s", engine.replica_id, why)
        if engine.pid is not None:
            await self._terminate(engine)
        engine.state = S.FAILED
        self._changed()

    async def _ready(self, engine: Engine) -> bool:
        """One readiness check of an engine adopted: its readiness path answers (with its
        served name) and the process listening on its port is of its group."""
        if await self._probe(engine) is not None:
            return False
        holders = await self._holders(engine)
        return holders is None or (bool(holders.ours) and not holders.foreign)

    async def _probe(self, engine: Engine) -> str | None:
        """None if the engine answers its readiness path with 200 — and, for a ``/v1/models``
        path (an OpenAI server), lists its served name — else what went wrong ("no answer"
        when it accepted the connection but did not answer in time; a :class:`_WrongModel`
        when it answered with other models)."""
        if engine.port is None:
            return "no port"
        path = url_path(engine.spec.get("readiness_path") or "/")
        try:
            response = await self._http.get(f"{engine.base_url()}{path}", headers=engine.probe_headers)
        except httpx.TimeoutException as exc:
            return "no answer" if not isinstance(exc, httpx.ConnectTimeout) else "connect timeout"
        except httpx.HTTPError as exc:
            return type(exc).__name__
        if response.status_code != 200:
            return f"HTTP {response.status_code}"
        if path.split("?", 1)[0].rstrip("/") == "/v1/models":
            return served_name_problem(response, engine.spec.get("served_name", ""))
        return None

    def _pick_port(self, host: str, avoid: list[int] | None = None) -> int:
        """The first port of the range free on ``host`` that no engine of ours holds (nor one
        being stopped) and not in ``avoid`` (ports this start already found taken). The check
        races the engine's bind: :meth:`_await_ready`'s identity check is the real guard."""
        used = {e.port for e in self.engines.values() if e.port} | {r.get("port") for r in self.spawned.values()}
        used |= set(avoid or ())
        for port in range(self.config.port_min, self.config.port_max + 1):
            if port not in used and _port_free(host, port):
                return port
        raise _EngineFailed(f"no free port in {self.config.port_min}-{self.config.port_max}")

    async def _stop(self, engine: Engine) -> None:
        if engine.task is not None and engine.task is not asyncio.current_task():
            engine.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await engine.task
        await self._terminate(engine)
        if engine.state != S.FAILED:
            engine.state = S.STOPPED
        self.finished[engine.replica_id] = engine.report() | {"state": S.STOPPED.value if engine.state != S.FAILED else S.FAILED.value}
        self.engines.pop(engine.replica_id, None)
        log.info("replica %s stopped", engine.replica_id)
        self._changed()

    async def _terminate(self, engine: Engine) -> None:
        """SIGTERM to the engine's process group, SIGKILL after the grace; its state-file
        record says "stopping" from the start and goes once the whole group is gone."""
        if engine.pid is None:
            return
        if engine.pid in self.spawned and not self.spawned[engine.pid].get("stopping"):
            self.spawned[engine.pid]["stopping"] = True
            self.save_state()
        if not engine.alive():
            self._reap(engine)
            kill_leftovers(engine.pid, engine.start_time)
            await self._wait_group_gone(engine)
            return
        self._kill_group(engine.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.stop_grace_s
        while engine.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if engine.alive():
            log.warning("replica %s ignored SIGTERM for %.0f s: killing", engine.replica_id, self.config.stop_grace_s)
            self._kill_group(engine.pid, signal.SIGKILL)
            while engine.alive():
                await asyncio.sleep(0.05)
        else:
            # The leader is gone; children it left in its group (workers) go too.
            self._kill_group(engine.pid, signal.SIGKILL)
        self._reap(engine)
        await self._wait_group_gone(engine)

    async def _wait_group_gone(self, engine: Engine, timeout_s: float = 5.0) -> None:
        """Forget ``engine``'s process once its whole group is seen gone (a few seconds for
        the last members to be reaped); a group still there stays in the state file."""
        deadline = time.monotonic() + timeout_s
        while not group_gone(engine.pid, engine.start_time) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._forget_gone():
            self.save_state()

    @staticmethod
    def _reap(engine: Engine) -> None:
        if engine.proc is not None:
            with contextlib.suppress(Exception):
                engine.proc.wait(timeout=0)

    @staticmethod
    def _kill_group(pid: int, sig: int) -> None:
        kill_group(pid, sig)

    async def stop_all(self) -> None:
        """Stop every engine (``llmgw up`` exiting), and wait for stops already under way."""
        fresh = [e for e in self.engines.values() if not e.stopping]
        for engine in fresh:
            engine.stopping = True
        # Stops under way (apply's, adoption's) are tasks in _detached: waited for too.
        await asyncio.gather(*(self._stop(e) for e in fresh), *list(self._detached), return_exceptions=True)

    async def close(self) -> None:
        """Stop watching (engines keep running: the state file lists them) and close."""
        for engine in self.engines.values():
            if engine.task is not None:
                engine.task.cancel()
        for task in list(self._detached):
            task.cancel()
        await self._http.aclose()


def served_name_problem(response: httpx.Response, served_name: str) -> str | None:
    """None if an OpenAI ``/v1/models`` answer lists ``served_name`` among its ids, else a
    :class:`_WrongModel` saying what it serves instead (docs/architecture.md, "Decisions":
    readiness proves identity)."""
    try:
        data = response.json().get("data")
        ids = [str(item.get("id")) for item in data if isinstance(item, dict)]
    except (ValueError, AttributeError, TypeError):
        return _WrongModel("its /v1/models answer is not a model list")
    if served_name in ids:
        return None
    return _WrongModel(f"the engine serves {ids}, not {served_name!r} (check the profile's served-name option)")


#: Starts that find their port taken, each on another port, before the start fails.
PORT_TRIES = 3
#: What an adopted engine's report says when the first assign after a restart omits it.
ORPHAN_STOPPED = "stopped after the agent's restart: not assigned"
#: Probe problems meaning nothing accepted the connection (no need to ask who listens).
CONNECT_PROBLEMS = frozenset({"no port", "ConnectError", "connect timeout"})
_NO_PROC_SAID = False


class _WrongModel(str):
    """A readiness answer naming other models than the replica's served name."""


class _EngineFailed(RuntimeError):
    pass
