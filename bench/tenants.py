"""Tenants benchmark (issue 16): fair admission across teams, and what tenants' limits cost.

    python bench/tenants.py                  # 30 s phases, 8 s CPU steps (~5 min)
    python bench/tenants.py --quick          # 12 s phases, 5 s CPU steps (~2 min on 2 cores)
    python bench/tenants.py --capacity 32 --json --keep

What runs (each a real process; all stopped at the end, also on error, Ctrl-C or SIGTERM):
as ``bench/gateway.py`` — a fresh SQLite database in a temp dir, the catalog rows made
in-process (a custom Profile, an Agent kept "heard from" by a heartbeat thread here, ready
Replicas on fake engines, API keys), the gateway as ``llmgw up`` runs it (uvicorn,
``llmgw.cli.web_processes.web_argv``, access log off) pinned to ``--gateway-core``, the load generator
(this process, asyncio on uvloop, aiohttp) and the engines on the other core(s) — and:

* ``bench-slow``: ``tests/fake_engine.py`` (on uvloop) answering a request's ``max_tokens``
  tokens ``--token-delay-ms`` apart (``--tokens`` 8 × 50 ms: ~0.4 s a request). The gateway
  learns C from a ``catalog.models.Benchmark(max_concurrency=C)`` row, so its admission queue
  (``gateway.queueing``) holds what is above C (and the headroom it lends a team under its
  share); the engine's own hard limit (``--capacity``) is C plus that headroom, more wait at
  the engine — as a real engine's ``max_num_seqs`` lies above its benchmarked concurrency;
* ``bench-model``: the same fake engine with no delay and no capacity (16 tokens), for the
  CPU measurement (capacity unknown: no admission queue on its way);
* a private ``redis-server`` (its own port, ``--save ""``, as ``tests/pg.py``'s
  PrivateRedis) for the second CPU measurement, the gateway then started with
  ``LLMGW_REDIS_URL``.

1. **Fair admission.** Team A's key (team ``team-a``) sends 10·C concurrent streamed
   requests, closed loop (each client sends its next as soon as the last is done), of
   mixed lengths; team B's
   key (team ``team-b``) sends streamed requests open loop, Poisson arrivals (seeded) at
   ``--b-share`` (10%) of the capacity's throughput (C / a request's seconds); A's clients
   run in a process of their own, so that reading their streams does not delay the event
   loop B is timed on. B's TTFT —
   from sending to the first SSE chunk with content — in three phases: B alone; B with A
   under FIFO admission (the gateway restarted with ``LLMGW_ADMISSION_ORDER=fifo``); B with A
   under fair admission (``fair``, the default). Also A's answered requests per second
   inside the window, every non-200 (by status and error code), the engine's most requests
   running and waiting (its /metrics, sampled every 0.2 s: waiting should stay 0, the queue
   is the gateway's) and the gateway's CPU per answered request. ``admission_wait_s`` is set
   to 60 s, so no request should be refused with 429 ``model_at_capacity``.
2. **CPU per request, limits on vs off.** The gateway's CPU time (its process, from /proc)
   per answered request at ``--clients`` (64) clients, non-streamed ``bench-model``, with a
   key without limits ("off") and a key with requests/min, tokens/min, concurrency and a
   day's token budget all set far above what the run reaches ("on"), in embedded mode
   (counters in the process) and on Redis. Steps run off, on, on, off (so a drift of the
   machine's load hits both alike); "noise" is the difference of the two "off" steps. The
   gateway spends CPU idle too (its watcher's refreshes, usage and heartbeat flushes: read
   for ``--idle-s`` before the steps); per request that part grows as req/s fall, and on a
   shared machine they swing from step to step, so the goal compares CPU *net of idle*
   (raw figures printed too).

Goals (PASS/MISS): B's TTFT p95 with fair ≤ 1.5× B alone; A's throughput with fair ≥ 90% of
what B leaves of the capacity's throughput (capacity throughput: C / B's mean request
seconds alone; A's share of the whole is printed too); nothing lost (no non-200 in any
phase); limits on cost ≤ 0.1 ms more CPU per request than off (net of idle), in each mode.

A fair queue cannot admit B before a slot frees: with every slot busy, one frees every
``gap`` = (request seconds / C) on average, and B waits for the next. A's answers have mixed
lengths (``--a-lengths mixed``: tokens/2 to 3·tokens/2, mean ``--tokens``), so the slots free
at random and that wait is about exponential (mean ``gap``, p95 3·gap); the "slot floor"
line prints it, to tell the queue's order from that arithmetic. With ``--a-lengths fixed``
the slots free in clumps (see :class:`ALoad`) and B waits up to a whole request. B's
requests as the gateway recorded them (usage records: its TTFT, which holds the admission
wait, and its own work before the upstream call, which does not) are printed beside the client's.

Printed: the two tables side by side and the goals; ``--json`` prints the results as JSON
instead. Progress goes to stderr; logs and the database stay in the temp dir with
``--keep`` (and on failure). ``--profile DIR`` samples the gateway with py-spy (when it is
installed) during the fair phase and the "on" steps, as ``bench/gateway.py --profile`` does,
and prints where its time goes, and for each mode where "on" spends more than "off"
(the second on and off steps, ms per request; py-spy shares the load generator's cores, so
take the figures from a run without it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._cleanup import finish_logs, shield_cleanup  # noqa: E402
from bench._fair_load import SLOW_MODEL, Phase, merged, run_phase, say_phase, stream_body, wait_idle  # noqa: E402
from bench._pyspy import summarize_profile  # noqa: E402
from bench._gateway_goals import Step, Target  # noqa: E402
from bench._gateway_load import (  # noqa: E402
    Profiler, bodies, cpu_seconds, machine_load, measure_rps, percentile, run_async, say, taskset, wait_routed,
)
from bench.gateway import Heartbeat, create_rows, find_py_spy, setup_django, split_cores, start_engine  # noqa: E402
from tests.processes import PYTHON, Proc, free_port, wait_for_port  # noqa: E402

FAST_MODEL = "bench-model"  # bench.gateway.create_rows's model
ADMISSION_WAIT_S = 60
#: Limits of the "on" key: far above anything one run reaches, so that none is ever hit.
HIGH_LIMIT = 1_000_000_000
GOAL_B_P95_RATIO = 1.5
GOAL_A_SHARE = 0.90
GOAL_CPU_DELTA_MS = 0.1
PHASES = ("fifo", "alone", "fair")  # in the order they run
PY_SPY_RATE_HZ = 250  # bench._gateway_load.Profiler's --rate


# --------------------------------------------------------------------------- processes
def start_slow_engine(port: int, cores: set[int], tmp: Path, args, api_key: str) -> Proc:
    """The fake engine of ``bench-slow`` on uvloop: tokens ``args.token_delay_ms`` apart, as
    many as a request's ``max_tokens`` up to 2 × ``args.tokens``; vLLM's metrics (running,
    waiting) on /metrics. It runs at most the benchmarked capacity C plus the gateway's
    headroom (``gateway.admission.HEADROOM_FRACTION``) at once, the rest waiting at the
    engine: like a real engine, whose hard limit (vLLM's ``max_num_seqs``) lies above the
    concurrency a benchmark finds within the SLO."""
    from gateway.admission import HEADROOM_FRACTION

    hard_limit = args.capacity + max(1, math.ceil(args.capacity * HEADROOM_FRACTION))
    proc = Proc([*taskset(cores), PYTHON, str(ROOT / "bench" / "_uvloop_engine.py"), "--port", str(port),
                 "--served-name", SLOW_MODEL, "--tokens", str(2 * args.tokens),
                 "--token-delay-ms", str(args.token_delay_ms),
                 "--capacity", str(hard_limit), "--metrics-kind", "vllm", "--api-key", api_key],
                tmp / "fake-engine-slow.log")
    wait_for_port(port, proc=proc.proc)
    return proc


def start_redis(port: int, cores: set[int], tmp: Path) -> Proc:
    """A private redis-server on ``port``: no persistence, its files in ``tmp``. Raises
    RuntimeError when redis-server is not installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server not found (apt-get install redis-server), needed for the Redis column")
    (tmp / "redis").mkdir(exist_ok=True)
    proc = Proc([*taskset(cores), binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(tmp / "redis")], tmp / "redis.log")
    wait_for_port(port, proc=proc.proc)
    return proc


def start_web(label: str, port: int, core: int, tmp: Path, env: dict[str, str]) -> Proc:
    """The gateway as ``llmgw up`` starts it (uvicorn, no access log), pinned to ``core``."""
    from llmgw.cli.web_processes import web_argv

    proc = Proc([*taskset({core}), *web_argv("127.0.0.1", port, access_log=False)], tmp / f"gateway-{label}.log",
                env={"DJANGO_SETTINGS_MODULE": "llmgw.settings", **env})
    wait_for_port(port, timeout_s=60, proc=proc.proc)
    return proc


def forget_web(proc: Proc) -> None:
    """Stop a gateway and delete its control-plane row: the next gateway would otherwise
    count it live for ``control_plane_stall_s`` and take half of each model's capacity."""
    from fleet.models import ControlPlane

    proc.stop()
    ControlPlane.objects.filter(role=ControlPlane.Role.WEB, pid=proc.pid).delete()


# --------------------------------------------------------------------------- rows
@dataclass
class Keys:
    """Clear API keys: team A's; team B's, one per phase (its usage records tell the phases
    apart); one without limits; one with every limit high."""

    a: str
    b: dict[str, str]
    off: str
    on: str
    b_ids: dict[str, int] = field(default_factory=dict)


def create_tenant_rows(agent_id: int, slow_port: int, slow_engine_key: str, capacity: int,
                       plain_key: str) -> Keys:
    """``bench-slow`` on the slow engine (a ready Replica on the bench's agent) with a
    Benchmark of ``capacity`` requests at once; teams A and B with a key each; a key with
    every limit set to :data:`HIGH_LIMIT`; the cluster's admission wait at
    :data:`ADMISSION_WAIT_S`. ``plain_key`` (``create_rows``'s, no limits) is the "off" key."""
    from django.utils import timezone

    from catalog.models import Benchmark, ClusterSettings, Model, Profile
    from fleet.models import Agent, Replica
    from gateway.models import ApiKey, Team

    profile = Profile.objects.get(name="bench-fake")
    model = Model(name=SLOW_MODEL, weights="file:/dev/null", profile=profile, min_replicas=1, max_replicas=1)
    model.full_clean()
    model.save()
    Replica.objects.create(model=model, profile=profile, agent=Agent.objects.get(pk=agent_id), state="ready",
                           port=slow_port, cpu_cores=1, memory_mib=64, ready_at=timezone.now(),
                           engine_key=slow_engine_key)
    Benchmark.objects.create(model=model, profile=profile, max_concurrency=capacity, slo_ttft_p95_ms=1000,
                             method="bench/tenants.py: the fake engine's --capacity")
    ClusterSettings.objects.filter(pk=ClusterSettings.get_solo().pk).update(admission_wait_s=ADMISSION_WAIT_S)
    team_a, team_b = Team.objects.create(name="team-a"), Team.objects.create(name="team-b")
    _, key_a = ApiKey.create_key("team-a-key", team=team_a)
    b_rows = {name: ApiKey.create_key(f"team-b-{name}", team=team_b) for name in PHASES}
    _, key_on = ApiKey.create_key("limited", requests_per_minute=HIGH_LIMIT, tokens_per_minute=HIGH_LIMIT,
                                  max_concurrent_requests=HIGH_LIMIT, tokens_per_day=HIGH_LIMIT)
    return Keys(a=key_a, b={name: clear for name, (_, clear) in b_rows.items()}, off=plain_key, on=key_on,
                b_ids={name: row.pk for name, (row, _) in b_rows.items()})


# --------------------------------------------------------------------------- part 2: CPU per request
@dataclass
class CpuArm:
    """The steps of one key ("off" or "on") in one mode, and what they add up to."""

    steps: list[Step] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)  # each step's seconds, warm-up and stragglers included
    redis_cpu_s: float | None = None  # redis-server's CPU over the arm's steps (Redis mode)

    @property
    def answered(self) -> int:
        return sum(s.answered for s in self.steps)

    @property
    def cpu_ms(self) -> float | None:
        """The gateway's CPU time per answered request (as bench/gateway.py counts it)."""
        if not self.steps or any(s.cpu_s is None for s in self.steps) or not self.answered:
            return None
        return sum(s.cpu_s for s in self.steps) * 1000 / self.answered

    def net_cpu_ms(self, idle_cpu_per_s: float | None) -> float | None:
        """:attr:`cpu_ms` less what the gateway spends idle (its watcher's refreshes, usage
        and heartbeat flushes) over the steps' seconds: that part does not depend on the
        requests, but per request it grows as req/s fall, which on a shared machine they
        do from one step to the next."""
        if self.cpu_ms is None or idle_cpu_per_s is None:
            return None
        return (sum(s.cpu_s for s in self.steps) - idle_cpu_per_s * sum(self.wall_s)) * 1000 / self.answered

    @property
    def rps(self) -> float:
        return sum(s.ok for s in self.steps) / sum(s.seconds for s in self.steps) if self.steps else 0.0

    @property
    def errors(self) -> int:
        return sum(s.errors + s.timeouts for s in self.steps)

    @property
    def redis_ms(self) -> float | None:
        return self.redis_cpu_s * 1000 / self.answered if self.redis_cpu_s is not None and self.answered else None


@dataclass
class CpuMode:
    """Part 2 in one mode (embedded or Redis)."""

    name: str
    idle_cpu_per_s: float | None = None  # the gateway's CPU seconds per second with no request
    off: CpuArm = field(default_factory=CpuArm)
    on: CpuArm = field(default_factory=CpuArm)
    profiles: list[str] = field(default_factory=list)

    @property
    def delta_ms(self) -> float | None:
        """On − off, net of idle (:meth:`CpuArm.net_cpu_ms`): the goal's figure."""
        on, off = self.on.net_cpu_ms(self.idle_cpu_per_s), self.off.net_cpu_ms(self.idle_cpu_per_s)
        return None if on is None or off is None else on - off

    @property
    def raw_delta_ms(self) -> float | None:
        if self.off.cpu_ms is None or self.on.cpu_ms is None:
            return None
        return self.on.cpu_ms - self.off.cpu_ms

    @property
    def noise_ms(self) -> float | None:
        """|off step 1 − off step 2|, net of idle: how much two identical steps differ here."""
        if len(self.off.steps) < 2 or self.idle_cpu_per_s is None:
            return None
        values = []
        for step, wall_s in zip(self.off.steps, self.off.wall_s):
            if step.cpu_s is None or not step.answered:
                return None
            values.append((step.cpu_s - self.idle_cpu_per_s * wall_s) * 1000 / step.answered)
        return abs(values[0] - values[1])


def measure_cpu(mode: CpuMode, gateway_url: str, gateway_pid: int, keys: Keys, args, redis_pid: int | None,
                profile_dir: Path | None, py_spy: str | None, load_cores: set[int]) -> None:
    """The gateway's idle CPU rate over ``args.idle_s``, then steps off, on, on, off at
    ``args.clients`` clients, non-streamed ``bench-model``, each ``args.step_s`` long after
    0.5 s of warm-up."""
    cpu0 = cpu_seconds(gateway_pid)
    time.sleep(args.idle_s)
    cpu1 = cpu_seconds(gateway_pid)
    if cpu0 is not None and cpu1 is not None:
        mode.idle_cpu_per_s = (cpu1 - cpu0) / args.idle_s
        say(f"[{mode.name}]   idle: {mode.idle_cpu_per_s * 1000:.0f} ms CPU per second")
    body = bodies(16)[False]
    url = gateway_url + "/v1/chat/completions"
    for i, which in enumerate(("off", "on", "on", "off")):
        target = Target(f"{mode.name}-{which}", url, keys.on if which == "on" else keys.off, gateway_pid)
        step = Step(args.clients, False, args.step_s)
        profiler = None
        if profile_dir and py_spy and i >= 2:  # the second on and off steps, one after the other
            out = profile_dir / f"{mode.name}-{which}-c{args.clients}.txt"
            profiler = Profiler(py_spy, gateway_pid, args.step_s, out, load_cores)
            mode.profiles.append(str(out))
        redis0 = cpu_seconds(redis_pid)
        started = time.monotonic()
        run_async(measure_rps(target, body, step, 0.0 if profiler else 0.5, args.timeout_s))
        wall_s = time.monotonic() - started
        redis1 = cpu_seconds(redis_pid)
        if profiler:
            profiler.finish()
        arm = mode.on if which == "on" else mode.off
        arm.steps.append(step)
        arm.wall_s.append(wall_s)
        if redis0 is not None and redis1 is not None:
            arm.redis_cpu_s = (arm.redis_cpu_s or 0.0) + redis1 - redis0
        extra = f", {step.errors} errors, {step.timeouts} timeouts" if step.errors or step.timeouts else ""
        cpu = f"{step.cpu_ms:.3f}" if step.cpu_ms is not None else "-"
        say(f"[{mode.name}]   limits {which:<3}: {step.rps:6.0f} req/s, {cpu} ms CPU/request{extra}"
            + (f"  first error: {step.first_error}" if step.first_error else ""))


def gateway_side(phases: dict[str, Phase], keys: Keys) -> None:
    """Fill each phase's ``gateway_ms`` from B's usage records (the gateways flush them as
    they stop): p50/p95 of the gateway's TTFT (the admission wait in it) and of its overhead
    (its own work before the upstream call, the wait left out)."""
    from gateway.models import UsageRecord

    for name, phase in phases.items():
        rows = list(UsageRecord.objects.filter(key_id=keys.b_ids[name], status=200).values_list(
            "ttft_ms", "overhead_ms"))
        ttft = [t for t, _ in rows if t is not None]
        overhead = [o for _, o in rows if o is not None]
        phase.gateway_ms = {"records": float(len(rows))}
        if ttft:
            phase.gateway_ms.update(ttft_p50=percentile(ttft, 50), ttft_p95=percentile(ttft, 95))
        if overhead:
            phase.gateway_ms.update(overhead_p50=percentile(overhead, 50), overhead_p95=percentile(overhead, 95))


def profile_ms(path: Path, answered: int) -> dict[str, float]:
    """py-spy's collapsed stacks (GIL holder, :data:`PY_SPY_RATE_HZ`) as ms per answered
    request: ``total``, each llmgw function inclusive, each leaf frame's package."""
    from bench._pyspy import frame_name, frame_package

    out: dict[str, float] = {}
    per_sample_ms = 1000 / PY_SPY_RATE_HZ / max(1, answered)
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        ms = int(count) * per_sample_ms
        out["total"] = out.get("total", 0.0) + ms
        leaf = f"leaf in {frame_package(frames[-1])}"
        out[leaf] = out.get(leaf, 0.0) + ms
        for name in {frame_name(f) for f in frames
                     if frame_package(f).startswith("llmgw") and "llmgw/asgi.py" not in f}:
            out[name] = out.get(name, 0.0) + ms
    return out


def profile_diff(mode: CpuMode, top: int = 14) -> str:
    """Where "on" spends more than "off" (py-spy of one step each; ms per answered request,
    GIL holder only, so sampling noise of a few hundredths of a ms)."""
    if len(mode.profiles) < 2 or not all(Path(p).exists() for p in mode.profiles):
        return ""
    on = profile_ms(Path(mode.profiles[0]), mode.on.steps[1].answered)
    off = profile_ms(Path(mode.profiles[1]), mode.off.steps[1].answered)
    names = sorted(set(on) | set(off), key=lambda n: -abs(on.get(n, 0.0) - off.get(n, 0.0)))
    lines = [f"  {mode.name}: py-spy, ms per answered request, limits on - off (the second on and off steps)",
             f"    {'on':>7} {'off':>7} {'delta':>7}  where"]
    for name in ["total"] + [n for n in names if n != "total"][:top]:
        lines.append(f"    {on.get(name, 0.0):7.3f} {off.get(name, 0.0):7.3f} "
                     f"{on.get(name, 0.0) - off.get(name, 0.0):+7.3f}  {name}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- report
def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    line = lambda row: "  ".join(  # noqa: E731
        str(c).ljust(widths[i]) if i == 0 else str(c).rjust(widths[i]) for i, c in enumerate(row))
    return [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]


def capacity_rps(args, alone: Phase) -> float:
    """The capacity's throughput: C / a request's seconds (B's mean alone; nominal tokens ×
    delay when B had no answer)."""
    seconds = alone.b_mean_total_s
    if math.isnan(seconds) or seconds <= 0:
        seconds = args.tokens * args.token_delay_ms / 1000
    return args.capacity / seconds


def slot_floor_ms(args, alone: Phase) -> tuple[float, float]:
    """(mean, p95) of a wait for the next free slot when all C are busy and one frees every
    ``gap`` = request seconds / C on average: the wait a fair queue cannot remove. With
    mixed lengths the slots free at random (near Poisson): the wait is exponential, mean
    ``gap``, p95 ln(20)·gap; with fixed lengths, evenly at best: uniform, mean gap/2, p95
    0.95·gap."""
    gap_ms = 1000 / capacity_rps(args, alone)
    if args.a_lengths == "mixed":
        return gap_ms, gap_ms * math.log(20)
    return gap_ms / 2, gap_ms * 0.95


def verdicts(phases: dict[str, Phase], modes: list[CpuMode], args) -> dict[str, dict]:
    """Each goal: the figures it compares and PASS/MISS."""
    alone, fair = phases["alone"], phases["fair"]
    out: dict[str, dict] = {}
    ratio = fair.b_ms(95) / alone.b_ms(95) if alone.b_ttft_s and fair.b_ttft_s else float("nan")
    out["b_p95_fair"] = {"fair_p95_ms": fair.b_ms(95), "alone_p95_ms": alone.b_ms(95), "ratio": ratio,
                         "goal": f"<= {GOAL_B_P95_RATIO}x", "pass": ratio <= GOAL_B_P95_RATIO}
    cap = capacity_rps(args, alone)
    rest = max(cap - fair.b_rate_per_s, 1e-9)
    out["a_uses_the_rest"] = {"a_rps": fair.a_rps, "capacity_rps": cap, "left_by_b_rps": rest,
                              "of_rest": fair.a_rps / rest, "of_capacity": fair.a_rps / cap,
                              "goal": f">= {GOAL_A_SHARE:.0%} of what B leaves",
                              "pass": fair.a_rps >= GOAL_A_SHARE * rest}
    lost = {name: merged(p.b_failed, p.a_failed) for name, p in phases.items()}
    out["nothing_lost"] = {"failed": lost, "pass": not any(lost.values())}
    for m in modes:
        d = m.delta_ms
        out[f"cpu_{m.name}"] = {"off_ms": m.off.cpu_ms, "on_ms": m.on.cpu_ms, "raw_delta_ms": m.raw_delta_ms,
                                "delta_ms": d, "noise_ms": m.noise_ms,
                                "goal": f"<= {GOAL_CPU_DELTA_MS} ms", "pass": d is not None and d <= GOAL_CPU_DELTA_MS}
    return out


def report(phases: dict[str, Phase], modes: list[CpuMode], args, goals: dict[str, dict], notes: list[str]) -> str:
    alone = phases["alone"]
    order = [p for p in (phases.get("alone"), phases.get("fifo"), phases.get("fair")) if p is not None]
    out = [f"1. fair admission: {SLOW_MODEL}, capacity {args.capacity} at once (engine --capacity and a Benchmark "
           f"row), {args.tokens} tokens {args.token_delay_ms:g} ms apart; B open loop at "
           f"{alone.b_rate_per_s:.1f} req/s ({args.b_share:.0%} of capacity), A {10 * args.capacity} clients "
           f"closed loop ({args.a_lengths} lengths), all streamed, {args.phase_s:g} s phases", ""]
    head = ["", *[p.name for p in order]]
    base = alone.b_ms(95)
    floor_mean, floor_p95 = slot_floor_ms(args, alone)

    def failed(p: Phase, c: dict[str, int]) -> str:
        return ", ".join(f"{k}: {n}" for k, n in sorted(c.items())) or "0"

    rows = [
        ["B TTFT p50 ms", *[fmt(p.b_ms(50)) for p in order]],
        ["B TTFT p95 ms", *[fmt(p.b_ms(95)) for p in order]],
        ["B TTFT p95 / alone", *[fmt(p.b_ms(95) / base if base else None, ".2f") + "x" for p in order]],
        ["B answered / sent", *[f"{len(p.b_ttft_s)}/{p.b_sent}" for p in order]],
        ["B non-200", *[failed(p, p.b_failed) for p in order]],
        ["B request s (mean)", *[fmt(p.b_mean_total_s, ".3f") for p in order]],
        ["B gateway TTFT p50/p95 ms", *[f"{fmt(p.gateway_ms.get('ttft_p50'))}/{fmt(p.gateway_ms.get('ttft_p95'))}"
                                        for p in order]],
        ["B gateway overhead p50/p95 ms", *[f"{fmt(p.gateway_ms.get('overhead_p50'))}/"
                                            f"{fmt(p.gateway_ms.get('overhead_p95'))}" for p in order]],
        ["A clients", *[str(p.a_clients) for p in order]],
        ["A req/s", *[fmt(p.a_rps) if p.a_clients else "-" for p in order]],
        ["A non-200", *[failed(p, p.a_failed) if p.a_clients else "-" for p in order]],
        ["engine max running", *[fmt(p.engine_running_max, "d") for p in order]],
        ["engine max waiting", *[fmt(p.engine_waiting_max, "d") for p in order]],
        ["gateway CPU ms/answer", *[fmt(p.cpu_ms, ".2f") for p in order]],
    ]
    out += table(head, rows)
    gap_ms = 1000 / capacity_rps(args, alone)
    out.append(f"capacity throughput {capacity_rps(args, alone):.1f} req/s (C / B's mean request seconds alone); "
               f"slot floor: with every slot busy one frees every {gap_ms:.1f} ms on average "
               f"({'at random' if args.a_lengths == 'mixed' else 'evenly at best'}): B's wait for the next is "
               f"{floor_mean:.1f} ms mean, {floor_p95:.1f} ms p95, however fair the order")
    out.append("")
    out.append(f"2. gateway CPU ms per answered request, {args.clients} clients, non-streamed {FAST_MODEL} "
               f"(16 tokens, no delay), steps off/on/on/off of {args.step_s:g} s")
    out.append("")
    head = ["", *[m.name for m in modes]]
    rows = [
        ["limits off", *[fmt(m.off.cpu_ms, ".3f") for m in modes]],
        ["limits on", *[fmt(m.on.cpu_ms, ".3f") for m in modes]],
        ["delta (on - off)", *[fmt(m.raw_delta_ms, "+.3f") for m in modes]],
        ["idle CPU ms per s", *[fmt(m.idle_cpu_per_s * 1000 if m.idle_cpu_per_s is not None else None, ".0f")
                                for m in modes]],
        ["limits off, net of idle", *[fmt(m.off.net_cpu_ms(m.idle_cpu_per_s), ".3f") for m in modes]],
        ["limits on, net of idle", *[fmt(m.on.net_cpu_ms(m.idle_cpu_per_s), ".3f") for m in modes]],
        ["delta net of idle", *[fmt(m.delta_ms, "+.3f") for m in modes]],
        ["noise (off - off, net)", *[fmt(m.noise_ms, ".3f") for m in modes]],
        ["req/s off / on", *[f"{m.off.rps:.0f} / {m.on.rps:.0f}" for m in modes]],
        ["errors off / on", *[f"{m.off.errors} / {m.on.errors}" for m in modes]],
        ["redis-server CPU ms/req on", *[fmt(m.on.redis_ms, ".3f") for m in modes]],
    ]
    out += table(head, rows)
    out.append("")
    v = lambda ok: "PASS" if ok else "MISS"  # noqa: E731
    g = goals["b_p95_fair"]
    out.append("goals:")
    out.append(f"  B's TTFT p95 with fair <= {GOAL_B_P95_RATIO}x alone: {fmt(g['fair_p95_ms'])} ms vs "
               f"{fmt(g['alone_p95_ms'])} ms = {fmt(g['ratio'], '.2f')}x {v(g['pass'])} "
               f"(fifo: {fmt(phases['fifo'].b_ms(95)) if 'fifo' in phases else '-'} ms)")
    g = goals["a_uses_the_rest"]
    out.append(f"  A's throughput with fair >= {GOAL_A_SHARE:.0%} of what B leaves: {g['a_rps']:.1f} req/s of "
               f"{g['left_by_b_rps']:.1f} = {g['of_rest']:.0%} {v(g['pass'])} ({g['of_capacity']:.0%} of the "
               f"capacity's {g['capacity_rps']:.1f} req/s)")
    g = goals["nothing_lost"]
    bad = {k: d for k, d in g["failed"].items() if d}
    out.append(f"  nothing lost (no non-200 in any phase): {bad or 'none'} {v(g['pass'])}")
    for m in modes:
        g = goals[f"cpu_{m.name}"]
        out.append(f"  {m.name}: limits on cost <= {GOAL_CPU_DELTA_MS} ms more CPU/request (net of idle): "
                   f"{fmt(g['delta_ms'], '+.3f')} ms (raw {fmt(g['raw_delta_ms'], '+.3f')}, noise "
                   f"{fmt(g['noise_ms'], '.3f')}) {v(g['pass'])}")
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


# --------------------------------------------------------------------------- main
def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="12 s phases, 5 s CPU steps (a 2-core machine: ~2 min)")
    p.add_argument("--phase-s", type=float, default=None, help="length of each part-1 phase (default 30; --quick 12)")
    p.add_argument("--warmup-s", type=float, default=None, help="A's load before a phase is measured (default 3; "
                                                                 "--quick 2)")
    p.add_argument("--step-s", type=float, default=None, help="length of each part-2 step (default 8; --quick 5)")
    p.add_argument("--idle-s", type=float, default=None, help="the gateway's idle CPU is read this long before "
                                                               "the steps (default 3; --quick 2)")
    p.add_argument("--capacity", type=int, default=16, help="C: the slow model's requests at once (A sends 10·C)")
    p.add_argument("--tokens", type=int, default=8, help="tokens per answer of the slow engine")
    p.add_argument("--token-delay-ms", type=float, default=50.0, help="between the slow engine's tokens")
    p.add_argument("--b-share", type=float, default=0.10, help="B's rate as a share of the capacity's throughput")
    p.add_argument("--a-lengths", choices=["mixed", "fixed"], default="mixed",
                   help="A's answers of tokens/2 to 3·tokens/2 tokens, drawn per request (default), or all of "
                        "--tokens (the slots then free in clumps: see ALoad)")
    p.add_argument("--clients", type=int, default=64, help="clients of the CPU steps")
    p.add_argument("--timeout-s", type=float, default=90.0, help="a request slower than this is a timeout")
    p.add_argument("--gateway-core", type=int, default=0, help="the core the gateway is pinned to")
    p.add_argument("--seed", type=int, default=16, help="seed of B's arrivals")
    p.add_argument("--redis", choices=["auto", "off"], default="auto", help="off: no Redis column")
    p.add_argument("--profile", type=Path, default=None, metavar="DIR",
                   help="py-spy the gateway into DIR in the fair phase and the first 'on' step of each mode")
    p.add_argument("--py-spy", default=None, help="path of py-spy (default: on PATH or next to python)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, database)")
    args = p.parse_args(argv)
    if args.phase_s is None:
        args.phase_s = 12.0 if args.quick else 30.0
    if args.warmup_s is None:
        args.warmup_s = 2.0 if args.quick else 3.0
    if args.step_s is None:
        args.step_s = 5.0 if args.quick else 8.0
    if args.idle_s is None:
        args.idle_s = 2.0 if args.quick else 3.0
    if args.capacity < 1 or args.tokens < 1 or args.token_delay_ms <= 0 or not 0 < args.b_share < 1:
        p.error("--capacity and --tokens must be >= 1, --token-delay-ms > 0, --b-share between 0 and 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    core = args.gateway_core
    load_cores, notes = split_cores(core)
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-bench-tenants-"))
    procs: list[Proc] = []
    heartbeat: Heartbeat | None = None
    phases: dict[str, Phase] = {}
    modes: list[CpuMode] = []
    profiles: list[str] = []
    py_spy = None
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        py_spy = find_py_spy(args.py_spy)
        if py_spy is None:
            notes.append("--profile: py-spy not found (pip install py-spy, or --py-spy PATH); not profiled")
    ok = False
    started = time.monotonic()

    def gateway(label: str, env: dict[str, str]) -> tuple[Proc, str]:
        port = free_port()
        say(f"[{label}] starting the gateway on core {core} ({' '.join(f'{k}={v}' for k, v in env.items())})")
        proc = start_web(label, port, core, tmp, env)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_routed(Target(label, url + "/v1/chat/completions", keys.off), bodies(16)[False])
        wait_routed(Target(label, url + "/v1/chat/completions", keys.a), stream_body(1))
        return proc, url

    def stop(proc: Proc) -> None:
        forget_web(proc)
        procs.remove(proc)

    try:
        os.sched_setaffinity(0, load_cores)  # the load generator (this process) off the gateway's core
        setup_django(tmp)
        fast_port, slow_port = free_port(), free_port()
        fast_key, slow_key = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        procs.append(start_engine(fast_port, load_cores, tmp, 16, fast_key))
        procs.append(start_slow_engine(slow_port, load_cores, tmp, args, slow_key))
        slow_url = f"http://127.0.0.1:{slow_port}"
        agent_id, plain_key = create_rows(fast_port, fast_key)
        keys = create_tenant_rows(agent_id, slow_port, slow_key, args.capacity, plain_key)
        heartbeat = Heartbeat(agent_id)
        heartbeat.start()
        say(f"cores: gateway {core}, load generator and engines {sorted(load_cores)}; temp dir {tmp}")
        notes.append(f"machine at start: {machine_load()}")
        body = stream_body(args.tokens)
        nominal_rps = args.capacity / (args.tokens * args.token_delay_ms / 1000)
        b_rate = args.b_share * nominal_rps
        a_clients = 10 * args.capacity

        # 1. FIFO first (its own process), then fair: B alone, B with A; part 2 embedded on that one.
        proc, url = gateway("fifo", {"LLMGW_ADMISSION_ORDER": "fifo"})
        phases["fifo"] = Phase("fifo", "B + A fifo", args.phase_s, a_clients, b_rate)
        say(f"[fifo] B at {b_rate:.1f} req/s with A's {a_clients} clients, {args.phase_s:g} s")
        run_async(run_phase(phases["fifo"], url, keys.a, keys.b["fifo"], slow_url, slow_key, body, args, proc.pid,
                            args.seed))
        say_phase(phases["fifo"])
        stop(proc)
        run_async(wait_idle(slow_url, slow_key))

        proc, url = gateway("fair", {"LLMGW_ADMISSION_ORDER": "fair"})
        phases["alone"] = Phase("alone", "B alone", args.phase_s, 0, b_rate)
        say(f"[alone] B at {b_rate:.1f} req/s alone, {args.phase_s:g} s")
        run_async(run_phase(phases["alone"], url, keys.a, keys.b["alone"], slow_url, slow_key, body, args, proc.pid,
                            args.seed))
        say_phase(phases["alone"])
        phases["fair"] = Phase("fair", "B + A fair", args.phase_s, a_clients, b_rate)
        say(f"[fair] B at {b_rate:.1f} req/s with A's {a_clients} clients, {args.phase_s:g} s")
        profiler = None
        if args.profile and py_spy:
            out = args.profile / "fair-phase.txt"
            profiler = Profiler(py_spy, proc.pid, args.phase_s + args.warmup_s + 2, out, load_cores)
            profiles.append(str(out))
        run_async(run_phase(phases["fair"], url, keys.a, keys.b["fair"], slow_url, slow_key, body, args, proc.pid,
                            args.seed))
        if profiler:
            profiler.finish()
        say_phase(phases["fair"])
        run_async(wait_idle(slow_url, slow_key))

        # 2. CPU per request: embedded (this gateway), then Redis.
        modes.append(CpuMode("embedded"))
        say(f"[embedded] CPU per request at {args.clients} clients, limits off/on/on/off, {args.step_s:g} s steps")
        measure_cpu(modes[-1], url, proc.pid, keys, args, None, args.profile, py_spy, load_cores)
        stop(proc)
        if args.redis == "auto":
            if shutil.which("redis-server") is None:
                notes.append("Redis column skipped: redis-server not found (apt-get install redis-server)")
            else:
                redis_port = free_port()
                redis = start_redis(redis_port, load_cores, tmp)
                procs.append(redis)
                proc, url = gateway("redis", {"LLMGW_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
                                              "LLMGW_REDIS_PREFIX": "bench-" + secrets.token_hex(4)})
                modes.append(CpuMode("redis"))
                say(f"[redis] CPU per request at {args.clients} clients, limits off/on/on/off, {args.step_s:g} s steps")
                measure_cpu(modes[-1], url, proc.pid, keys, args, redis.pid, args.profile, py_spy, load_cores)
                stop(proc)
        gateway_side(phases, keys)
        notes.append(f"machine at end: {machine_load()}")
        notes.append(f"run took {time.monotonic() - started:.0f} s")
        ok = True
    except KeyboardInterrupt:
        say("interrupted")
    finally:
        shield_cleanup()
        if heartbeat is not None:
            heartbeat.stop()
        for proc in reversed(procs):
            try:
                proc.stop()
            except Exception as exc:
                say(f"stopping {proc.log_path.name}: {exc}")
        finish_logs(tmp, ok, args.keep)
    if not ok:
        return 1
    goals = verdicts(phases, modes, args)
    if args.json:
        data = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "cores": {"gateway": core, "load": sorted(load_cores)}, "notes": notes,
                "phases": {name: {**asdict(p), "b_ttft_p50_ms": p.b_ms(50), "b_ttft_p95_ms": p.b_ms(95),
                                  "a_rps": p.a_rps, "cpu_ms": p.cpu_ms, "b_mean_total_s": p.b_mean_total_s}
                           for name, p in phases.items()},
                "capacity_rps": capacity_rps(args, phases["alone"]),
                "slot_floor_ms": dict(zip(("mean", "p95"), slot_floor_ms(args, phases["alone"]))),
                "cpu": {m.name: {"off_ms": m.off.cpu_ms, "on_ms": m.on.cpu_ms, "raw_delta_ms": m.raw_delta_ms,
                                 "idle_cpu_per_s": m.idle_cpu_per_s, "delta_ms": m.delta_ms,
                                 "off_net_ms": m.off.net_cpu_ms(m.idle_cpu_per_s),
                                 "on_net_ms": m.on.net_cpu_ms(m.idle_cpu_per_s),
                                 "noise_ms": m.noise_ms, "off_rps": m.off.rps, "on_rps": m.on.rps,
                                 "redis_on_ms": m.on.redis_ms,
                                 "steps": {"off": [asdict(s) | {"cpu_ms": s.cpu_ms} for s in m.off.steps],
                                           "on": [asdict(s) | {"cpu_ms": s.cpu_ms} for s in m.on.steps]}}
                        for m in modes},
                "goals": goals}
        print(json.dumps(data, indent=2, default=str))
    else:
        print(report(phases, modes, args, goals, notes))
    for path in profiles + [p for m in modes for p in m.profiles]:
        if Path(path).exists():
            say(f"\npy-spy {Path(path).name}:\n" + summarize_profile(Path(path)))
    for m in modes:
        diff = profile_diff(m)
        if diff:
            say("\n" + diff)
    return 0


if __name__ == "__main__":
    sys.exit(main())
