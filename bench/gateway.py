"""Gateway overhead benchmark: the same fake engine reached directly and through llmgw, every
goal of the gateway (issue 20, "Speed at the limit") measured and judged in one run.

    python bench/gateway.py                      # every server and scenario (~10 min)
    python bench/gateway.py --quick              # 64, 256 and 1,024 clients, 2 s steps (~6 min)
    python bench/gateway.py --servers uvicorn --duration-s 10 --json
    python bench/gateway.py --workers 2          # + uvicorn with 2 worker processes on cores 0-1
    python bench/gateway.py --markdown           # the README's table (and the goals) in markdown
    python bench/gateway.py --litellm-python /path/to/venv/bin/python   # + LiteLLM's proxy
    python bench/gateway.py --granian-python /tmp/granian-venv/bin/python  # granian from its own venv
    python bench/gateway.py --profile /tmp/gwprof   # also py-spy the gateway at 64 clients

What runs (each a real process; all stopped at the end, also on error, Ctrl-C or SIGTERM):

* ``tests/fake_engine.py`` (on uvloop, ``bench/_uvloop_engine.py``) answering 16 tokens with
  no delay, non-streamed or as SSE;
* the llmgw gateway on a fresh SQLite database in a temp dir, under each of ``--servers``
  (default uvicorn, daphne, granian), one after the other, each pinned to one core with
  ``taskset -c 0`` (``--gateway-core``), with its default settings (``LLMGW_*`` from the
  environment): ``uvicorn --loop uvloop --http httptools --no-access-log``; ``daphne`` (its
  access log on); ``granian --interface asgi --loop uvloop`` (one worker, one runtime thread,
  no access log) from the interpreter ``--granian-python`` names (run with this checkout and
  this venv's packages on ``PYTHONPATH``), else this venv's when it has granian, else the
  column is skipped with a note;
* with ``--workers N`` (N > 1) uvicorn again, ``--workers N``, pinned to cores 0..N-1 with
  ``taskset`` (the load generator then shares cores with it: see the note it prints): a
  column ``uvicorn-wN`` beside the one-worker columns;
* "as shipped": the gateway exactly as ``llmgw up`` starts its web process
  (``llmgw.cli.web_processes.web_argv``: uvicorn with its access log, header timeouts, connection
  limits and lifespan; ``llmgw up``'s environment, which the bench's already is), pinned the
  same way, for the one-client-at-a-time goals: ``--stall-requests`` (10,000) sequential
  requests. The worker and the agent ``llmgw up`` also runs are not started (no real
  engine to place; the bench stands in for both): a note says so;
* optionally LiteLLM's proxy (``litellm --config``, one uvicorn worker, master key only, no
  database) in front of the same engine, pinned the same way: a column of its own, when
  ``litellm[proxy]`` is importable here or ``--litellm-python`` names an interpreter that
  has it;
* the load generator (this process: asyncio on uvloop, one aiohttp ``ClientSession`` per
  step with ``limit`` = clients; RLIMIT_NOFILE raised to its hard limit for it and every
  child) and the fake engine share the other core(s); beside it ``wrk`` (``--wrk``, default
  ``/usr/bin/wrk`` or on PATH, the Debian package; rows skipped with a note when absent) as
  an independent load generator at 64 clients, non-streamed (the POST body from a Lua script
  in the temp dir), so the figures do not depend on our own client alone.

The catalog rows are made in-process, as the reconciler and an agent would leave them: a
Profile (custom engine), a Model ``bench-model``, an Agent (connected, 127.0.0.1, its
``last_seen_at`` refreshed every 3 s by a thread here: the gateway only routes to agents
heard from recently), a Replica ``ready`` on the fake engine's port, and an API key sent as
``Authorization: Bearer``; an **external** model ``bench-external`` (``external_base_url``
pointing at the fake engine's ``/v1``, its engine key as ``external_api_key``); and for
each server an **on-demand** model (``min_replicas`` 0, no replica). No reconciler or agent
runs; the gateway does its real per-request work (key lookup, model resolution, routing,
usage records, Prometheus metrics).

Measured, per target (direct, each gateway):

* latency, one request at a time (non-streamed chat completion) for ``--latency-s``:
  p50 / p99 of the client-side round trip; *added* = gateway percentile - direct percentile.
  For llmgw also the gateway's own ``X-Llmgw-Overhead-Ms`` header (work before the upstream
  call);
* requests per second at 1, 16, 64, 256 and 1,024 concurrent clients (``--concurrency``),
  non-streamed and streamed (the whole SSE stream read, ``[DONE]`` checked), each step
  ``--duration-s`` long after a short warm-up; non-200 answers, broken or incomplete
  streams count as errors, requests over ``--timeout-s`` as timeouts;
* wrk at 64 clients, non-streamed: req/s, latency p50 / p99, errors;
* per one-worker gateway, the scenarios at 64 clients, non-streamed and streamed:
  ``external`` (the external model) and ``on-demand`` — held-then-served: one request for
  the cold on-demand model is sent, the bench waits until the gateway has wanted the model
  (its ``ModelState.wanted_at``), then makes a ready replica for it, as an agent would; the
  held request's time to its answer is printed; then, warm, its steady path is measured;
* as shipped: the sequential requests' added latency (each round trip - direct p50):
  p50, p99, max, and how many exceed 20 ms (a stall).

Also, per phase, the CPU time the target's process (all threads, and children) used per
answered request, read from /proc: unlike req/s it hardly depends on what else the machine
runs, and (workers) x 1000 / (CPU ms per request) is what the gateway would serve with its
core(s) to itself ("cap"). On a shared machine read the CPU rows first: the req/s goals are
judged on the cap where CPU was read (the line says which figure decides), else on req/s.

Printed: a table (scenario, direct, each target and its ratio to direct: latency and CPU
ratios > 1 are slower, req/s ratio < 1 is slower) and the goals block, every goal one line
with its figure, target and PASS/MISS (``uvicorn``, what ``llmgw up`` runs, decides; the
other servers are judged too, for the comparison): at 64 clients >= 2,000 req/s JSON and
>= 1,600 streamed on one core, CPU <= 0.5 ms per request; added p50 <= 0.5 ms and p99 <=
3 ms one client at a time (as shipped, and per server); no stall over 20 ms added in the
sequential requests as shipped; no timeouts or errors at 256 and 1,024 clients; external
and on-demand (warm) within 10% of the replica path (CPU per request and req/s); with N
workers CPU per request within 10% of one worker's (its req/s reported beside). ``--json``
prints the same data as JSON; ``--markdown`` the README's table and the goals in markdown.
Progress goes to stderr; logs and the database stay in the temp dir with ``--keep``.

``--profile DIR`` samples each llmgw server with py-spy (``--nonblocking --gil``: the
thread holding the GIL, i.e. Python CPU time; collapsed stacks in
``DIR/<server>-c<N>-<mode>.txt``, for speedscope or flamegraph.pl) during the step at
``--profile-clients`` clients (64) and prints where its time goes: by package of the leaf
frame; "who pays -> for what" (the innermost llmgw function on the stack, or the task a
sync_to_async worker thread runs, or the server/framework); our functions inclusive; the
hottest leaf functions. py-spy shares the load generator's core, so req/s in a profiled run
read low; take the numbers from a run without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import math
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.processes import PYTHON, Proc, free_port, wait_for_port  # noqa: E402

from bench._pyspy import summarize_profile  # noqa: E402

MODEL = "bench-model"
EXTERNAL_MODEL = "bench-external"
ON_DEMAND_MODEL = "bench-on-demand"  # + "-<server>": one cold model per server
CONCURRENCY = (1, 16, 64, 256, 1024)
QUICK_CONCURRENCY = (64, 256, 1024)
GOAL_RPS_AT = 64
GOAL_RPS = {False: 2000.0, True: 1600.0}  # stream? -> requests/s on one core
GOAL_CPU_MS = 0.5  # CPU per request at GOAL_RPS_AT clients
GOAL_ADDED_P50_MS = 0.5
GOAL_ADDED_P99_MS = 3.0
GOAL_NO_FAILURES_AT = (256, 1024)  # no timeouts, no errors at these client counts
GOAL_WITHIN = 0.10  # external / on-demand (warm) vs the replica path; N workers' CPU vs 1 worker's
GOAL_STALL_MS = 20.0  # a sequential request slower than this (added) is a stall
STALL_REQUESTS = 10_000
SERVERS = ("uvicorn", "daphne", "granian")
CHOSEN = "uvicorn"  # what `llmgw up` runs: its goals decide
AS_SHIPPED = "as-shipped"
FLOOR = "floor"  # bench/_floor_proxy.py: uvicorn + aiohttp and nothing of llmgw
FLOOR_DJANGO = "floor-django"  # bench/_floor_django.py: + Django's lean handler and a trivial view
SCENARIOS = ("external", "on-demand")
HEARTBEAT_S = 3.0
LATENCY_MIN_REQUESTS = 500
LITELLM_KEY = "sk-bench-litellm-master"
HELD_TIMEOUT_S = 60.0


def say(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # fields from "state" on (comm may hold spaces)


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of ``pid`` and its live descendants (all their threads, dead
    threads included), from /proc; None where /proc is not readable. Unlike req/s, this does
    not depend on what else the machine runs."""
    if pid is None or _stat(pid) is None:
        return None
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields:
                children[int(fields[1])].append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        fields = _stat(p)
        if fields:
            total += (int(fields[11]) + int(fields[12])) / _TICK
            todo.extend(children.get(p, ()))
    return total


def machine_load() -> str:
    try:
        one, five = Path("/proc/loadavg").read_text().split()[:2]
    except OSError:
        return "unknown"
    return f"load average {one} (1 min) {five} (5 min) on {os.cpu_count()} cores"


# --------------------------------------------------------------------------- setup
def setup_django(tmp: Path) -> None:
    """The bench's own database and data dir, for this process and (by inheritance) the
    gateways. Must run before django.setup()."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "llmgw.settings"
    os.environ["LLMGW_DATA_DIR"] = str(tmp / "data")
    os.environ["LLMGW_SQLITE_PATH"] = str(tmp / "bench.sqlite3")
    os.environ["PYTHONUNBUFFERED"] = "1"
    subprocess.run([PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, check=True)
    import django

    django.setup()


def create_rows(engine_port: int, engine_key: str) -> tuple[int, str]:
    """Catalog and fleet rows for one ready replica on the fake engine (started with
    ``engine_key``, the replica's engine key), and the external model ``bench-external``
    served by the same engine at its ``/v1`` (with ``engine_key`` as its external API key);
    returns the agent's id and a clear API key."""
    from django.utils import timezone

    from catalog.models import ClusterSettings, Model, Profile
    from fleet.models import Agent
    from gateway.models import ApiKey

    ClusterSettings.get_solo()
    profile = Profile(name="bench-fake", engine=Profile.Engine.CUSTOM,
                      command="{python} tests/fake_engine.py --host {host} --port {port} --served-name {served_name}"
                              " --api-key {api_key}",
                      gpus_needed=0, cpu_cores=1, memory_mib=64, readiness_path="/v1/models", startup_timeout_s=30)
    profile.full_clean()
    profile.save()
    model = Model(name=MODEL, weights="file:/dev/null", profile=profile, min_replicas=1, max_replicas=1)
    model.full_clean()
    model.save()
    external = Model(name=EXTERNAL_MODEL, external_base_url=f"http://127.0.0.1:{engine_port}/v1",
                     external_api_key=engine_key, min_replicas=0, max_replicas=0)
    external.full_clean()
    external.save()
    agent = Agent.objects.create(name="bench-agent", connected=True, connected_since=timezone.now(),
                                 last_seen_at=timezone.now(), address="127.0.0.1", cpu_cores=os.cpu_count() or 1,
                                 memory_mib=1024)
    add_replica(model.pk, agent.pk, engine_port, engine_key)
    _, key = ApiKey.create_key("bench")
    return agent.pk, key


def add_replica(model_id: int, agent_id: int, engine_port: int, engine_key: str) -> None:
    """A Replica ``ready`` of the model on the fake engine, as an agent leaves one."""
    from django.db import close_old_connections
    from django.utils import timezone

    from catalog.models import Model
    from fleet.models import Replica

    try:
        model = Model.objects.get(pk=model_id)
        Replica.objects.create(model=model, profile=model.profile, agent_id=agent_id, state="ready",
                               port=engine_port, cpu_cores=1, memory_mib=64, ready_at=timezone.now(),
                               engine_key=engine_key)
    finally:
        close_old_connections()


def create_on_demand(name: str) -> int:
    """A cold on-demand model (min 0, max 1, no replica) on the bench's profile; its id."""
    from catalog.models import Model, Profile

    model = Model(name=name, weights="file:/dev/null", profile=Profile.objects.get(name="bench-fake"),
                  min_replicas=0, max_replicas=1, on_demand=True)
    model.full_clean()
    model.save()
    return model.pk


def wanted(model_id: int) -> bool:
    """Whether a request has wanted the model (the gateway holds it): ``ModelState.wanted_at``."""
    from django.db import close_old_connections

    from fleet.models import ModelState

    try:
        return ModelState.objects.filter(model_id=model_id, wanted_at__isnull=False).exists()
    finally:
        close_old_connections()


class Heartbeat(threading.Thread):
    """Keeps the agent row 'heard from' (the gateway routes only to recent agents)."""

    def __init__(self, agent_id: int) -> None:
        super().__init__(name="bench-heartbeat", daemon=True)
        self.agent_id = agent_id
        self.stopping = threading.Event()

    def run(self) -> None:
        from django.db import close_old_connections
        from django.utils import timezone

        from fleet.models import Agent

        while not self.stopping.wait(HEARTBEAT_S):
            try:
                Agent.objects.filter(pk=self.agent_id).update(last_seen_at=timezone.now(), connected=True)
            except Exception as exc:  # a busy database: the next beat is soon enough
                say(f"heartbeat: {exc}")
            finally:
                close_old_connections()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5)


def taskset(cores: set[int]) -> list[str]:
    return ["taskset", "-c", ",".join(str(c) for c in sorted(cores))] if shutil.which("taskset") else []


def start_engine(port: int, cores: set[int], tmp: Path, tokens: int, api_key: str) -> Proc:
    """The fake engine on uvloop, refusing requests without ``api_key`` (as the agent's
    engines do: the gateway sends the replica's key)."""
    proc = Proc([*taskset(cores), PYTHON, str(ROOT / "bench" / "_uvloop_engine.py"), "--port", str(port),
                 "--served-name", MODEL, "--tokens", str(tokens), "--metrics-kind", "none", "--api-key", api_key],
                tmp / "fake-engine.log")
    wait_for_port(port, proc=proc.proc)
    return proc


def gateway_argv(server: str, port: int, workers: int = 1, granian: list[str] | None = None) -> list[str]:
    """The command line of the gateway under ``server`` (uvicorn, daphne, granian or
    ``as-shipped``: ``llmgw up``'s own, ``llmgw.cli.web_processes.web_argv``) on 127.0.0.1:``port``;
    ``workers`` > 1: uvicorn's ``--workers``; ``granian``: how to start granian (an
    interpreter and ``-m granian``)."""
    if server == "daphne":
        return [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "llmgw.asgi:application"]
    if server == "granian":
        return [*(granian or [PYTHON, "-m", "granian"]), "--interface", "asgi", "--host", "127.0.0.1",
                "--port", str(port), "--workers", "1", "--runtime-threads", "1", "--loop", "uvloop",
                "--no-access-log", "--log-level", "warning", "llmgw.asgi:application"]
    if server in (FLOOR, FLOOR_DJANGO):
        app = "bench._floor_proxy:app" if server == FLOOR else "bench._floor_django:app"
        argv = [PYTHON, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
                "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"]
        return argv + (["--workers", str(workers)] if workers > 1 else [])
    if server == AS_SHIPPED:
        from llmgw.cli.web_processes import web_argv

        return web_argv("127.0.0.1", port)
    argv = [PYTHON, "-m", "uvicorn", "llmgw.asgi:application", "--host", "127.0.0.1", "--port", str(port),
            "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"]
    return argv + (["--workers", str(workers)] if workers > 1 else [])


def start_gateway(server: str, port: int, cores: set[int], tmp: Path, workers: int = 1,
                  granian: tuple[list[str], dict[str, str]] | None = None, name: str | None = None,
                  floor_upstream: str = "") -> Proc:
    """The gateway (:func:`gateway_argv`) pinned to ``cores``, its output in the temp dir;
    ``granian``: (command, environment) from :func:`find_granian`; ``floor_upstream``: the
    engine's base URL, for :data:`FLOOR`."""
    argv = gateway_argv(server, port, workers, granian[0] if granian else None)
    env = granian[1] if granian and server == "granian" else None
    if server in (FLOOR, FLOOR_DJANGO):
        env = {"LLMGW_FLOOR_UPSTREAM": floor_upstream}
    proc = Proc([*taskset(cores), *argv], tmp / f"gateway-{name or server}.log", env=env)
    wait_for_port(port, timeout_s=60, proc=proc.proc)
    return proc


def find_granian(arg: str | None) -> tuple[tuple[list[str], dict[str, str]] | None, str]:
    """((command, environment), note) for granian: ``arg`` (an interpreter whose venv has
    granian, run with this checkout and this venv's packages on PYTHONPATH), else this
    venv's interpreter when it has granian; (None, why) otherwise."""
    import sysconfig

    if arg:
        paths = [str(ROOT), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
        env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
        probe = subprocess.run([arg, "-c", "import granian, django, llmgw.asgi"], check=False, capture_output=True,
                               text=True, env={**os.environ, **env}, cwd=ROOT)
        if probe.returncode == 0:
            return ([arg, "-m", "granian"], env), ""
        return None, f"granian column skipped: {arg} cannot import granian with llmgw: {probe.stderr.strip()[-300:]}"
    probe = subprocess.run([PYTHON, "-c", "import granian"], check=False, capture_output=True)
    if probe.returncode == 0:
        return ([PYTHON, "-m", "granian"], {}), ""
    return None, ("granian column skipped: granian is not in this venv (python3 -m venv /tmp/granian-venv && "
                  "/tmp/granian-venv/bin/pip install granian, then --granian-python /tmp/granian-venv/bin/python)")


def litellm_python(arg: str | None) -> tuple[str | None, str]:
    """(interpreter with litellm's proxy, note)."""
    candidates = [arg] if arg else [os.environ.get("LLMGW_BENCH_LITELLM_PYTHON"), PYTHON]
    for python in filter(None, candidates):
        probe = subprocess.run([python, "-c", "import litellm.proxy.proxy_cli, fastapi, uvicorn"], check=False,
                               capture_output=True, text=True,
                               env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
        if probe.returncode == 0:
            return python, ""
    return None, ("litellm column skipped: litellm[proxy] is not importable (pip install 'litellm[proxy]' "
                  "into some venv, then --litellm-python PATH/TO/python)")


def start_litellm(python: str, port: int, engine_port: int, engine_key: str, core: int, tmp: Path) -> Proc:
    """LiteLLM's proxy in front of the same engine, sending the engine's key as llmgw does
    (the engine answers 401 to any other, and LiteLLM then cools the deployment down)."""
    config = tmp / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: http://127.0.0.1:{engine_port}/v1\n"
        f"      api_key: {engine_key}\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  set_verbose: false\n"
        "general_settings:\n"
        f"  master_key: {LITELLM_KEY}\n"
    )
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"}
    # No database (an empty DATABASE_URL is an error to LiteLLM, so unset it).
    argv = ["env", "-u", "DATABASE_URL", python, "-m", "litellm.proxy.proxy_cli", "--config", str(config),
            "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    proc = Proc([*taskset({core}), *argv], tmp / "litellm.log", env=env)
    wait_for_port(port, timeout_s=120, proc=proc.proc)
    return proc


# --------------------------------------------------------------------------- load
@dataclass
class Target:
    name: str
    url: str  # .../v1/chat/completions
    key: str
    pid: int | None = None


@dataclass
class Step:
    clients: int
    stream: bool
    seconds: float
    scenario: str = "replica"  # or "external", "on-demand" (warm, after held-then-served)
    ok: int = 0
    errors: int = 0
    timeouts: int = 0
    first_error: str = ""
    answered: int = 0  # every 200, warm-up and stragglers included (for CPU per request)
    cpu_s: float | None = None  # the target's CPU time over the whole step

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms(self) -> float | None:
        """The target's CPU time per answered request."""
        return self.cpu_s * 1000 / self.answered if self.cpu_s is not None and self.answered else None


@dataclass
class Wrk:
    """One wrk run: requests/s, latency percentiles (ms), failures (socket errors, non-2xx,
    wrk's timeouts) and the target's CPU ms per request over it (None: /proc unread)."""

    clients: int
    rps: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    requests: int = 0
    errors: int = 0  # socket errors (connect, read, write) and non-2xx/3xx answers
    timeouts: int = 0
    cpu_ms: float | None = None
    error: str = ""  # wrk failed or printed nothing readable


@dataclass
class Stalls:
    """Sequential requests' added latency (each round trip - the direct p50, ms): how many
    were slower than ``threshold_ms`` added, and the p50, p99 and max added."""

    requests: int
    threshold_ms: float
    over: int
    p50_added_ms: float
    p99_added_ms: float
    max_added_ms: float


@dataclass
class Result:
    name: str
    kind: str = "llmgw"  # "direct", "llmgw", "as-shipped", "floor" or "litellm"
    workers: int = 1
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    latency_n: int = 0
    latency_errors: int = 0
    overhead_p50_ms: float | None = None
    overhead_p99_ms: float | None = None
    latency_cpu_ms: float | None = None  # the target's CPU time per request, one at a time
    steps: list[Step] = field(default_factory=list)
    wrk: Wrk | None = None
    held_ms: float | None = None  # held-then-served: the cold request's round trip
    held_error: str = ""
    stalls: Stalls | None = None
    profiles: dict[str, str] = field(default_factory=dict)

    def step(self, clients: int, stream: bool, scenario: str = "replica") -> Step | None:
        return next((s for s in self.steps if s.clients == clients and s.stream == stream
                     and s.scenario == scenario), None)


def bodies(tokens: int, model: str = MODEL) -> dict[bool, bytes]:
    """The chat completion request for ``model``, non-streamed (False) and streamed (True)."""
    base = {"model": model, "max_tokens": tokens, "messages": [{"role": "user", "content": "Say something."}]}
    return {False: json.dumps(base).encode(), True: json.dumps({**base, "stream": True}).encode()}


def session(aiohttp, target: Target, clients: int, timeout_s: float):
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=clients, limit_per_host=clients, ttl_dns_cache=None,
                                       enable_cleanup_closed=False),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        headers={"Authorization": f"Bearer {target.key}", "Content-Type": "application/json"},
        skip_auto_headers=("User-Agent",), auto_decompress=False,
    )


async def measure_latency(target: Target, body: bytes, seconds: float, timeout_s: float, result: Result,
                          count: int | None = None) -> list[float]:
    """One request at a time for ``seconds`` (after 100 warm-up requests), longer (up to 4x)
    until at least LATENCY_MIN_REQUESTS were answered, for a p99 worth reading; or exactly
    ``count`` requests when given. Returns the answered requests' round trips (ms)."""
    import aiohttp

    times: list[float] = []
    overheads: list[float] = []
    clock = time.perf_counter
    async with session(aiohttp, target, 1, timeout_s) as s:
        for _ in range(100):
            async with s.post(target.url, data=body) as r:
                await r.read()
        cpu0 = cpu_seconds(target.pid)
        started = clock()
        end, hard_end = started + seconds, started + 4 * seconds

        def more() -> bool:
            if count is not None:
                return len(times) + result.latency_errors < count
            return clock() < end or (len(times) < LATENCY_MIN_REQUESTS and clock() < hard_end)

        while more():
            t0 = clock()
            try:
                async with s.post(target.url, data=body) as r:
                    await r.read()
                    status, overhead = r.status, r.headers.get("X-Llmgw-Overhead-Ms")
            except (aiohttp.ClientError, TimeoutError, OSError):
                result.latency_errors += 1
                continue
            if status != 200:
                result.latency_errors += 1
                continue
            times.append(clock() - t0)
            if overhead is not None:
                overheads.append(float(overhead))
    result.latency_n = len(times)
    cpu1 = cpu_seconds(target.pid)
    if cpu0 is not None and cpu1 is not None and times:
        result.latency_cpu_ms = (cpu1 - cpu0) * 1000 / (len(times) + result.latency_errors)
    if times:
        result.p50_ms, result.p99_ms = (percentile(times, 50) * 1000, percentile(times, 99) * 1000)
    if overheads:
        result.overhead_p50_ms, result.overhead_p99_ms = percentile(overheads, 50), percentile(overheads, 99)
    return [t * 1000 for t in times]


def stall_summary(times_ms: list[float], base_ms: float, threshold_ms: float = GOAL_STALL_MS) -> Stalls:
    """:class:`Stalls` of sequential round trips ``times_ms`` against ``base_ms`` (the direct
    p50: what the engine and the client take without the gateway)."""
    added = [t - base_ms for t in times_ms]
    if not added:
        return Stalls(0, threshold_ms, 0, float("nan"), float("nan"), float("nan"))
    return Stalls(len(added), threshold_ms, sum(1 for a in added if a > threshold_ms), percentile(added, 50),
                  percentile(added, 99), max(added))


async def measure_held(target: Target, body: bytes, model_id: int, agent_id: int, engine_port: int,
                       engine_key: str, result: Result, timeout_s: float = HELD_TIMEOUT_S) -> None:
    """Held-then-served: one request for the cold on-demand model ``model_id``; once the
    gateway has wanted it (it holds the request), a ready replica is made for it, as the
    reconciler and an agent would; ``result.held_ms`` is the request's round trip (or
    ``held_error`` says what went wrong)."""
    import aiohttp

    clock = time.perf_counter
    async with session(aiohttp, target, 1, timeout_s) as s:

        async def ask() -> tuple[int, bytes]:
            async with s.post(target.url, data=body) as r:
                return r.status, await r.read()

        t0 = clock()
        task = asyncio.ensure_future(ask())
        deadline = time.monotonic() + timeout_s
        while not task.done() and time.monotonic() < deadline and not await asyncio.to_thread(wanted, model_id):
            await asyncio.sleep(0.02)
        if not task.done():
            await asyncio.to_thread(add_replica, model_id, agent_id, engine_port, engine_key)
        try:
            status, data = await task
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            result.held_error = repr(exc)[:200]
            return
    if status != 200:
        result.held_error = f"HTTP {status}: {data[:200]!r}"
        return
    result.held_ms = (clock() - t0) * 1000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


async def measure_rps(target: Target, body: bytes, step: Step, warmup_s: float, timeout_s: float) -> None:
    """``step.clients`` workers, each sending its next request as soon as the last is done;
    answers finished inside the measured window count (errors and timeouts count always)."""
    import aiohttp

    loop = asyncio.get_running_loop()
    start = loop.time() + warmup_s
    end = start + step.seconds
    done_marker = b"[DONE]"

    async def worker(s) -> None:
        while loop.time() < end:
            try:
                async with s.post(target.url, data=body) as r:
                    data = await r.read()
                    good = r.status == 200 and (not step.stream or done_marker in data[-32:])
                    if not good and not step.first_error:
                        step.first_error = f"HTTP {r.status}: {data[:200]!r}"
            except TimeoutError:
                step.timeouts += 1
                continue
            except (aiohttp.ClientError, OSError) as exc:
                step.errors += 1
                step.first_error = step.first_error or repr(exc)[:200]
                await asyncio.sleep(0.01)  # a refused connection would spin otherwise
                continue
            if not good:
                step.errors += 1
                continue
            step.answered += 1
            if start <= loop.time() <= end:
                step.ok += 1

    cpu0 = cpu_seconds(target.pid)
    async with session(aiohttp, target, step.clients, timeout_s) as s:
        await asyncio.gather(*(worker(s) for _ in range(step.clients)))
    cpu1 = cpu_seconds(target.pid)
    if cpu0 is not None and cpu1 is not None:
        step.cpu_s = cpu1 - cpu0


def run_async(coro):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def wait_routed(target: Target, body: bytes, timeout_s: float = 60.0) -> None:
    """Until the target answers 200 (the gateway's watcher has loaded its routes)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last = ""
    with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {target.key}",
                                           "Content-Type": "application/json"}) as client:
        while time.monotonic() < deadline:
            try:
                r = client.post(target.url, content=body)
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}: {r.text[:300]}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.2)
    raise TimeoutError(f"{target.name} never answered 200: {last}")


# --------------------------------------------------------------------------- wrk
def find_wrk(arg: str | None) -> str | None:
    """wrk's path: ``arg``, else on PATH, else /usr/bin/wrk (Debian's package); None if absent."""
    for candidate in (arg, shutil.which("wrk"), "/usr/bin/wrk"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def wrk_script(key: str, body: bytes) -> str:
    """wrk's Lua script: POST ``body`` (JSON) with ``key`` as the bearer token."""
    text = body.decode()
    if "]==]" in text or "]==]" in key:
        raise ValueError("the body or key would end the Lua long string")
    return ('wrk.method = "POST"\n'
            f"wrk.body = [==[{text}]==]\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
            f'wrk.headers["Authorization"] = [==[Bearer {key}]==]\n')


_WRK_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}


def _wrk_ms(text: str) -> float:
    """A wrk duration ("812.00us", "1.23ms", "2.01s", "1.00m") in ms."""
    import re

    m = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text.strip())
    if not m:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(m.group(1)) * _WRK_UNITS_MS[m.group(2)]


def parse_wrk(text: str, clients: int) -> Wrk:
    """A :class:`Wrk` from wrk's output (run with ``--latency``): ``Requests/sec``, the 50%
    and 99% lines of its latency distribution, ``N requests in``, socket errors and non-2xx
    answers. ValueError when the output has no ``Requests/sec`` line."""
    import re

    out = Wrk(clients)
    m = re.search(r"^Requests/sec:\s*([\d.]+)", text, re.M)
    if not m:
        raise ValueError("no Requests/sec in wrk's output: " + text.strip()[-300:])
    out.rps = float(m.group(1))
    for pct, name in (("50", "p50_ms"), ("99", "p99_ms")):
        m = re.search(rf"^\s*{pct}(?:\.0+)?%\s+(\S+)", text, re.M)
        if m:
            setattr(out, name, _wrk_ms(m.group(1)))
    m = re.search(r"^\s*(\d+) requests in", text, re.M)
    out.requests = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        out.errors += int(m.group(1)) + int(m.group(2)) + int(m.group(3))
        out.timeouts = int(m.group(4))
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    if m:
        out.errors += int(m.group(1))
    return out


def run_wrk(wrk: str, target: Target, body: bytes, clients: int, seconds: float, timeout_s: float, tmp: Path,
            cores: set[int]) -> Wrk:
    """wrk at ``clients`` connections for ``seconds`` (pinned to ``cores``, one thread per
    core), after a short warm-up of our own; with the target's CPU per request."""
    script = tmp / "wrk-post.lua"
    script.write_text(wrk_script(target.key, body))
    threads = max(1, min(clients, len(cores)))
    argv = [*taskset(cores), wrk, "-t", str(threads), "-c", str(clients), "-d", f"{max(1, round(seconds))}s",
            "--timeout", f"{max(1, round(timeout_s))}s", "--latency", "-s", str(script), target.url]
    cpu0 = cpu_seconds(target.pid)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=seconds + timeout_s + 30)
    cpu1 = cpu_seconds(target.pid)
    try:
        out = parse_wrk(proc.stdout, clients)
    except ValueError as exc:
        return Wrk(clients, error=f"wrk exited {proc.returncode}: {exc} {proc.stderr.strip()[-200:]}")
    answered = out.requests - out.errors
    if cpu0 is not None and cpu1 is not None and answered > 0:
        out.cpu_ms = (cpu1 - cpu0) * 1000 / answered
    return out


# --------------------------------------------------------------------------- profiling
class Profiler:
    """py-spy record of one process for one step (collapsed stacks)."""

    def __init__(self, py_spy: str, pid: int, seconds: float, out: Path, cores: set[int]) -> None:
        self.out = out
        argv = [*taskset(cores), py_spy, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))),
                "--rate", "250", "--nonblocking", "--gil", "--format", "raw", "--output", str(out)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)

    def finish(self) -> None:
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            _, err = self.proc.communicate()
        if self.proc.returncode not in (0, None) and not self.out.exists():
            say(f"py-spy failed ({self.proc.returncode}): {err.decode(errors='replace')[-500:]}")


# --------------------------------------------------------------------------- running
def say_step(name: str, step: Step) -> None:
    extra = f", {step.errors} errors, {step.timeouts} timeouts" if step.errors or step.timeouts else ""
    if step.cpu_ms is not None:
        extra += f", {step.cpu_ms:.2f} ms CPU/request"
    label = "" if step.scenario == "replica" else f"{step.scenario} "
    say(f"[{name}]   {label}{step.clients:>4} clients {'stream' if step.stream else 'json':>6}: {step.rps:8.0f} req/s"
        f"{extra}" + (f"  first error: {step.first_error}" if step.first_error else ""))


def bench_target(target: Target, args, body: dict[bool, bytes], profile_dir: Path | None, py_spy: str | None,
                 load_cores: set[int], result: Result, wrk: str | None = None, tmp: Path | None = None) -> Result:
    """Latency one request at a time, then each ``args.concurrency`` step (JSON and
    streamed; py-spy at ``args.profile_clients`` when asked), then wrk at 64 clients."""
    say(f"[{target.name}] latency, one request at a time, {args.latency_s:g} s")
    run_async(measure_latency(target, body[False], args.latency_s, args.timeout_s, result))
    cpu = f", {result.latency_cpu_ms:.2f} ms CPU/request" if result.latency_cpu_ms is not None else ""
    say(f"[{target.name}]   p50 {result.p50_ms:.3f} ms, p99 {result.p99_ms:.3f} ms ({result.latency_n} requests{cpu})")
    warmup = min(1.0, max(0.25, args.duration_s / 5))
    for clients in args.concurrency:
        for stream in (False, True):
            step = Step(clients, stream, args.duration_s)
            profiler = None
            mode = "stream" if stream else "json"
            if profile_dir and py_spy and target.pid and clients == args.profile_clients:
                out = profile_dir / f"{target.name}-c{clients}-{mode}.txt"
                profiler = Profiler(py_spy, target.pid, args.duration_s, out, load_cores)
                result.profiles[mode] = str(out)
            # Many clients take a while to connect and fill the pipeline: a longer warm-up.
            step_warmup = max(warmup, clients / 512) if not profiler else 0.0
            run_async(measure_rps(target, body[stream], step, step_warmup, args.timeout_s))
            if profiler:
                profiler.finish()
            result.steps.append(step)
            say_step(target.name, step)
    if wrk and tmp is not None:
        result.wrk = run_wrk(wrk, target, body[False], GOAL_RPS_AT, args.duration_s, args.timeout_s, tmp, load_cores)
        w = result.wrk
        cpu = f", {w.cpu_ms:.2f} ms CPU/request" if w.cpu_ms is not None else ""
        say(f"[{target.name}]   wrk {w.clients} clients json: {w.rps:8.0f} req/s, p50 {w.p50_ms:.2f} ms, "
            f"p99 {w.p99_ms:.2f} ms, {w.errors} errors, {w.timeouts} timeouts{cpu}" + (f"  {w.error}" if w.error else ""))
    return result


def bench_scenarios(target: Target, args, result: Result, on_demand_id: int, agent_id: int, engine_port: int,
                    engine_key: str, on_demand_name: str, profiling: tuple | None = None) -> None:
    """The external model's and the on-demand model's steps at 64 clients (JSON and
    streamed), the on-demand model first held-then-served (:func:`measure_held`);
    ``profiling`` = (dir, py-spy, load cores): py-spy each JSON step too."""
    warmup = min(1.0, max(0.25, args.duration_s / 5))
    for scenario, model in (("external", EXTERNAL_MODEL), ("on-demand", on_demand_name)):
        body = bodies(args.tokens, model)
        if scenario == "on-demand":
            run_async(measure_held(target, body[False], on_demand_id, agent_id, engine_port, engine_key, result))
            say(f"[{target.name}]   held-then-served: " + (f"{result.held_ms:.0f} ms to its answer"
                                                           if result.held_ms is not None else result.held_error))
            if result.held_ms is None:
                continue
        for stream in (False, True):
            step = Step(GOAL_RPS_AT, stream, args.duration_s, scenario)
            profiler = None
            if profiling and profiling[1] and target.pid and not stream:
                out = profiling[0] / f"{target.name}-{scenario}-json.txt"
                profiler = Profiler(profiling[1], target.pid, args.duration_s, out, profiling[2])
                result.profiles[f"{scenario} json"] = str(out)
            run_async(measure_rps(target, body[stream], step, 0.0 if profiler else warmup, args.timeout_s))
            if profiler:
                profiler.finish()
            result.steps.append(step)
            say_step(target.name, step)


# --------------------------------------------------------------------------- goals
@dataclass
class Goal:
    """One goal judged for one target: its figure and target as text, ``ok`` None where it
    is reported only (N workers' req/s) or could not be measured (then ``figure`` says so)."""

    target: str
    goal: str
    figure: str
    wanted: str
    ok: bool | None

    @property
    def verdict(self) -> str:
        return "-" if self.ok is None else ("PASS" if self.ok else "MISS")


def _rps_goal(r: Result, stream: bool) -> Goal:
    mode = "streamed" if stream else "JSON"
    s = r.step(GOAL_RPS_AT, stream)
    wanted = f">= {GOAL_RPS[stream]:,.0f}/s"
    if s is None:
        return Goal(r.name, f"req/s {mode} @{GOAL_RPS_AT}", "not measured", wanted, None)
    if s.cpu_ms:
        cap = r.workers * 1000 / s.cpu_ms
        return Goal(r.name, f"req/s {mode} @{GOAL_RPS_AT}",
                    f"cap {cap:,.0f}/s from CPU (decides), {s.rps:,.0f}/s measured", wanted, cap >= GOAL_RPS[stream])
    return Goal(r.name, f"req/s {mode} @{GOAL_RPS_AT}", f"{s.rps:,.0f}/s measured (decides: no CPU read)", wanted,
                s.rps >= GOAL_RPS[stream])


def _within_goals(r: Result, scenario: str) -> list[Goal]:
    out = []
    for stream in (False, True):
        mode = "streamed" if stream else "JSON"
        base, s = r.step(GOAL_RPS_AT, stream), r.step(GOAL_RPS_AT, stream, scenario)
        name = f"{scenario} vs replica, {mode} @{GOAL_RPS_AT}"
        wanted = f"CPU <= {1 + GOAL_WITHIN:.2f}x, req/s >= {1 - GOAL_WITHIN:.2f}x"
        if base is None or s is None or not base.rps:
            out.append(Goal(r.name, name, "not measured", wanted, None))
            continue
        rps_ratio = s.rps / base.rps
        figure = f"req/s {s.rps:,.0f} vs {base.rps:,.0f} ({rps_ratio:.2f}x)"
        ok = rps_ratio >= 1 - GOAL_WITHIN
        if s.cpu_ms and base.cpu_ms:
            cpu_ratio = s.cpu_ms / base.cpu_ms
            figure = f"CPU {s.cpu_ms:.3f} vs {base.cpu_ms:.3f} ms ({cpu_ratio:.2f}x), " + figure
            ok = ok and cpu_ratio <= 1 + GOAL_WITHIN
        out.append(Goal(r.name, name, figure, wanted, ok))
    return out


def _latency_goals(r: Result, direct: Result, how: str) -> list[Goal]:
    added50, added99 = r.p50_ms - direct.p50_ms, r.p99_ms - direct.p99_ms
    return [Goal(r.name, f"added p50, one client{how}", f"{added50:+.3f} ms", f"<= {GOAL_ADDED_P50_MS:g} ms",
                 None if math.isnan(added50) else added50 <= GOAL_ADDED_P50_MS),
            Goal(r.name, f"added p99, one client{how}", f"{added99:+.3f} ms", f"<= {GOAL_ADDED_P99_MS:g} ms",
                 None if math.isnan(added99) else added99 <= GOAL_ADDED_P99_MS)]


def evaluate_goals(results: list[Result]) -> list[Goal]:
    """Every goal of issue 20's gateway part, judged per target (``results[0]`` is the
    direct baseline): the one-worker servers' req/s (cap from CPU deciding), CPU per request,
    added latency, failures at 256 and 1,024 clients, the external and on-demand scenarios;
    the as-shipped gateway's added latency and stalls; N workers' CPU per request against
    one uvicorn worker's, and their req/s (reported)."""
    direct = results[0]
    goals: list[Goal] = []
    one_worker = {r.name: r for r in results if r.kind == "llmgw" and r.workers == 1}
    for r in results[1:]:
        if r.kind == AS_SHIPPED:
            goals += _latency_goals(r, direct, " as shipped")
            st = r.stalls
            if st is None or not st.requests:
                goals.append(Goal(r.name, "stalls, sequential as shipped", "not measured",
                                  f"0 over {GOAL_STALL_MS:g} ms added", None))
            else:
                goals.append(Goal(r.name, f"stalls in {st.requests:,} sequential as shipped",
                                  f"{st.over} over {st.threshold_ms:g} ms added (max +{st.max_added_ms:.1f} ms, "
                                  f"p99 +{st.p99_added_ms:.2f} ms)", f"0 over {GOAL_STALL_MS:g} ms", st.over == 0))
            continue
        if r.kind != "llmgw":
            continue
        goals += [_rps_goal(r, False), _rps_goal(r, True)]
        cpus = [s.cpu_ms for s in (r.step(GOAL_RPS_AT, False), r.step(GOAL_RPS_AT, True)) if s and s.cpu_ms]
        goals.append(Goal(r.name, f"CPU per request @{GOAL_RPS_AT} (JSON / streamed)",
                          " / ".join(f"{c:.3f}" for c in cpus) + " ms" if cpus else "not measured",
                          f"<= {GOAL_CPU_MS:g} ms", max(cpus) <= GOAL_CPU_MS if cpus else None))
        if r.workers == 1:
            goals += _latency_goals(r, direct, "")
        for clients in GOAL_NO_FAILURES_AT:
            steps = [s for s in r.steps if s.clients == clients and s.scenario == "replica"]
            if not steps:
                continue
            t, e = sum(s.timeouts for s in steps), sum(s.errors for s in steps)
            answered = min(s.answered for s in steps)  # a step that answered nothing proves nothing
            goals.append(Goal(r.name, f"failures @{clients:,} clients",
                              f"{t} timeouts, {e} errors ({answered:,} answered in the emptiest step)",
                              "0, 0, some answered", t == 0 and e == 0 and answered > 0))
        if r.workers == 1:
            for scenario in SCENARIOS:
                if any(s.scenario == scenario for s in r.steps) or (scenario == "on-demand" and r.held_error):
                    if scenario == "on-demand":
                        goals.append(Goal(r.name, "held-then-served (cold request)",
                                          f"{r.held_ms:,.0f} ms to its answer" if r.held_ms is not None
                                          else r.held_error, "served (200)", r.held_ms is not None))
                    goals += _within_goals(r, scenario)
        else:
            base = one_worker.get(CHOSEN)
            b, s = (base.step(GOAL_RPS_AT, False) if base else None), r.step(GOAL_RPS_AT, False)
            name = f"CPU per request, {r.workers} workers vs 1, JSON @{GOAL_RPS_AT}"
            if b and s and b.cpu_ms and s.cpu_ms:
                ratio = s.cpu_ms / b.cpu_ms
                goals.append(Goal(r.name, name, f"{s.cpu_ms:.3f} vs {b.cpu_ms:.3f} ms ({ratio:.2f}x)",
                                  f"<= {1 + GOAL_WITHIN:.2f}x", ratio <= 1 + GOAL_WITHIN))
                goals.append(Goal(r.name, f"req/s, {r.workers} workers vs 1, JSON @{GOAL_RPS_AT}",
                                  f"{s.rps:,.0f} vs {b.rps:,.0f}/s ({fmt_ratio(s.rps, b.rps)})", "reported", None))
            else:
                goals.append(Goal(r.name, name, "not measured", f"<= {1 + GOAL_WITHIN:.2f}x", None))
    floor = next((r for r in results if r.name == FLOOR), None)
    if floor is not None:
        goals += _floor_goals(floor, one_worker.get(CHOSEN), direct,
                              next((r for r in results if r.name == FLOOR_DJANGO), None))
        for r in results:
            if r.kind == FLOOR and r.workers > 1:
                b, s = floor.step(GOAL_RPS_AT, False), r.step(GOAL_RPS_AT, False)
                figure = (f"{s.cpu_ms:.3f} vs {b.cpu_ms:.3f} ms ({s.cpu_ms / b.cpu_ms:.2f}x)"
                          if b and s and b.cpu_ms and s.cpu_ms else "not measured")
                goals.append(Goal(r.name, f"stack alone: CPU per request, {r.workers} workers vs 1, JSON @{GOAL_RPS_AT}",
                                  figure, "reported", None))
    return goals


def _cpu_pair(r: Result) -> tuple[float | None, float | None]:
    """CPU ms per request at :data:`GOAL_RPS_AT` clients, (JSON, streamed); None: not read."""
    return tuple(s.cpu_ms if (s := r.step(GOAL_RPS_AT, stream)) else None for stream in (False, True))


def _floor_goals(floor: Result, chosen: Result | None, direct: Result,
                 django: Result | None = None) -> list[Goal]:
    """What the stack costs by itself (:data:`FLOOR`) and with Django's lean handler
    (:data:`FLOOR_DJANGO`) — reported, never judged: neither is llmgw — and what llmgw costs
    above the stack, per request at :data:`GOAL_RPS_AT` clients and one client at a time;
    the goal a floor already exceeds cannot be met on that stack."""
    def pair(values) -> str:
        return " / ".join("-" if v is None else f"{v:.3f}" for v in values) + " ms"

    goals = []
    for r, what in ((floor, "stack alone"), (django, "stack + Django's handler")):
        if r is None:
            continue
        cpus = _cpu_pair(r)
        over = [mode for mode, c in zip(("JSON", "streamed"), cpus) if c is not None and c > GOAL_CPU_MS]
        verdict = (f"; over the {GOAL_CPU_MS:g} ms goal by itself ({', '.join(over)})" if over else
                   f"; within the {GOAL_CPU_MS:g} ms goal by itself")
        goals += [Goal(r.name, f"{what}: CPU per request @{GOAL_RPS_AT} (JSON / streamed)",
                       pair(cpus) + (verdict if any(c is not None for c in cpus) else ""), "reported", None),
                  Goal(r.name, f"{what}: added p50 / p99, one client",
                       f"{r.p50_ms - direct.p50_ms:+.3f} / {r.p99_ms - direct.p99_ms:+.3f} ms", "reported", None)]
    cpus = _cpu_pair(floor)
    if chosen is not None:
        mine = _cpu_pair(chosen)
        above = [None if a is None or b is None else a - b for a, b in zip(mine, cpus)]
        goals.append(Goal(chosen.name, f"CPU above the stack's floor @{GOAL_RPS_AT} (JSON / streamed)",
                          " / ".join("-" if v is None else f"{v:+.3f}" for v in above)
                          + f" ms (llmgw {pair(mine)}, floor {pair(cpus)})", "reported", None))
        goals.append(Goal(chosen.name, "added p50 / p99 above the stack's floor, one client",
                          f"{chosen.p50_ms - floor.p50_ms:+.3f} / {chosen.p99_ms - floor.p99_ms:+.3f} ms",
                          "reported", None))
    return goals


def render_goals(goals: list[Goal]) -> list[str]:
    """The goals block: one line per goal, target, figure, wanted, verdict."""
    if not goals:
        return []
    w_target = max(len(g.target) for g in goals)
    w_goal = max(len(g.goal) for g in goals)
    out = [f"goals ({CHOSEN}, what `llmgw up` runs, and {AS_SHIPPED} decide; the other servers for comparison):"]
    for g in goals:
        out.append(f"  {g.verdict:<4}  {g.target:<{w_target}}  {g.goal:<{w_goal}}  {g.figure}  (goal {g.wanted})")
    return out


# --------------------------------------------------------------------------- reporting
def fmt_ratio(value: float, base: float) -> str:
    if not base or value is None or math.isnan(value) or math.isnan(base):
        return "-"
    return f"{value / base:.2f}x"


def render_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """Aligned text columns: the first left-aligned, the rest right-aligned, a rule under
    the head."""
    widths = [max(len(str(row[i])) for row in [head] + rows) for i in range(len(head))]
    line = lambda row: "  ".join(  # noqa: E731
        str(c).ljust(widths[i]) if i == 0 else str(c).rjust(widths[i]) for i, c in enumerate(row)).rstrip()
    return [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]


def table_rows(results: list[Result], concurrency) -> tuple[list[str], list[list[str]]]:
    """(head, rows) of the comparison table: direct, then each target and its ratio to
    direct (latency and CPU ratios > 1 are slower, req/s ratios < 1 are slower)."""
    direct, others = results[0], results[1:]
    head = ["scenario", "direct"] + [c for r in others for c in (r.name, "ratio")]
    rows: list[list[str]] = []

    def num(v: float | None, fmt: str = ".3f") -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    def add(label: str, d: float | None, values: list[float | None], fmt: str = ".3f", ratio: bool = True) -> None:
        if all(v is None or (isinstance(v, float) and math.isnan(v)) for v in [d, *values]):
            return
        rows.append([label, num(d, fmt)] + [c for v in values for c in (
            num(v, fmt), fmt_ratio(v, d) if ratio and v is not None and d else "")])

    def cell_step(s: Step | None) -> str:
        if s is None:
            return "-"
        flag = f" ({s.errors}e/{s.timeouts}t)" if s.errors or s.timeouts else ""
        return f"{s.rps:.0f}{flag}"

    add("latency p50 ms", direct.p50_ms, [r.p50_ms for r in others])
    add("latency p99 ms", direct.p99_ms, [r.p99_ms for r in others])
    rows.append(["added p50 ms", "-"] + [c for r in others for c in (num(r.p50_ms - direct.p50_ms, "+.3f"), "")])
    rows.append(["added p99 ms", "-"] + [c for r in others for c in (num(r.p99_ms - direct.p99_ms, "+.3f"), "")])
    if any(r.overhead_p50_ms is not None for r in others):
        rows.append(["X-Llmgw-Overhead p50/p99 ms", "-"] + [c for r in others for c in (
            f"{r.overhead_p50_ms:.2f}/{r.overhead_p99_ms:.2f}" if r.overhead_p50_ms is not None else "-", "")])
    if any(r.stalls for r in others):
        def stall_cell(r: Result, what: str) -> str:
            st = r.stalls
            if st is None:
                return "-"
            return {"n": f"{st.requests:,}", "over": str(st.over), "p99": f"+{st.p99_added_ms:.2f}",
                    "max": f"+{st.max_added_ms:.1f}"}[what]
        for what, label in (("n", "sequential requests"), ("over", f"stalls > {GOAL_STALL_MS:g} ms added"),
                            ("p99", "sequential added p99 ms"), ("max", "sequential added max ms")):
            rows.append([label, "-"] + [c for r in others for c in (stall_cell(r, what), "")])
    for clients in concurrency:
        for stream in (False, True):
            d = direct.step(clients, stream)
            label = f"req/s {clients:>4} clients {'stream' if stream else 'json'}"
            rows.append([label, cell_step(d)] + [c for r in others for c in (
                cell_step(r.step(clients, stream)),
                fmt_ratio(r.step(clients, stream).rps, d.rps) if d and r.step(clients, stream) else "-")])
    for scenario in SCENARIOS:
        if not any(s.scenario == scenario for r in others for s in r.steps):
            continue
        if scenario == "on-demand":
            rows.append(["held-then-served ms", "-"] + [c for r in others for c in (
                f"{r.held_ms:.0f}" if r.held_ms is not None else ("failed" if r.held_error else "-"), "")])
        for stream in (False, True):
            d = direct.step(GOAL_RPS_AT, stream)
            label = f"{scenario} req/s {GOAL_RPS_AT} {'stream' if stream else 'json'}"
            steps = [r.step(GOAL_RPS_AT, stream, scenario) for r in others]
            rows.append([label, cell_step(d)] + [c for s in steps for c in (
                cell_step(s), fmt_ratio(s.rps, d.rps) if d and s else "-")])
    if any(r.wrk for r in results):
        add(f"wrk req/s {GOAL_RPS_AT} json", direct.wrk.rps if direct.wrk else None,
            [r.wrk.rps if r.wrk else None for r in others], ".0f")
        add(f"wrk p50 ms {GOAL_RPS_AT} json", direct.wrk.p50_ms if direct.wrk else None,
            [r.wrk.p50_ms if r.wrk else None for r in others])
        add(f"wrk p99 ms {GOAL_RPS_AT} json", direct.wrk.p99_ms if direct.wrk else None,
            [r.wrk.p99_ms if r.wrk else None for r in others])
        rows.append([f"wrk errors/timeouts {GOAL_RPS_AT}", _wrk_fail(direct)]
                    + [c for r in others for c in (_wrk_fail(r), "")])
    add("cpu ms/req sequential", direct.latency_cpu_ms, [r.latency_cpu_ms for r in others])
    for clients in concurrency:
        for stream in (False, True):
            d = direct.step(clients, stream)
            add(f"cpu ms/req {clients:>4} clients {'stream' if stream else 'json'}", d.cpu_ms if d else None,
                [s.cpu_ms if (s := r.step(clients, stream)) else None for r in others])
    for scenario in SCENARIOS:
        for stream in (False, True):
            d = direct.step(GOAL_RPS_AT, stream)
            add(f"cpu ms/req {scenario} {GOAL_RPS_AT} {'stream' if stream else 'json'}", d.cpu_ms if d else None,
                [s.cpu_ms if (s := r.step(GOAL_RPS_AT, stream, scenario)) else None for r in others])
    if any(r.wrk for r in results):
        add(f"cpu ms/req wrk {GOAL_RPS_AT} json", direct.wrk.cpu_ms if direct.wrk else None,
            [r.wrk.cpu_ms if r.wrk else None for r in others])
    return head, rows


def _wrk_fail(r: Result) -> str:
    if r.wrk is None:
        return "-"
    return "failed" if r.wrk.error else f"{r.wrk.errors}/{r.wrk.timeouts}"


def report(results: list[Result], args, notes: list[str]) -> str:
    """The text report: the table, the goals block, the notes."""
    head, rows = table_rows(results, args.concurrency)
    out = render_table(head, rows)
    out.append("")
    out += render_goals(evaluate_goals(results))
    out.append("  (cap = workers x 1000 / CPU ms per request at that step: what the gateway's core(s) to itself "
               "would serve; req/s themselves depend on what else this machine runs)")
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


def render_markdown(results: list[Result], notes: list[str] | None = None) -> str:
    """The README's benchmark table (one column per gateway target, rows at 64 clients) and
    the goals as a list, in markdown, for pasting."""
    direct, others = results[0], [r for r in results[1:]]
    cols = [r for r in others if r.kind != AS_SHIPPED]
    shipped = next((r for r in others if r.kind == AS_SHIPPED), None)

    def n0(v: float | None) -> str:
        return "-" if v is None or math.isnan(v) else f"{v:,.0f}"

    def step_cell(r: Result, stream: bool, scenario: str = "replica") -> str:
        s = r.step(GOAL_RPS_AT, stream, scenario)
        return n0(s.rps) if s else "-"

    def cpu_cell(r: Result, scenario: str = "replica") -> str:
        cpus = [s.cpu_ms if (s := r.step(GOAL_RPS_AT, stream, scenario)) else None for stream in (False, True)]
        return " / ".join("-" if c is None else f"{c:.2f}" for c in cpus)

    def added(r: Result) -> str:
        a50, a99 = r.p50_ms - direct.p50_ms, r.p99_ms - direct.p99_ms
        return "-" if math.isnan(a50) else f"{a50:+.2f} / {a99:+.1f} ms"

    def failures(r: Result, clients: int) -> str:
        steps = [s for s in r.steps if s.clients == clients and s.scenario == "replica"]
        return "-" if not steps else str(sum(s.timeouts + s.errors for s in steps))

    def wrk_cell(r: Result) -> str:
        w = r.wrk
        if w is None or w.error:
            return "-"
        if not w.requests:  # e.g. a server still working off the 1,024-client step's backlog
            return "none answered"
        return f"{w.rps:,.0f} ({w.p50_ms:.2f} / {w.p99_ms:.2f} ms)"

    def name(r: Result) -> str:
        if r.name == FLOOR_DJANGO:
            return "floor: + Django's lean handler, no llmgw"
        if r.kind == FLOOR:
            return "floor: uvicorn + aiohttp, no llmgw" + (f", {r.workers} workers" if r.workers > 1 else "")
        label = f"uvicorn, {r.workers} workers" if r.workers > 1 else r.name
        return f"{label} (chosen)" if r.name == CHOSEN else label

    rows = [
        ("requests/s, JSON", [step_cell(r, False) for r in cols]),
        ("requests/s, streamed", [step_cell(r, True) for r in cols]),
        ("CPU ms per request (JSON / streamed)", [cpu_cell(r) for r in cols]),
        ("requests/s, JSON, wrk (p50 / p99)", [wrk_cell(r) for r in cols]),
        ("external model: requests/s JSON / streamed",
         [f"{step_cell(r, False, 'external')} / {step_cell(r, True, 'external')}" for r in cols]),
        ("external model: CPU ms per request", [cpu_cell(r, "external") for r in cols]),
        ("on-demand, held then warm: requests/s JSON / streamed",
         [f"{step_cell(r, False, 'on-demand')} / {step_cell(r, True, 'on-demand')}" for r in cols]),
        ("on-demand, warm: CPU ms per request", [cpu_cell(r, "on-demand") for r in cols]),
        ("added latency p50 / p99, one client", [added(r) for r in cols]),
        ("timeouts + errors at 256 / 1,024 clients",
         [f"{failures(r, 256)} / {failures(r, 1024)}" for r in cols]),
    ]
    head = [f"at {GOAL_RPS_AT} clients"] + [name(r) for r in cols]
    if shipped is not None:
        head.append("as `llmgw up` runs it")
        st = shipped.stalls
        extra = {"added latency p50 / p99, one client": added(shipped)}
        rows = [(label, cells + [extra.get(label, "-")]) for label, cells in rows]
        if st is not None:
            rows.append((f"stalls > {GOAL_STALL_MS:g} ms added in {st.requests:,} sequential (max)",
                         ["-"] * len(cols) + [f"{st.over} (+{st.max_added_ms:.1f} ms)"]))
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join([label, *cells]) + " |" for label, cells in rows]
    out.append("")
    out += [f"* {g.verdict} {g.target}: {g.goal} — {g.figure} (goal {g.wanted})" for g in evaluate_goals(results)]
    out += [f"* note: {n}" for n in notes or []]
    return "\n".join(out)


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--servers", default=",".join(SERVERS),
                   help=f"comma-separated ASGI servers for the gateway, of {', '.join(SERVERS)} (default: all)")
    p.add_argument("--server", choices=[*SERVERS, "both"], default=None,
                   help="one server (both: uvicorn and daphne); overrides --servers")
    p.add_argument("--workers", type=int, default=1,
                   help="N > 1: also uvicorn with N worker processes pinned to cores 0..N-1 (default 1: not run)")
    p.add_argument("--as-shipped", choices=["on", "off"], default="on",
                   help="the stalls phase against the gateway as `llmgw up` runs it (default on)")
    p.add_argument("--stall-requests", type=int, default=STALL_REQUESTS,
                   help=f"sequential requests of the as-shipped phase (default {STALL_REQUESTS:,})")
    p.add_argument("--floor", choices=["on", "off"], default="on",
                   help="also the stack's floor: bench/_floor_proxy.py, a bare uvicorn + aiohttp proxy (default on)")
    p.add_argument("--scenarios", choices=["on", "off"], default="on",
                   help="the external and held-then-served (on-demand) scenarios (default on)")
    p.add_argument("--duration-s", type=float, default=None, help="length of each req/s step (default 5; --quick 2)")
    p.add_argument("--latency-s", type=float, default=None, help="length of the latency phase (default: duration)")
    p.add_argument("--quick", action="store_true", help=f"clients {QUICK_CONCURRENCY} only, 2 s steps")
    p.add_argument("--concurrency", default=None,
                   help="comma-separated client counts (default " + ",".join(map(str, CONCURRENCY)) + ")")
    p.add_argument("--timeout-s", type=float, default=10.0, help="a request slower than this is a timeout")
    p.add_argument("--tokens", type=int, default=16, help="tokens the fake engine answers")
    p.add_argument("--gateway-core", type=int, default=0, help="the core the gateway (and litellm) is pinned to")
    p.add_argument("--litellm", choices=["auto", "off"], default="auto")
    p.add_argument("--litellm-python", default=None, help="an interpreter with litellm[proxy] installed")
    p.add_argument("--granian-python", default=None,
                   help="an interpreter whose venv has granian (default: this venv's, when it has granian)")
    p.add_argument("--wrk", default=None, help="path of wrk (default: on PATH or /usr/bin/wrk)")
    p.add_argument("--no-wrk", action="store_true", help="leave wrk out")
    p.add_argument("--profile", type=Path, default=None, metavar="DIR", help="py-spy each llmgw server into DIR")
    p.add_argument("--profile-clients", type=int, default=GOAL_RPS_AT)
    p.add_argument("--py-spy", default=None, help="path of py-spy (default: on PATH or next to python)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the results and goals as JSON")
    out.add_argument("--markdown", action="store_true", help="print the README's table and the goals in markdown")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, database)")
    p.add_argument("--from-json", type=Path, default=None, metavar="FILE",
                   help="measure nothing: print the table and goals (or --markdown) of a run saved with --json")
    args = p.parse_args(argv)
    if args.duration_s is None:
        args.duration_s = 2.0 if args.quick else 5.0
    if args.latency_s is None:
        args.latency_s = args.duration_s
    if args.concurrency:
        args.concurrency = tuple(int(c) for c in args.concurrency.split(","))
    else:
        args.concurrency = QUICK_CONCURRENCY if args.quick else CONCURRENCY
    if args.server:
        args.servers = ("uvicorn", "daphne") if args.server == "both" else (args.server,)
    else:
        args.servers = tuple(s.strip() for s in args.servers.split(",") if s.strip())
    unknown = set(args.servers) - set(SERVERS)
    if unknown:
        p.error(f"unknown server(s) {', '.join(sorted(unknown))}: choose from {', '.join(SERVERS)}")
    if args.workers < 1:
        p.error("--workers must be at least 1")
    return args


def raise_open_files() -> str:
    """RLIMIT_NOFILE's soft limit raised to its hard limit, for this process and (inherited)
    every child: 1,024 clients need as many sockets here and in the gateway. Returns a note
    when the hard limit is too low for the largest step."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return "" if soft == resource.RLIM_INFINITY or soft >= 4096 else (
        f"open files limited to {soft} (ulimit -n): the 1,024-client steps may fail for want of sockets")


def find_py_spy(arg: str | None) -> str | None:
    for candidate in (arg, shutil.which("py-spy"), str(Path(PYTHON).parent / "py-spy")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def split_cores(gateway_core: int) -> tuple[set[int], list[str]]:
    """The cores this process may use other than ``gateway_core``, for the load generator and
    the engines (``{gateway_core}`` itself on a one-core machine), and a note saying so then."""
    load_cores = set(os.sched_getaffinity(0)) - {gateway_core} or {gateway_core}
    if load_cores == {gateway_core}:
        return load_cores, ["only one core: the gateway shares it with the load generator and the engines"]
    return load_cores, []


def load_results(data: dict) -> list[Result]:
    """The results of a run saved with ``--json`` (:func:`as_json`), as :class:`Result` objects."""
    def num(v):
        return float("nan") if v is None else v

    out = []
    for r in data["results"]:
        r = dict(r)
        steps = [Step(**{k: v for k, v in s.items() if k not in ("rps", "cpu_ms")}) for s in r.pop("steps")]
        wrk = Wrk(**{k: num(v) if k in ("p50_ms", "p99_ms") else v for k, v in r.pop("wrk").items()}) \
            if r.get("wrk") else r.pop("wrk", None)
        stalls = Stalls(**{k: num(v) for k, v in r.pop("stalls").items()}) if r.get("stalls") else r.pop("stalls", None)
        r["p50_ms"], r["p99_ms"] = num(r["p50_ms"]), num(r["p99_ms"])
        out.append(Result(**r, steps=steps, wrk=wrk, stalls=stalls))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_json:
        data = json.loads(args.from_json.read_text())
        results = load_results(data)
        args.concurrency = tuple(data["args"]["concurrency"])
        print(render_markdown(results, data["notes"]) if args.markdown else report(results, args, data["notes"]))
        return 0
    signal.signal(signal.SIGTERM, _interrupt)
    gateway_core = args.gateway_core
    load_cores, notes = split_cores(gateway_core)
    note = raise_open_files()
    if note:
        notes.append(note)
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-bench-gw-"))
    procs: list[Proc] = []
    heartbeat: Heartbeat | None = None
    results: list[Result] = []
    ok = interrupted = False
    py_spy = None
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        py_spy = find_py_spy(args.py_spy)
        if py_spy is None:
            notes.append("--profile: py-spy not found (pip install py-spy, or --py-spy PATH); not profiled")
    wrk = None if args.no_wrk else find_wrk(args.wrk)
    if wrk is None and not args.no_wrk:
        notes.append("wrk rows skipped: wrk not found (apt-get install wrk, or --wrk PATH)")
    granian = None
    if "granian" in args.servers:
        granian, note = find_granian(args.granian_python)
        if granian is None:
            notes.append(note)
    try:
        os.sched_setaffinity(0, load_cores)  # the load generator (this process) off the gateway's core
        setup_django(tmp)
        engine_port = free_port()
        engine_key = secrets.token_urlsafe(32)
        procs.append(start_engine(engine_port, load_cores, tmp, args.tokens, engine_key))
        agent_id, key = create_rows(engine_port, engine_key)
        heartbeat = Heartbeat(agent_id)
        heartbeat.start()
        body = bodies(args.tokens)
        say(f"cores: gateway {gateway_core}, load generator and engine {sorted(load_cores)}; temp dir {tmp}")

        notes.append(f"machine at start: {machine_load()}")
        # Direct: with the engine key, as the gateway reaches it.
        direct = Target("direct", f"http://127.0.0.1:{engine_port}/v1/chat/completions", engine_key, procs[0].pid)
        results.append(bench_target(direct, args, body, None, None, load_cores, Result("direct", kind="direct"),
                                    wrk, tmp))

        def run_gateway(server: str, name: str, cores: set[int], workers: int = 1, kind: str = "llmgw",
                        scenarios: bool = False) -> None:
            port = free_port()
            on_demand_name = f"{ON_DEMAND_MODEL}-{name}"
            on_demand_id = create_on_demand(on_demand_name) if scenarios else 0
            say(f"[{name}] starting the gateway on cores {sorted(cores)}")
            proc = start_gateway(server, port, cores, tmp, workers, granian, name,
                                 floor_upstream=f"http://127.0.0.1:{engine_port}")
            procs.append(proc)
            # The floor forwards the client's Authorization as it is: it is sent the engine's key.
            target = Target(name, f"http://127.0.0.1:{port}/v1/chat/completions",
                            engine_key if kind == FLOOR else key, proc.pid)
            wait_routed(target, body[False])
            result = Result(name, kind=kind, workers=workers)
            if kind == AS_SHIPPED:
                say(f"[{name}] {args.stall_requests:,} sequential requests (stalls)")
                times = run_async(measure_latency(target, body[False], 0, args.timeout_s, result,
                                                  count=args.stall_requests))
                result.stalls = stall_summary(times, results[0].p50_ms)
                st = result.stalls
                say(f"[{name}]   p50 {result.p50_ms:.3f} ms, p99 {result.p99_ms:.3f} ms; {st.over} over "
                    f"{st.threshold_ms:g} ms added, max +{st.max_added_ms:.1f} ms")
            else:
                bench_target(target, args, body, args.profile if workers == 1 else None, py_spy, load_cores, result,
                             wrk, tmp)
                if scenarios:
                    bench_scenarios(target, args, result, on_demand_id, agent_id, engine_port, engine_key,
                                    on_demand_name, (args.profile, py_spy, load_cores) if args.profile else None)
            results.append(result)
            proc.stop()
            procs.remove(proc)

        for server in args.servers:
            if server == "granian" and granian is None:
                continue
            run_gateway(server, server, {gateway_core}, scenarios=args.scenarios == "on")
        if args.floor == "on":
            run_gateway(FLOOR, FLOOR, {gateway_core}, kind=FLOOR)
            run_gateway(FLOOR_DJANGO, FLOOR_DJANGO, {gateway_core}, kind=FLOOR)
            notes.append(f"{FLOOR}: bench/_floor_proxy.py under the same uvicorn, one shared aiohttp session, no "
                         "framework and none of llmgw's work: what this stack costs by itself")
            notes.append(f"{FLOOR_DJANGO}: bench/_floor_django.py, the same forwarding as a trivial async view "
                         "behind llmgw's lean Django handler (request, URL resolution, response, ASGI send): "
                         "what Django adds to the stack")
        if args.workers > 1:
            cores = set(range(args.workers))
            if cores & load_cores:
                notes.append(f"uvicorn-w{args.workers}: its cores {sorted(cores)} include the load generator's "
                             f"{sorted(load_cores)}: its req/s are low by what the load generator takes; its CPU "
                             "per request is the figure to compare")
            run_gateway("uvicorn", f"uvicorn-w{args.workers}", cores, workers=args.workers)
            if args.floor == "on":  # what the stack alone does with N processes on the same cores
                run_gateway(FLOOR, f"{FLOOR}-w{args.workers}", cores, workers=args.workers, kind=FLOOR)
        if args.as_shipped == "on":
            run_gateway(AS_SHIPPED, AS_SHIPPED, {gateway_core}, kind=AS_SHIPPED)
            notes.append(f"{AS_SHIPPED}: llmgw.cli.web_processes.web_argv's uvicorn (access log on, as `llmgw up`), its "
                         "output to a file here (`llmgw up` reads it through a pipe); no worker or agent process "
                         "runs beside it (the bench makes their rows)")

        if args.litellm == "auto":
            python, note = litellm_python(args.litellm_python)
            if python is None:
                notes.append(note)
            else:
                port = free_port()
                say(f"[litellm] starting LiteLLM's proxy on core {gateway_core} ({python})")
                proc = start_litellm(python, port, engine_port, engine_key, gateway_core, tmp)
                procs.append(proc)
                target = Target("litellm", f"http://127.0.0.1:{port}/v1/chat/completions", LITELLM_KEY, proc.pid)
                try:
                    wait_routed(target, body[False], timeout_s=120)
                except TimeoutError as exc:  # a LiteLLM that never answers costs its column, not the run
                    say(f"[litellm] {exc}")
                    notes.append(f"litellm column skipped: {exc}"[:300])
                else:
                    results.append(bench_target(target, args, body, None, None, load_cores,
                                                Result("litellm", kind="litellm"), wrk, tmp))
                    notes.append("litellm: its proxy with a master key and no database (no virtual keys, no spend "
                                 "logs), one uvicorn worker")
        notes.append(f"machine at end: {machine_load()}")
        ok = True
    except KeyboardInterrupt:
        interrupted = True
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # connections cut short: expected now
        say("interrupted: stopping the processes started")
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        for proc in reversed(procs):
            try:
                proc.stop()
            except Exception as exc:
                say(f"stopping {proc.log_path.name}: {exc}")
        if not ok and not interrupted:  # a failure: what the processes said (an interrupt is no failure of theirs)
            for log in sorted(tmp.glob("*.log")):
                tail = log.read_text(errors="replace").splitlines()[-30:]
                say(f"--- {log.name} (last lines) ---\n" + "\n".join(tail))
        if args.keep or not ok:
            say(f"logs and database kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if interrupted:
        return 130
    if not ok or len(results) < 2:
        return 1
    if args.json:
        print(json.dumps(as_json(results, args, gateway_core, load_cores, notes), indent=2))
    elif args.markdown:
        print(render_markdown(results, notes))
    else:
        print(report(results, args, notes))
    for r in results:
        for mode, path in r.profiles.items():
            if Path(path).exists():
                say(f"\n[{r.name}] py-spy at {args.profile_clients} clients, {mode}:\n" + summarize_profile(Path(path)))
    return 0


def as_json(results: list[Result], args, gateway_core: int, load_cores: set[int], notes: list[str]) -> dict:
    """The run as JSON-ready data: its arguments, cores, notes, every result (steps with
    their req/s and CPU ms per request) and every goal (:func:`evaluate_goals`)."""
    def clean(v):
        if isinstance(v, float) and math.isnan(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return clean({
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cores": {"gateway": gateway_core, "load": sorted(load_cores)}, "notes": notes,
        "results": [{**asdict(r), "steps": [{**asdict(s), "rps": s.rps, "cpu_ms": s.cpu_ms} for s in r.steps]}
                    for r in results],
        "goals": [{**asdict(g), "verdict": g.verdict} for g in evaluate_goals(results)],
    })


if __name__ == "__main__":
    sys.exit(main())
