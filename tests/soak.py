"""The randomized soak (docs/architecture.md, "Testing": the soak), shared by
tests/system/test_soak.py and bench/soak.py.

A real control plane (``webs`` web processes behind one address, ``workers`` workers, on the
database the caller set up), three real agents — ``gpu-a`` with two simulated 24576 MiB GPUs,
``gpu-b`` with one 49152 MiB GPU (``--fake-gpus``) and the CPU-only ``cpu`` — and fast fake
engines. A driver seeded with ``random.Random(seed)`` applies random operations for
``duration_s``, each logged with its time: catalog edits through the ORM (create, edit and
delete models and profiles; min/max/on-demand), ``llmgw stop``/``start``, kill -9 or restart
an agent (preferring one with a replica draining or stopping), kill -9 a worker or a web
process (brought back), occupy an engine port from outside, kill -9 an engine (half the time
taking its port at once), load bursts and silences through the gateway, clients that
disconnect mid-stream.

Every ``CHECK_INTERVAL_S`` a checker reads the OS (tests/soak_os.py) and fails an invariant:

* **gpu-memory** — on each simulated GPU, the engines whose ``CUDA_VISIBLE_DEVICES`` name it
  carry (``SOAK_GPU_MEMORY_MIB``, from their profile) no more than its memory; an engine of a
  CPU-only agent names no GPU.
* **unwanted-engine** — every engine's key (``--api-key``) is a replica row's engine key, on
  the engine's agent, in a wanted state (placing … ready); an engine that is not (row
  draining, stopping, stopped, failed, lost, on another agent, or deleted) is gone within
  ``ORPHAN_GRACE_S``, counted while its agent, a web process to tell it and a worker to plan
  (drain, stop, settle a lost replica) run. Two engines with one key: the same grace.
* **ready-identity** — the process listening on a ready replica's port is that replica's
  engine (``READY_GRACE_S`` for the agent to report a change).
* **routing** — a 200 names its replica (``X-Llmgw-Replica``) and the process that answered
  (``system_fingerprint``, the fake engine's ``--echo-pid``): that process's key is the
  replica's engine key.
* **answered** — every request is answered within ``REQUEST_BOUND_S``: 200, or a documented
  error status (``DOCUMENTED_ERRORS``) with OpenAI's error shape. A connection that fails while
  the harness has a web process down is excused (counted, not a violation).

When the operations stop (every process back, the cluster started, the load stopped), the
cluster must **converge** within ``CONVERGE_BOUND_S``: each model's ``ModelState.desired``
(between its min and max) replicas ready, none on the way up or down, each ready replica's
engine running with the current spec (served name, ``--tokens`` of its profile's command,
GPU count and memory; a current ``spec_hash``, fleet.control.specs, where it exists), and no
other engine.

A failure's report starts with the seed and ends with the operation log; replay it with
``bench/soak.py --seed N`` (or ``SoakConfig(seed=N)``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.cluster import FAKE_ENGINE
from tests.multicluster import FAULT_ENV, MultiCluster
from tests.processes import Proc
from tests.soak_checks import (AGENTS, COLD_START_TIMEOUT_S, CONVERGE_BOUND_S, PORT_BASE, REQUEST_BOUND_S, Answer,
                                InvariantChecks)
from tests.soak_os import GPU_MEMORY_ENV, agent_processes, engine_processes, listeners

SOAK_ENV = {**FAULT_ENV, "LLMGW_GATEWAY_AUTH": "false"}
#: A worker killed while leading is replaced once its lease ran out and a worker renews:
#: LLMGW_LEADER_LEASE + LLMGW_LEADER_RENEW (their defaults; fleet.control.leader).
LEADER_TAKEOVER_S = 5.0 + 1.0


@dataclass
class SoakConfig:
    """One soak: ``seed`` draws every operation; ``duration_s`` of operations; ``webs`` and
    ``workers`` processes (production mode: 2 and 2 on PostgreSQL + Redis, set by the caller)."""

    seed: int = 1
    duration_s: float = 60.0
    webs: int = 1
    workers: int = 1
    load_threads: int = 3
    converge_bound_s: float = CONVERGE_BOUND_S
    #: The agents' engine ports start here (100 each): two soaks at once need bases 300 apart.
    port_base: int = PORT_BASE


@dataclass
class SoakResult:
    """What one soak saw: its operation log, counts, violations (each with its time and
    invariant) and the seconds it took to converge (None: it did not)."""

    seed: int
    duration_s: float = 0.0
    production: bool = False
    operations: list[str] = field(default_factory=list)
    checks: int = 0
    requests: int = 0
    excused: int = 0
    violations: list[str] = field(default_factory=list)
    converge_s: float | None = None
    logs: str = ""

    def report(self, with_logs: bool = False) -> str:
        """The seed, the counts, every violation, the operation log and how to replay."""
        lines = [f"soak seed {self.seed}: {len(self.operations)} operations, {self.checks} invariant checks, "
                 f"{self.requests} requests ({self.excused} excused by a web process down), "
                 f"{len(self.violations)} violations, converged "
                 + (f"in {self.converge_s:.1f} s" if self.converge_s is not None else "NOT")]
        lines += [f"  VIOLATION {v}" for v in self.violations[:60]]
        if len(self.violations) > 60:
            lines.append(f"  … and {len(self.violations) - 60} more")
        lines.append("operation log:")
        lines += [f"  {op}" for op in self.operations]
        minutes = self.duration_s / 60
        lines.append(f"replay: .venv/bin/python bench/soak.py --seed {self.seed} --minutes {minutes:g} "
                     f"--run-minutes {minutes:g}" + (" --production" if self.production else ""))
        if with_logs:
            lines.append(self.logs)
        return "\n".join(lines)


class SoakCluster(MultiCluster):
    """MultiCluster with the soak's agents: simulated GPUs and port ranges of their own."""

    def __init__(self, log_dir: Path, tokens: dict[str, str], webs: int, workers: int,
                 port_base: int = PORT_BASE) -> None:
        self.up_since: dict[str, float | None] = {name: None for name in tokens}
        self.port_base = port_base
        super().__init__(log_dir, tokens, webs=webs, workers=workers, env=SOAK_ENV)

    def ports_of(self, name: str) -> range:
        """The engine ports of agent ``name``: 100 of its own from ``port_base``."""
        low = self.port_base + 100 * list(AGENTS).index(name)
        return range(low, low + 100)

    def start_agent(self, name: str) -> Proc:
        a = self.agents[name]
        ports = self.ports_of(name)
        a.ports = f"{ports[0]}-{ports[-1]}"
        a.extra = ["--fake-gpus", AGENTS[name]] if AGENTS[name] else []
        proc = super().start_agent(name)
        self.up_since[name] = time.monotonic()
        return proc

    def agent_down(self, name: str, sig: int) -> None:
        """The agent ends (``sig``: SIGKILL leaves its engines; SIGTERM stops them)."""
        self.up_since[name] = None
        a = self.agents[name]
        if sig == signal.SIGKILL:
            self.kill_agent(name)
        a.proc.stop(sig, timeout_s=20)

    def kill_worker(self, i: int) -> None:
        """kill -9 worker ``i`` and its task processes (its process group); ``start_worker(i)``
        brings it back."""
        proc = self.workers[i]
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stop(timeout_s=5)

    def agent_dirs(self) -> dict[Path, str]:
        return {a.state_dir: name for name, a in self.agents.items()}


class Impostor:
    """Something else listening on an engine port: answers every GET 200 (a readiness probe
    passes) and every POST a 200 completion naming itself, so traffic routed to it shows."""

    def __init__(self, port: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                body = json.dumps({"object": "list", "data": [], "id": "impostor", "choices": [],
                                   "system_fingerprint": f"impostor-pid-{os.getpid()}-port-{port}"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.port = port
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Soak(InvariantChecks):
    """One soak run (see the module's docstring). ``run()`` returns a SoakResult; every
    process it started is stopped and every engine under ``log_dir`` killed on return."""

    def __init__(self, config: SoakConfig, log_dir: Path) -> None:
        self.config = config
        self.log_dir = log_dir
        self.rng = random.Random(config.seed)
        self.result = SoakResult(config.seed, config.duration_s, config.webs > 1)
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.stop_ops = threading.Event()
        self.stop_all = threading.Event()
        self.answers: list[Answer] = []
        self.model_names: list[str] = []
        self.load_mode = "steady"  # steady | burst | silence
        self.web_down: list[list[float]] = []  # [down_at, up_at or inf]
        #: [down_at, when its successor can lead or inf]: a worker killed (the planner's passes stop).
        self.worker_down: list[list[float]] = []
        self.impostors: dict[int, tuple[Impostor, float]] = {}
        #: Engine key → when (monotonic) the soak killed that engine (crash_engine).
        self.crashed_at: dict[str, float] = {}
        self.pending: list[tuple[float, str, object]] = []  # (due, what, arg): bring-backs
        self.cluster: SoakCluster | None = None
        # What the checker has learnt.
        self.keys: dict[int, str] = {}  # replica id → engine key (kept after its row goes)
        self.pid_keys: dict[int, str] = {}  # engine pid → key (the latest process of that pid)
        self.unwanted_since: dict[tuple[int, int], float] = {}
        self.reported: set[tuple[str, object]] = set()
        self.ready_wrong_since: dict[int, float] = {}
        self.serial = 0

    # -- log -------------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.t0

    def op(self, text: str) -> None:
        with self.lock:
            self.result.operations.append(f"{self.now():7.2f}s {text}")

    def violate(self, invariant: str, text: str, once: object = None) -> None:
        with self.lock:
            if once is not None:
                if (invariant, once) in self.reported:
                    return
                self.reported.add((invariant, once))
            self.result.violations.append(f"{self.now():7.2f}s [{invariant}] {text}")

    # -- run -------------------------------------------------------------------------------
    def run(self) -> SoakResult:
        from catalog.models import ClusterSettings
        from fleet.models import Agent

        settings = ClusterSettings.get_solo()
        settings.stopped = False
        settings.cold_start_timeout_s = COLD_START_TIMEOUT_S
        settings.scale_up_after_s, settings.scale_down_after_s = 3, 5
        settings.default_idle_timeout_s, settings.min_idle_before_eviction_s = 8, 2
        settings.save()
        tokens = {name: Agent.create_with_token(name)[1] for name in AGENTS}
        threads: list[threading.Thread] = []
        try:
            self.cluster = SoakCluster(self.log_dir, tokens, self.config.webs, self.config.workers,
                                       self.config.port_base)
            self.op(f"cluster up: {self.config.webs} web, {self.config.workers} worker, agents {AGENTS}")
            self.create_profile(0)
            self.create_profile(1)  # simulated GPUs in use from the start
            for _ in range(3):
                self.create_model()
            threads = [threading.Thread(target=self._guard(self.check_loop), daemon=True, name="soak-check")]
            threads += [threading.Thread(target=self._guard(self.load_loop), args=(i,), daemon=True,
                                         name=f"soak-load-{i}") for i in range(self.config.load_threads)]
            for t in threads:
                t.start()
            self.drive()
            self.settle()
            self.result.converge_s = self.converge()
        finally:
            self.stop_ops.set()
            self.stop_all.set()
            for t in threads:
                t.join(REQUEST_BOUND_S + 15)
            self.check_answers(final=True)
            for impostor, _ in self.impostors.values():
                impostor.close()
            if self.cluster is not None:
                self.result.logs = self.cluster.logs(tail=4000)
                try:
                    self.cluster.stop()
                finally:
                    self.kill_every_agent()
                    self.kill_every_engine()
        return self.result

    def _guard(self, fn):
        def run(*args):
            from django.db import connection

            try:
                fn(*args)
            except Exception as exc:  # a harness error is a failed soak, never a silent thread
                self.violate("harness", f"{threading.current_thread().name} raised {type(exc).__name__}: {exc}")
            finally:
                connection.close()
        return run

    def kill_every_agent(self) -> None:
        """Agents still running under the soak's directory once the cluster stopped (its
        stop ends every agent it started) are killed, converged or not, and each is a harness
        violation: a second agent of one name keeps engines nobody tells to stop."""
        for pid, state_dir in agent_processes(self.log_dir).items():
            self.violate("harness", f"agent process {pid} (state directory {state_dir.name}) still ran after the "
                                    "cluster stopped: killed")
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)  # its own session (tests.processes.Proc)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def kill_every_engine(self) -> None:
        """Engines still running under the soak's directory (orphans included) are killed."""
        for engine in engine_processes(self.log_dir, self.cluster.agent_dirs()):
            with contextlib.suppress(OSError):
                os.killpg(engine.pgid, signal.SIGKILL)

    # -- the driver ------------------------------------------------------------------------
    OPERATIONS = (("create_model", 3), ("edit_model", 5), ("delete_model", 2), ("create_profile", 1),
                  ("edit_profile", 3), ("delete_profile", 1), ("stop_start", 1), ("kill_agent", 2),
                  ("restart_agent", 1), ("kill_worker", 1), ("kill_web", 1), ("occupy_port", 2), ("crash_engine", 1), ("load", 3))

    def drive(self) -> None:
        names, weights = zip(*self.OPERATIONS)
        deadline = time.monotonic() + self.config.duration_s  # from the cluster being up
        while time.monotonic() < deadline:
            self.bring_back(due_only=True)
            name = self.rng.choices(names, weights)[0]
            try:
                getattr(self, name)()
            except Exception as exc:
                self.op(f"{name} raised {type(exc).__name__}: {str(exc)[:200]}")
            self.stop_ops.wait(self.rng.uniform(0.5, 3.0))
        self.stop_ops.set()

    def settle(self) -> None:
        """Operations over: every process back, ports freed, cluster started, load stopped."""
        deadline = time.monotonic() + 120
        self.bring_back(due_only=False)
        while self.pending and time.monotonic() < deadline:
            time.sleep(1.0)
            self.bring_back(due_only=False)
        for what, arg in [(w, a) for _, w, a in self.pending]:
            self.violate("harness", f"{what} {arg} could not be brought back within 120 s")
        for port in list(self.impostors):
            self.impostors.pop(port)[0].close()
            self.op(f"port {port} freed")
        from catalog.models import ClusterSettings

        if ClusterSettings.get_solo().stopped:
            self._llmgw("start")
        self.load_mode = "silence"
        self.op("operations stop; load stops; waiting for convergence")

    def later(self, delay_s: float, what: str, arg: object) -> None:
        self.pending.append((time.monotonic() + delay_s, what, arg))

    def bring_back(self, due_only: bool) -> None:
        now = time.monotonic()
        keep = []
        # Web processes and workers first: an agent waits to connect, which it cannot while
        # the only web process waits behind it.
        for due, what, arg in sorted(self.pending, key=lambda item: item[1] == "agent"):
            if due_only and due > now:
                keep.append((due, what, arg))
                continue
            try:
                if what == "agent":
                    self.cluster.start_agent(arg)
                elif what == "worker":
                    self.cluster.start_worker(arg)
                    with self.lock:
                        for window in self.worker_down:
                            if window[1] == float("inf"):
                                # The one killed may have led: its lease runs out first.
                                window[1] = max(time.monotonic(), window[0] + LEADER_TAKEOVER_S)
                elif what == "web":
                    self.cluster.start_web(arg)
                    with self.lock:
                        for window in self.web_down:
                            if window[1] == float("inf"):
                                window[1] = time.monotonic() + 1.0
            except Exception as exc:  # tried again at the next step; the log says so
                self.op(f"{what} {arg} did not come back ({type(exc).__name__}: {str(exc)[:160]}); trying again")
                keep.append((time.monotonic() + 1.0, what, arg))
                continue
            self.op(f"{what} {arg} back")
        self.pending = keep
        for port, (impostor, until) in list(self.impostors.items()):
            if until <= now:
                impostor.close()
                del self.impostors[port]
                self.op(f"port {port} freed")

    def _name(self, kind: str) -> str:
        self.serial += 1
        return f"soak-{kind}-{self.config.seed}-{self.serial}"

    def _gpu_need(self, models) -> int:
        return sum(m.min_replicas * m.profile.gpus_needed for m in models if m.profile)

    def create_profile(self, gpus: int | None = None):
        from catalog.models import Profile

        if Profile.objects.filter(name__startswith="soak-p-").count() >= 5:
            return None
        gpus = self.rng.choice([0, 1]) if gpus is None else gpus
        mib = self.rng.choice([8192, 12288, 20480]) if gpus else 0
        tokens = self.rng.choice([4, 8, 16])
        profile = Profile(name=self._name("p"), engine=Profile.Engine.CUSTOM, command=self._command(tokens),
                          gpus_needed=gpus, gpu_memory_mib=mib, cpu_cores=0 if gpus else 0.1,
                          memory_mib=0 if gpus else 64, env={GPU_MEMORY_ENV: str(mib)},
                          readiness_path="/v1/models", startup_timeout_s=20)
        profile.full_clean()
        profile.save()
        self.op(f"create profile {profile.name}: {gpus} GPU x {mib} MiB, --tokens {tokens}")
        return profile

    @staticmethod
    def _command(tokens: int) -> str:
        return (f"{{python}} {FAKE_ENGINE} --host {{host}} --port {{port}} --served-name {{served_name}}"
                f" --api-key {{api_key}} --echo-pid --tokens {tokens} --token-delay-ms 20")

    def _profiles(self):
        from catalog.models import Profile

        return list(Profile.objects.filter(name__startswith="soak-p-").order_by("id"))

    def _models(self):
        from catalog.models import Model

        return list(Model.objects.filter(name__startswith="soak-m-").select_related("profile").order_by("id"))

    def _save_model(self, model, what: str) -> None:
        from django.core.exceptions import ValidationError

        others = [m for m in self._models() if m.pk != model.pk]
        if self._gpu_need([*others, model]) > 2:
            self.op(f"skip {what}: the catalog's minimums would need more than 2 of the 3 GPUs")
            return
        try:
            model.full_clean()
        except ValidationError as exc:
            self.op(f"skip {what}: invalid ({'; '.join(exc.messages)[:120]})")
            return
        model.save()
        self.op(what)
        self.model_names = [m.name for m in self._models()]

    def create_model(self) -> None:
        from catalog.models import Model

        if len(self._models()) >= 6:
            return self.edit_model()
        profiles = self._profiles() or [self.create_profile(0)]
        profile = self.rng.choice(profiles)
        on_demand = self.rng.random() < 0.3
        low = 0 if on_demand else self.rng.choice([0, 1, 1, 2])
        high = self.rng.randint(max(low, 1), 3)
        model = Model(name=self._name("m"), weights="file:/dev/null", profile=profile, min_replicas=low,
                      max_replicas=high, on_demand=on_demand)
        self._save_model(model, f"create model {model.name}: {profile.name}, min {low}, max {high}, on_demand {on_demand}")

    def edit_model(self) -> None:
        models = self._models()
        if not models:
            return self.create_model()
        model = self.rng.choice(models)
        change = self.rng.choice(["min", "max", "on_demand", "profile", "aliases", "default_max_tokens"])
        if change == "min":
            model.min_replicas = self.rng.randint(0, min(2, model.max_replicas))
        elif change == "max":
            model.max_replicas = self.rng.randint(max(1, model.min_replicas), 3)
        elif change == "on_demand":
            model.on_demand = not model.on_demand
            if model.on_demand:
                model.min_replicas = 0
        elif change == "profile":
            model.profile = self.rng.choice(self._profiles())
        elif change == "aliases":
            model.aliases = f"{model.name}-alias-{self.serial}"
        else:
            model.default_max_tokens = self.rng.choice([None, 4, 64])
        self._save_model(model, f"edit model {model.name}: {change} → min {model.min_replicas}, max "
                                f"{model.max_replicas}, on_demand {model.on_demand}, profile {model.profile.name}, "
                                f"aliases {model.aliases!r}, default_max_tokens {model.default_max_tokens}")

    def delete_model(self) -> None:
        models = self._models()
        if len(models) <= 1:
            return self.create_model()
        model = self.rng.choice(models)
        model.delete()
        self.op(f"delete model {model.name}")
        self.model_names = [m.name for m in self._models()]

    def edit_profile(self) -> None:
        profiles = self._profiles()
        if not profiles:
            return
        profile = self.rng.choice(profiles)
        change = self.rng.choice(["tokens", "gpu_memory", "notes"])
        # Always another value than now: an edit that shapes the engine really changes it.
        tokens = self.rng.choice([t for t in (4, 8, 16, 24) if f"--tokens {t} " not in profile.command])
        mib = self.rng.choice([m for m in (8192, 12288, 20480) if m != profile.gpu_memory_mib])
        if change == "tokens":
            profile.command = self._command(tokens)
        elif change == "gpu_memory" and profile.gpus_needed:
            profile.gpu_memory_mib = mib
            profile.env = {GPU_MEMORY_ENV: str(profile.gpu_memory_mib)}
        else:
            change = "notes"
            profile.notes = f"edited {self.serial}"
            self.serial += 1
        profile.full_clean()
        profile.save()
        self.op(f"edit profile {profile.name}: {change} → {profile.gpu_memory_mib} MiB, "
                f"--tokens {profile.command.split('--tokens ')[1].split()[0]}")

    def delete_profile(self) -> None:
        from django.db.models import ProtectedError

        profiles = self._profiles()
        if len(profiles) <= 1:
            self.create_profile()
            return
        profile = self.rng.choice(profiles)
        try:
            profile.delete()
            self.op(f"delete profile {profile.name}")
        except ProtectedError:
            self.op(f"delete profile {profile.name}: refused (a model or a replica row uses it)")

    def _llmgw(self, *args: str) -> None:
        from tests.cli import llmgw

        code, out, err = llmgw(*args)
        self.op(f"llmgw {' '.join(args)} → {code}: {(out + err).strip()[:120]}")

    def stop_start(self) -> None:
        self._llmgw("stop")
        self.stop_ops.wait(self.rng.uniform(0.5, 4.0))
        self._llmgw("start")

    def _up_agents(self) -> list[str]:
        busy = {p[2] for p in self.pending if p[1] == "agent"}
        return [n for n in AGENTS if n not in busy and self.cluster.up_since.get(n) is not None]

    def kill_agent(self) -> None:
        from fleet.models import Replica

        up = self._up_agents()
        if len(up) < 2:
            return
        stopping = set(Replica.objects.filter(state__in=["draining", "stopping"], agent__name__in=up)
                       .values_list("agent__name", flat=True))
        # As many draws whatever the rows say, so a replay draws the same operations after it.
        prefer, index, delay = self.rng.random() < 0.7, self.rng.random(), self.rng.uniform(0.5, 8.0)
        pool = sorted(stopping) if stopping and prefer else up
        name = pool[int(index * len(pool))]
        self.cluster.agent_down(name, signal.SIGKILL)
        self.op(f"kill -9 agent {name}" + (" (a replica of it draining/stopping)" if name in stopping else "")
                + f"; back in {delay:.1f} s")
        self.later(delay, "agent", name)

    def restart_agent(self) -> None:
        up = self._up_agents()
        if not up:
            return
        name = self.rng.choice(up)
        if any(web is None for web in self.cluster.webs):
            # It could not connect before the web process's return, which waits behind this
            # operation: the restart would time out and leave the agent down.
            self.op(f"restart agent {name}: not now (a web process is down)")
            return
        self.cluster.agent_down(name, signal.SIGTERM)
        self.op(f"restart agent {name} (SIGTERM: it stops its engines)")
        try:
            self.cluster.start_agent(name)
        except TimeoutError:
            self.op(f"agent {name} did not connect in time; started again in 2 s")
            self.later(2.0, "agent", name)
            return
        self.op(f"agent {name} back")

    def kill_worker(self) -> None:
        i = self.rng.randrange(len(self.cluster.workers))
        if any(p[1] == "worker" and p[2] == i for p in self.pending):
            return
        with self.lock:
            self.worker_down.append([time.monotonic(), float("inf")])
        self.cluster.kill_worker(i)
        delay = self.rng.uniform(0.5, 5.0)
        self.op(f"kill -9 worker {i}; back in {delay:.1f} s")
        self.later(delay, "worker", i)

    def kill_web(self) -> None:
        i = self.rng.randrange(len(self.cluster.webs))
        if self.cluster.webs[i] is None:
            return
        with self.lock:
            self.web_down.append([time.monotonic(), float("inf")])
        self.cluster.stop_web(i, signal.SIGKILL)
        delay = self.rng.uniform(0.5, 4.0)
        self.op(f"kill -9 web {i}; back in {delay:.1f} s")
        self.later(delay, "web", i)

    def occupy_port(self) -> None:
        name = self.rng.choice(list(AGENTS))
        ports = self.cluster.ports_of(name)
        taken = listeners(set(ports), [])
        port = next((p for p in ports if p not in taken and p not in self.impostors), None)
        if port is None:
            return
        try:
            impostor = Impostor(port)
        except OSError as exc:
            self.op(f"occupy port {port}: {exc}")
            return
        hold = self.rng.uniform(3.0, 12.0)
        self.impostors[port] = (impostor, time.monotonic() + hold)
        self.op(f"occupy port {port} of agent {name} (the next one it would pick) for {hold:.1f} s")

    def crash_engine(self) -> None:
        """kill -9 a running engine; half the time an impostor takes its port at once."""
        engines = engine_processes(self.log_dir, self.cluster.agent_dirs())
        if not engines:
            return
        victim = self.rng.choice(sorted(engines, key=lambda e: e.pid))
        steal, hold = self.rng.random() < 0.5, self.rng.uniform(3.0, 10.0)  # drawn whatever happens next
        self.crashed_at[victim.key] = time.monotonic()
        with contextlib.suppress(OSError):
            os.killpg(victim.pgid, signal.SIGKILL)
        self.op(f"kill -9 engine {victim.describe()}" + (", its port taken at once" if steal else ""))
        if steal and victim.port:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and victim.port not in self.impostors:
                try:
                    self.impostors[victim.port] = (Impostor(victim.port), time.monotonic() + hold)
                except OSError:
                    time.sleep(0.01)

    def load(self) -> None:
        self.load_mode = self.rng.choice(["steady", "burst", "burst", "silence"])
        self.op(f"load: {self.load_mode}")

    # -- load ------------------------------------------------------------------------------
    def load_loop(self, index: int) -> None:
        import httpx

        rng = random.Random(self.config.seed * 1000 + index)
        with httpx.Client(base_url=self.cluster.url, timeout=REQUEST_BOUND_S + 10) as client:
            while not self.stop_all.is_set():
                mode = self.load_mode
                names = self.model_names
                if mode == "silence" or not names:
                    self.stop_all.wait(0.2)
                    continue
                model = rng.choice(names) if rng.random() < 0.95 else "soak-no-such-model"
                if not self.request(client, model, stream=rng.random() < 0.2, disconnect=rng.random() < 0.5):
                    self.stop_all.wait(0.2)  # no web process: do not spin
                self.check_answers()
                self.stop_all.wait(0.0 if mode == "burst" else rng.uniform(0.05, 0.5))

    def request(self, client, model: str, stream: bool, disconnect: bool) -> bool:
        """One chat request, recorded for :meth:`check_answers`; False if the connection failed."""
        import httpx

        body = {"model": model, "stream": stream, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        sent = time.monotonic()
        answer = Answer(sent, sent, model, None)
        try:
            with client.stream("POST", "/v1/chat/completions", json=body, headers={"Connection": "close"}) as r:
                answer.status = r.status_code
                answer.replica = r.headers.get("x-llmgw-replica", "")
                if stream and disconnect and r.status_code == 200:
                    next(r.iter_raw(), b"")  # the client goes away after the first chunk
                    answer.disconnected = True
                else:
                    raw = r.read()
                    answer.fingerprint, answer.problem = self._body_check(r.status_code, raw, stream)
        except httpx.TimeoutException:
            answer.problem = f"no answer within {REQUEST_BOUND_S + 10:.0f} s"
        except httpx.HTTPError as exc:
            answer.problem, answer.transport_error = f"{type(exc).__name__}: {exc}", True
        answer.done = time.monotonic()
        with self.lock:
            self.answers.append(answer)
            self.result.requests += 1
        return not answer.transport_error
