"""Engine processes on this machine: start from a profile's template, watch readiness and
exit, read load, stop (SIGTERM to the group, SIGKILL after a grace), adopt after a restart.

Each engine runs in its own session (process group), logs to its own file (never a pipe to
the agent, which would break when the agent re-executes) and is recorded in a state file
(pid, process start time, address, port, served name, its spec with the engine key; mode
0600) so a restarted agent can adopt it.

Engines are reachable only through the gateway (docs/architecture.md, "Security": engine keys):
each listens on the address the agent advertises (never every interface unless ``--bind-host``
says so), is started with its replica's engine key, which the probes here send too, and
inherits none of the agent's secrets (:func:`engine_environment`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx

from fleet.agent.cache import WeightsCache
from fleet.agent.metrics import read_load
from fleet.agent.weights import WeightsError, fetch_weights
from fleet.protocol import AssignedReplica, ReplicaReport, port_free
from fleet.states import ReplicaState

log = logging.getLogger(__name__)
S = ReplicaState


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


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/PID/stat), or None if gone.
    With the pid it identifies a process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            data = fh.read()
    except OSError:
        return None
    return data.rsplit(")", 1)[1].split()[19]


def process_alive(pid: int, start_time: str | None) -> bool:
    """True if ``pid`` is the process that started at ``start_time`` and has not exited. An
    adopted engine is still our child after an in-place restart (exec keeps the pid): once
    it exits it is a zombie until reaped, so zombies are reaped and count as dead."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    if fields[19] != start_time:
        return False
    if fields[0] in ("Z", "X"):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def reap_children() -> None:
    """Collect exited children so their pids are not mistaken for live engines."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def url_path(path: str) -> str:
    """A profile's readiness or metrics path as the path of the engine's own URL: one that
    does not start with "/" (``@host/…`` would name another host) is made one."""
    return path if path.startswith("/") else "/" + path


def render_command(template: str, values: dict[str, object]) -> list[str]:
    """Split a command template like a shell would and fill each word's placeholders."""
    return [word.format(**values) for word in shlex.split(template)]


#: Inherited variables an engine never gets: the agent's own settings and secrets (its
#: token, and on an all-in-one machine the control plane's secret key, database URL, admin
#: password, metrics token), all spelled ``LLMGW_*``.
SECRET_PREFIXES = ("LLMGW_",)
#: Inherited variables that would override the address and port the agent chose
#: (llama-cpp-python's server lets ``HOST``/``PORT`` win over ``--host``/``--port``).
#: A profile's env may still set them.
BIND_OVERRIDES = ("HOST", "PORT")


def engine_environment(inherited: dict[str, str], profile_env: dict[str, str] | None, gpus: str,
                       api_key: str) -> dict[str, str]:
    """The environment an engine starts with (docs/architecture.md, "Security": engine keys;
    engines inherit none of the agent's secrets): ``inherited`` (the agent's environment)
    without any ``LLMGW_*`` variable and without ``HOST``/``PORT``, then the profile's env with
    ``{api_key}`` in its values replaced by the replica's key, then ``CUDA_VISIBLE_DEVICES``
    (the GPUs assigned, "" for none). Without a key (a control plane from before engine keys) a
    variable that would hold only the key is left out rather than set empty (an empty key means
    "no key" to some engines and an impossible one to others)."""
    env = {k: v for k, v in inherited.items()
           if not k.upper().startswith(SECRET_PREFIXES) and k.upper() not in BIND_OVERRIDES}
    for name, value in (profile_env or {}).items():
        value = str(value)
        if not api_key and value.strip() == "{api_key}":
            continue
        env[str(name)] = value.replace("{api_key}", api_key)
    env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


def resolve_bind_host(address: str) -> str:
    """The IP address to listen on for an advertised ``address`` (an IP, or a host name,
    resolved to its first address); ValueError if a name does not resolve, or if it is
    (or resolves to) the unspecified address: every interface is ``--bind-host``'s to ask."""
    address = address.strip().strip("[]")
    try:
        ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 address may carry a %zone
        resolved = address
    except ValueError:
        try:
            infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise ValueError(f"cannot resolve the advertised address {address!r}: {exc}") from exc
        resolved = infos[0][4][0]
    if ipaddress.ip_address(resolved.split("%", 1)[0]).is_unspecified:
        raise ValueError(f"the advertised address {address!r} is {resolved}, every interface: engines listen "
                         "there only with --bind-host 0.0.0.0")
    return resolved


def probe_host(host: str) -> str:
    """Where this machine reaches an engine listening on ``host``, ready for a URL: the
    address itself (IPv6 in brackets); loopback for the wildcard addresses."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


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
        }

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        if self.pid is None:
            return False
        return process_alive(self.pid, self.start_time)

    def log_tail(self, lines: int = 15) -> str:
        """The log's last ``lines`` lines, within its last 8 KiB, each whole: a line cut by
        the window is left out (a key printed on it would be cut too, and its end would
        pass the masking of the whole key)."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                start = max(0, fh.tell() - 8192)
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
        return "\n".join(data.decode("utf-8", "replace").strip().splitlines()[-lines:])


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
        self.save_state()
        self.on_change()

    # -- state file (adoption) -------------------------------------------------------------
    def save_state(self) -> None:
        data = {
            str(e.replica_id): {
                "pid": e.pid, "start_time": e.start_time, "host": e.host, "port": e.port,
                "served_name": e.spec["served_name"], "spec": e.spec,
                "log_path": str(e.log_path) if e.log_path else None,
            }
            for e in self.engines.values()
            if e.pid is not None and not e.stopping
        }
        tmp = self.config.state_file.with_suffix(".tmp")
        # 0600 from the start: the specs hold the engine keys.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(data))
        os.chmod(tmp, 0o600)  # a file left by an older agent keeps its mode otherwise
        tmp.replace(self.config.state_file)

    async def adopt(self) -> int:
        """Take over engines a previous agent process started and left running: pid alive
        with the recorded start time, and its readiness path answers. Returns how many."""
        reap_children()
        try:
            data = json.loads(self.config.state_file.read_text())
        except (OSError, ValueError):
            return 0
        adopted = 0
        for key, item in data.items():
            pid, start = item.get("pid"), item.get("start_time")
            spec = item.get("spec")
            if not pid or not spec or process_start_time(pid) != start:
                continue
            # The spec recorded holds the engine key the engine was started with, so the
            # readiness check below (and every later probe) presents it.
            engine = Engine(spec=spec, state=S.STARTING, pid=pid, port=item.get("port"),
                            host=item.get("host") or "127.0.0.1", start_time=start, adopted=True)
            if item.get("log_path"):
                engine.log_path = Path(item["log_path"])
            if await self._ready(engine):
                engine.state = S.READY
                self.engines[engine.replica_id] = engine
                engine.task = asyncio.create_task(self._watch(engine))
                adopted += 1
                log.info("adopted engine of replica %s (pid %s, port %s)", key, pid, engine.port)
            else:
                log.info("not adopting replica %s: pid %s does not answer readiness", key, pid)
                self._kill_group(pid, signal.SIGKILL)
        self.save_state()
        return adopted

    # -- desired set -----------------------------------------------------------------------
    def apply(self, replicas: list[AssignedReplica]) -> None:
        """Start what is newly assigned; stop what no longer is."""
        wanted = {int(r["replica_id"]): r for r in replicas}
        for rid, spec in wanted.items():
            if rid not in self.engines:
                engine = Engine(spec=spec)
                self.engines[rid] = engine
                engine.task = asyncio.create_task(self._run(engine))
        for rid, engine in list(self.engines.items()):
            if rid not in wanted and not engine.stopping:
                engine.stopping = True
                asyncio.create_task(self._stop(engine))
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
            engine.host = self.bind_host()
            engine.port = self._pick_port(engine.host)
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
            engine.state = S.STARTING
            self._changed()
            deadline = time.monotonic() + float(spec["startup_timeout_s"])
            pause = 0.02  # poll fast at first: somebody may be holding a request for this
            while not (engine.alive() and await self._ready(engine)):
                # Alive first: if our engine died (say its port was taken), whatever else
                # answers on that port must not pass for it.
                if not engine.alive():
                    raise _EngineFailed(f"engine exited with code {engine.proc.returncode} while starting")
                if time.monotonic() > deadline:
                    raise _EngineFailed(f"not ready after {spec['startup_timeout_s']} s")
                await asyncio.sleep(pause)
                pause = min(pause * 1.5, self.config.readiness_poll_s)
            engine.state = S.READY
            log.info("replica %s ready on port %s", engine.replica_id, engine.port)
            self._changed()
            await self._watch(engine)
        except asyncio.CancelledError:
            raise
        except (WeightsError, _EngineFailed, OSError, ValueError, KeyError, IndexError) as exc:
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

    async def _watch(self, engine: Engine) -> None:
        """While ready: notice the engine exiting or no longer answering readiness; read its
        load every few seconds."""
        next_load = 0.0
        next_check = time.monotonic() + self.config.readiness_watch_s
        unready: dict[str, float] = {}  # kind of failure -> since when (monotonic)
        while not engine.stopping:
            if not engine.alive():
                code = engine.proc.returncode if engine.proc is not None else "?"
                await self._fail(engine, f"engine exited with code {code}")
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
            await asyncio.sleep(0.5)

    async def _fail(self, engine: Engine, why: str) -> None:
        tail = engine.log_tail()
        key = str(engine.spec.get("api_key") or "")
        if key:  # engines may print their arguments (SGLang its server_args): the key stays here
            tail = tail.replace(key, "***")
        engine.error = why + (f"\n--- last log lines ---\n{tail}" if tail else "")
        log.warning("replica %s failed: %s", engine.replica_id, why)
        if engine.pid is not None:
            await self._terminate(engine)
        engine.state = S.FAILED
        self._changed()

    async def _ready(self, engine: Engine) -> bool:
        return await self._probe(engine) is None

    async def _probe(self, engine: Engine) -> str | None:
        """None if the engine answers its readiness path with 200, else what went wrong
        ("no answer" when it accepted the connection but did not answer in time)."""
        if engine.port is None:
            return "no port"
        url = f"{engine.base_url()}{url_path(engine.spec.get('readiness_path') or '/')}"
        try:
            response = await self._http.get(url, headers=engine.probe_headers)
        except httpx.TimeoutException as exc:
            return "no answer" if not isinstance(exc, httpx.ConnectTimeout) else "connect timeout"
        except httpx.HTTPError as exc:
            return type(exc).__name__
        return None if response.status_code == 200 else f"HTTP {response.status_code}"

    def _pick_port(self, host: str) -> int:
        used = {e.port for e in self.engines.values() if e.port}
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
        """SIGTERM to the engine's process group, SIGKILL after the grace."""
        if engine.pid is None or not engine.alive():
            self._reap(engine)
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

    @staticmethod
    def _reap(engine: Engine) -> None:
        if engine.proc is not None:
            with contextlib.suppress(Exception):
                engine.proc.wait(timeout=0)

    @staticmethod
    def _kill_group(pid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

    async def stop_all(self) -> None:
        """Stop every engine (``llmgw up`` exiting)."""
        for engine in list(self.engines.values()):
            engine.stopping = True
        await asyncio.gather(*(self._stop(e) for e in list(self.engines.values())), return_exceptions=True)

    async def close(self) -> None:
        for engine in self.engines.values():
            if engine.task is not None:
                engine.task.cancel()
        await self._http.aclose()


class _EngineFailed(RuntimeError):
    pass
