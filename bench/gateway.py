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
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.processes import PYTHON, Proc, free_port, wait_for_port  # noqa: E402

from bench._pyspy import summarize_profile  # noqa: E402
from bench._gateway_goals import (  # noqa: E402
    AS_SHIPPED, CONCURRENCY, EXTERNAL_MODEL, FLOOR, FLOOR_DJANGO, GOAL_RPS_AT, HEARTBEAT_S, HELD_TIMEOUT_S, LITELLM_KEY,
    MODEL, ON_DEMAND_MODEL, QUICK_CONCURRENCY, SERVERS, STALL_REQUESTS, Result, Step, Target, as_json, load_results,
    render_markdown, report,
)
from bench._gateway_load import (  # noqa: E402
    Profiler, bodies, find_wrk, machine_load, measure_latency, measure_rps, run_async, run_wrk, say, say_step, session,
    stall_summary, taskset, wait_routed,
)



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


if __name__ == "__main__":
    sys.exit(main())
