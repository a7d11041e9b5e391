"""bench/gateway.py's measuring: CPU time from /proc, the load generator (one request at a
time, N clients in steps, a held-then-served request), wrk beside it, py-spy, and the records
a run fills (in ``bench._gateway_goals``). Shared with
bench/_fair_load.py and bench/prefix_routing.py."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from bench._gateway_goals import GOAL_STALL_MS, LATENCY_MIN_REQUESTS, MODEL, Result, Stalls, Step, Target, Wrk


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




def taskset(cores: set[int]) -> list[str]:
    return ["taskset", "-c", ",".join(str(c) for c in sorted(cores))] if shutil.which("taskset") else []


# --------------------------------------------------------------------------- load
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


