"""Gateway overhead benchmark: the same fake engine reached directly and through llmgw.

    python bench/gateway.py                      # daphne and uvicorn side by side (~5 min)
    python bench/gateway.py --quick              # 64 and 256 clients only, 2 s steps (~2 min)
    python bench/gateway.py --litellm-python /path/to/venv/bin/python   # + LiteLLM's proxy
    python bench/gateway.py --server uvicorn --duration-s 10 --json
    python bench/gateway.py --profile /tmp/gwprof   # also py-spy the gateway at 64 clients

What runs (each a real process; all stopped at the end, also on error, Ctrl-C or SIGTERM):

* ``tests/fake_engine.py`` (on uvloop, ``bench/_uvloop_engine.py``) answering 16 tokens with
  no delay, non-streamed or as SSE;
* the llmgw gateway on a fresh SQLite database in a temp dir, under ``daphne`` (as
  ``llmgw up`` runs it, access log on) and/or ``uvicorn --loop uvloop --http httptools
  --no-access-log``, one after the other, each pinned to one core with ``taskset -c 0``
  (``--gateway-core``), with its default settings (``LLMGW_*`` from the environment);
* optionally LiteLLM's proxy (``litellm --config``, one uvicorn worker, master key only, no
  database) in front of the same engine, pinned the same way: a third column, when
  ``litellm[proxy]`` is importable here or ``--litellm-python`` names an interpreter that
  has it;
* the load generator (this process: asyncio on uvloop, one aiohttp ``ClientSession`` per
  step with ``limit`` = clients) and the fake engine share the other core(s).

The catalog rows are made in-process, as the reconciler and an agent would leave them: a
Profile (custom engine), a Model ``bench-model``, an Agent (connected, 127.0.0.1, its
``last_seen_at`` refreshed every 3 s by a thread here: the gateway only routes to agents
heard from recently), a Replica ``ready`` on the fake engine's port, and an API key sent as
``Authorization: Bearer``. No reconciler or agent runs; the gateway does its real per-request
work (key lookup, model resolution, routing, usage records, Prometheus metrics).

Measured, per target (direct, each gateway):

* latency, one request at a time (non-streamed chat completion) for ``--latency-s``:
  p50 / p99 of the client-side round trip; *added* = gateway percentile - direct percentile.
  For llmgw also the gateway's own ``X-Llmgw-Overhead-Ms`` header (work before the upstream
  call);
* requests per second at 1, 16, 64 and 256 concurrent clients (``--concurrency``),
  non-streamed and streamed (the whole SSE stream read, ``[DONE]`` checked), each step
  ``--duration-s`` long after a short warm-up; non-200 answers, broken or incomplete
  streams count as errors, requests over ``--timeout-s`` as timeouts.

Also, per phase, the CPU time the target's process (all threads, and children) used per
answered request, read from /proc: unlike req/s it hardly depends on what else the machine
runs, and 1000 / (CPU ms per request) is what the gateway would serve with its core to
itself ("cap" in the goals line). On a shared machine read the CPU rows first.

Printed: a table (scenario, direct, each server and its ratio to direct: latency and CPU
ratios > 1 are slower, req/s ratio < 1 is slower) and the goals, per server: at 64 clients
>= 1,000 req/s streamed and non-streamed on one core; added p50 <= 1 ms and p99 <= 5 ms; no
timeouts at 256 clients. ``--json`` prints the results as JSON instead. Progress goes to
stderr; logs and the database stay in the temp dir with ``--keep``.

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
CONCURRENCY = (1, 16, 64, 256)
QUICK_CONCURRENCY = (64, 256)
GOAL_RPS_AT = 64
GOAL_RPS = 1000.0
GOAL_ADDED_P50_MS = 1.0
GOAL_ADDED_P99_MS = 5.0
GOAL_NO_TIMEOUTS_AT = 256
SERVERS = ("daphne", "uvicorn")
HEARTBEAT_S = 3.0
LATENCY_MIN_REQUESTS = 500
LITELLM_KEY = "sk-bench-litellm-master"


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
    ``engine_key``, the replica's engine key); returns the agent's id and a clear API key."""
    from django.utils import timezone

    from catalog.models import ClusterSettings, Model, Profile
    from fleet.models import Agent, Replica
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
    agent = Agent.objects.create(name="bench-agent", connected=True, connected_since=timezone.now(),
                                 last_seen_at=timezone.now(), address="127.0.0.1", cpu_cores=os.cpu_count() or 1,
                                 memory_mib=1024)
    Replica.objects.create(model=model, profile=profile, agent=agent, state="ready", port=engine_port,
                           cpu_cores=1, memory_mib=64, ready_at=timezone.now(), engine_key=engine_key)
    _, key = ApiKey.create_key("bench")
    return agent.pk, key


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


def start_gateway(server: str, port: int, core: int, tmp: Path) -> Proc:
    if server == "daphne":
        argv = [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "llmgw.asgi:application"]
    else:
        argv = [PYTHON, "-m", "uvicorn", "llmgw.asgi:application", "--host", "127.0.0.1", "--port", str(port),
                "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"]
    proc = Proc([*taskset({core}), *argv], tmp / f"gateway-{server}.log")
    wait_for_port(port, timeout_s=60, proc=proc.proc)
    return proc


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


def start_litellm(python: str, port: int, engine_port: int, core: int, tmp: Path) -> Proc:
    config = tmp / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: http://127.0.0.1:{engine_port}/v1\n"
        "      api_key: sk-fake\n"
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
class Result:
    name: str
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    latency_n: int = 0
    latency_errors: int = 0
    overhead_p50_ms: float | None = None
    overhead_p99_ms: float | None = None
    latency_cpu_ms: float | None = None  # the target's CPU time per request, one at a time
    steps: list[Step] = field(default_factory=list)
    profiles: dict[str, str] = field(default_factory=dict)

    def step(self, clients: int, stream: bool) -> Step | None:
        return next((s for s in self.steps if s.clients == clients and s.stream == stream), None)


def bodies(tokens: int) -> dict[bool, bytes]:
    base = {"model": MODEL, "max_tokens": tokens, "messages": [{"role": "user", "content": "Say something."}]}
    return {False: json.dumps(base).encode(), True: json.dumps({**base, "stream": True}).encode()}


def session(aiohttp, target: Target, clients: int, timeout_s: float):
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=clients, limit_per_host=clients, ttl_dns_cache=None,
                                       enable_cleanup_closed=False),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        headers={"Authorization": f"Bearer {target.key}", "Content-Type": "application/json"},
        skip_auto_headers=("User-Agent",), auto_decompress=False,
    )


async def measure_latency(target: Target, body: bytes, seconds: float, timeout_s: float, result: Result) -> None:
    """One request at a time for ``seconds`` (after 100 warm-up requests), longer (up to 4x)
    until at least LATENCY_MIN_REQUESTS were answered, for a p99 worth reading."""
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
        while clock() < end or (len(times) < LATENCY_MIN_REQUESTS and clock() < hard_end):
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
def bench_target(target: Target, args, body: dict[bool, bytes], profile_dir: Path | None, py_spy: str | None,
                 load_cores: set[int]) -> Result:
    result = Result(target.name)
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
            run_async(measure_rps(target, body[stream], step, warmup if not profiler else 0.0, args.timeout_s))
            if profiler:
                profiler.finish()
            result.steps.append(step)
            extra = f", {step.errors} errors, {step.timeouts} timeouts" if step.errors or step.timeouts else ""
            if step.cpu_ms is not None:
                extra += f", {step.cpu_ms:.2f} ms CPU/request"
            say(f"[{target.name}]   {clients:>3} clients {mode:>6}: {step.rps:8.0f} req/s{extra}"
                + (f"  first error: {step.first_error}" if step.first_error else ""))
    return result


def fmt_ratio(value: float, base: float) -> str:
    if not base or math.isnan(value) or math.isnan(base):
        return "-"
    return f"{value / base:.2f}x"


def report(results: list[Result], args, notes: list[str]) -> str:
    direct, others = results[0], results[1:]
    head = ["scenario", "direct"] + [c for r in others for c in (r.name, "ratio")]
    rows: list[list[str]] = []

    def cell_step(s: Step | None) -> str:
        if s is None:
            return "-"
        flag = f" ({s.errors}e/{s.timeouts}t)" if s.errors or s.timeouts else ""
        return f"{s.rps:.0f}{flag}"

    rows.append(["latency p50 ms", f"{direct.p50_ms:.3f}"] + [c for r in others for c in
                                                              (f"{r.p50_ms:.3f}", fmt_ratio(r.p50_ms, direct.p50_ms))])
    rows.append(["latency p99 ms", f"{direct.p99_ms:.3f}"] + [c for r in others for c in
                                                              (f"{r.p99_ms:.3f}", fmt_ratio(r.p99_ms, direct.p99_ms))])
    rows.append(["added p50 ms", "-"] + [c for r in others for c in (f"{r.p50_ms - direct.p50_ms:+.3f}", "")])
    rows.append(["added p99 ms", "-"] + [c for r in others for c in (f"{r.p99_ms - direct.p99_ms:+.3f}", "")])
    if any(r.overhead_p50_ms is not None for r in others):
        rows.append(["X-Llmgw-Overhead p50/p99 ms", "-"] + [c for r in others for c in (
            f"{r.overhead_p50_ms:.2f}/{r.overhead_p99_ms:.2f}" if r.overhead_p50_ms is not None else "-", "")])
    for clients in args.concurrency:
        for stream in (False, True):
            d = direct.step(clients, stream)
            label = f"req/s {clients:>3} clients {'stream' if stream else 'json'}"
            rows.append([label, cell_step(d)] + [c for r in others for c in (
                cell_step(r.step(clients, stream)),
                fmt_ratio(r.step(clients, stream).rps, d.rps) if d and r.step(clients, stream) else "-")])
    cpu_rows = [("cpu ms/req sequential", direct.latency_cpu_ms, [r.latency_cpu_ms for r in others])]
    for clients in args.concurrency:
        for stream in (False, True):
            steps = [r.step(clients, stream) for r in others]
            d = direct.step(clients, stream)
            cpu_rows.append((f"cpu ms/req {clients:>3} clients {'stream' if stream else 'json'}",
                             d.cpu_ms if d else None, [s.cpu_ms if s else None for s in steps]))
    if any(v is not None for _, _, vs in cpu_rows for v in vs):
        for label, d, values in cpu_rows:
            rows.append([label, "-" if d is None else f"{d:.3f}"] + [c for v in values for c in (
                "-" if v is None else f"{v:.3f}", fmt_ratio(v, d) if v is not None and d else "-")])
    widths = [max(len(str(row[i])) for row in [head] + rows) for i in range(len(head))]
    line = lambda row: "  ".join(  # noqa: E731
        str(c).ljust(widths[i]) if i == 0 else str(c).rjust(widths[i]) for i, c in enumerate(row))
    out = [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]
    out.append("")
    out.append(f"goals: at {GOAL_RPS_AT} clients >= {GOAL_RPS:,.0f} req/s streamed and non-streamed on one core; "
               f"added p50 <= {GOAL_ADDED_P50_MS:g} ms, p99 <= {GOAL_ADDED_P99_MS:g} ms; "
               f"no timeouts at {GOAL_NO_TIMEOUTS_AT} clients")
    for r in others:
        out.append(f"  {r.name:<8} " + "; ".join(goal_verdicts(r, direct)))
    out.append("  (cap = 1000 / CPU ms per request at that step: what one core to itself would serve; "
               "req/s themselves depend on what else this machine runs)")
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


def goal_verdicts(r: Result, direct: Result) -> list[str]:
    v = lambda ok: "PASS" if ok else "MISS"  # noqa: E731
    parts = []
    for stream in (False, True):
        s = r.step(GOAL_RPS_AT, stream)
        if s is not None:
            cap = f" (cap {1000 / s.cpu_ms:,.0f}/s)" if s.cpu_ms else ""
            parts.append(f"{'stream' if stream else 'json'} @{GOAL_RPS_AT} {s.rps:,.0f}/s{cap} {v(s.rps >= GOAL_RPS)}")
    added50, added99 = r.p50_ms - direct.p50_ms, r.p99_ms - direct.p99_ms
    parts.append(f"added p50 {added50:.2f} ms {v(added50 <= GOAL_ADDED_P50_MS)}")
    parts.append(f"added p99 {added99:.2f} ms {v(added99 <= GOAL_ADDED_P99_MS)}")
    at = [s for s in r.steps if s.clients == GOAL_NO_TIMEOUTS_AT]
    if at:
        t = sum(s.timeouts for s in at)
        parts.append(f"timeouts @{GOAL_NO_TIMEOUTS_AT} {t} {v(t == 0)}")
    return parts


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", choices=["daphne", "uvicorn", "both"], default="both",
                   help="ASGI server(s) for the gateway (default: both, side by side)")
    p.add_argument("--duration-s", type=float, default=None, help="length of each req/s step (default 5; --quick 2)")
    p.add_argument("--latency-s", type=float, default=None, help="length of the latency phase (default: duration)")
    p.add_argument("--quick", action="store_true", help=f"clients {QUICK_CONCURRENCY} only, 2 s steps")
    p.add_argument("--concurrency", default=None, help="comma-separated client counts (default 1,16,64,256)")
    p.add_argument("--timeout-s", type=float, default=10.0, help="a request slower than this is a timeout")
    p.add_argument("--tokens", type=int, default=16, help="tokens the fake engine answers")
    p.add_argument("--gateway-core", type=int, default=0, help="the core the gateway (and litellm) is pinned to")
    p.add_argument("--litellm", choices=["auto", "off"], default="auto")
    p.add_argument("--litellm-python", default=None, help="an interpreter with litellm[proxy] installed")
    p.add_argument("--profile", type=Path, default=None, metavar="DIR", help="py-spy each llmgw server into DIR")
    p.add_argument("--profile-clients", type=int, default=GOAL_RPS_AT)
    p.add_argument("--py-spy", default=None, help="path of py-spy (default: on PATH or next to python)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, database)")
    args = p.parse_args(argv)
    if args.duration_s is None:
        args.duration_s = 2.0 if args.quick else 5.0
    if args.latency_s is None:
        args.latency_s = args.duration_s
    if args.concurrency:
        args.concurrency = tuple(int(c) for c in args.concurrency.split(","))
    else:
        args.concurrency = QUICK_CONCURRENCY if args.quick else CONCURRENCY
    return args


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
    signal.signal(signal.SIGTERM, _interrupt)
    gateway_core = args.gateway_core
    load_cores, notes = split_cores(gateway_core)
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-bench-gw-"))
    procs: list[Proc] = []
    heartbeat: Heartbeat | None = None
    results: list[Result] = []
    ok = False
    py_spy = None
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        py_spy = find_py_spy(args.py_spy)
        if py_spy is None:
            notes.append("--profile: py-spy not found (pip install py-spy, or --py-spy PATH); not profiled")
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
        results.append(bench_target(Target("direct", f"http://127.0.0.1:{engine_port}/v1/chat/completions", engine_key,
                                           procs[0].pid), args, body, None, None, load_cores))
        servers = SERVERS if args.server == "both" else (args.server,)
        for server in servers:
            port = free_port()
            say(f"[{server}] starting the gateway on core {gateway_core}")
            proc = start_gateway(server, port, gateway_core, tmp)
            procs.append(proc)
            target = Target(server, f"http://127.0.0.1:{port}/v1/chat/completions", key, proc.pid)
            wait_routed(target, body[False])
            results.append(bench_target(target, args, body, args.profile, py_spy, load_cores))
            proc.stop()
            procs.remove(proc)

        if args.litellm == "auto":
            python, note = litellm_python(args.litellm_python)
            if python is None:
                notes.append(note)
            else:
                port = free_port()
                say(f"[litellm] starting LiteLLM's proxy on core {gateway_core} ({python})")
                proc = start_litellm(python, port, engine_port, gateway_core, tmp)
                procs.append(proc)
                target = Target("litellm", f"http://127.0.0.1:{port}/v1/chat/completions", LITELLM_KEY, proc.pid)
                wait_routed(target, body[False], timeout_s=120)
                results.append(bench_target(target, args, body, None, None, load_cores))
                notes.append("litellm: its proxy with a master key and no database (no virtual keys, no spend "
                             "logs), one uvicorn worker")
        notes.append(f"machine at end: {machine_load()}")
        ok = True
    except KeyboardInterrupt:
        say("interrupted")
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        for proc in reversed(procs):
            try:
                proc.stop()
            except Exception as exc:
                say(f"stopping {proc.log_path.name}: {exc}")
        if not ok:
            for log in sorted(tmp.glob("*.log")):
                tail = log.read_text(errors="replace").splitlines()[-30:]
                say(f"--- {log.name} (last lines) ---\n" + "\n".join(tail))
        if args.keep or not ok:
            say(f"logs and database kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if not ok or len(results) < 2:
        return 1
    if args.json:
        data = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "cores": {"gateway": gateway_core, "load": sorted(load_cores)}, "notes": notes,
                "results": [{**asdict(r), "steps": [{**asdict(s), "rps": s.rps, "cpu_ms": s.cpu_ms} for s in r.steps]}
                            for r in results],
                "goals": {r.name: goal_verdicts(r, results[0]) for r in results[1:]}}
        print(json.dumps(data, indent=2))
    else:
        print(report(results, args, notes))
    for r in results:
        for mode, path in r.profiles.items():
            if Path(path).exists():
                say(f"\n[{r.name}] py-spy at {args.profile_clients} clients, {mode}:\n" + summarize_profile(Path(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
