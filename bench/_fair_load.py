"""Part 1 of bench/tenants.py, the load: team B's open-loop streamed requests timed to their
first content chunk, team A's closed-loop flood in a process of its own (:class:`ALoad`), the
slow engine's load sampled from its /metrics, one :class:`Phase` of figures per run."""

from __future__ import annotations

import asyncio
import json
import math
import random
import signal
import time
from dataclasses import dataclass, field

from bench._gateway_goals import Target
from bench._gateway_load import cpu_seconds, percentile, run_async, say, session

SLOW_MODEL = "bench-slow"


@dataclass
class Phase:
    """One phase of part 1: B's requests (TTFT and whole-request seconds of its 200s), A's
    answered requests inside the window, every non-200 by kind, the engine's most requests
    running and waiting, and the gateway's CPU over the window."""

    key: str  # "alone", "fifo" or "fair"
    name: str
    seconds: float
    a_clients: int
    b_rate_per_s: float
    b_sent: int = 0
    b_ttft_s: list[float] = field(default_factory=list)
    b_total_s: list[float] = field(default_factory=list)
    b_failed: dict[str, int] = field(default_factory=dict)  # kind of failure -> count
    a_ok: int = 0
    a_failed: dict[str, int] = field(default_factory=dict)
    engine_running_max: int | None = None
    engine_waiting_max: int | None = None
    gateway_cpu_s: float | None = None
    answered: int = 0  # A's and B's 200s while the gateway's CPU was read
    first_error: str = ""
    #: B's requests as the gateway recorded them (UsageRecord, ms): "ttft" from the view's
    #: start to the first chunk (the admission wait in it), "overhead" the gateway's own work
    #: before the upstream call (the admission wait left out).
    gateway_ms: dict[str, float] = field(default_factory=dict)

    def b_ms(self, q: float) -> float:
        """B's TTFT percentile ``q`` (0-100) in ms; NaN without an answer."""
        return percentile(self.b_ttft_s, q) * 1000 if self.b_ttft_s else float("nan")

    @property
    def a_rps(self) -> float:
        return self.a_ok / self.seconds if self.seconds else 0.0

    @property
    def b_mean_total_s(self) -> float:
        return sum(self.b_total_s) / len(self.b_total_s) if self.b_total_s else float("nan")

    @property
    def cpu_ms(self) -> float | None:
        """The gateway's CPU ms per answered request over the window (its idle work included)."""
        if self.gateway_cpu_s is None or not self.answered:
            return None
        return self.gateway_cpu_s * 1000 / self.answered


def bump(counts: dict[str, int], kind: str) -> None:
    counts[kind] = counts.get(kind, 0) + 1


def merged(*counts: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for kind, n in c.items():
            out[kind] = out.get(kind, 0) + n
    return out


def stream_body(tokens: int) -> bytes:
    return json.dumps({"model": SLOW_MODEL, "max_tokens": tokens, "stream": True,
                       "messages": [{"role": "user", "content": "Say something."}]}).encode()


def a_bodies(args) -> list[bytes]:
    """A's request bodies: ``max_tokens`` from tokens/2 to 3·tokens/2 (mean ``tokens``) for
    ``--a-lengths mixed``, else ``tokens`` alone."""
    if args.a_lengths == "fixed":
        return [stream_body(args.tokens)]
    return [stream_body(n) for n in range(max(1, args.tokens // 2), args.tokens * 3 // 2 + 1)]


async def _failure(r, phase: Phase) -> str:
    """A non-200's kind: ``HTTP 429 model_at_capacity`` (status and OpenAI error code)."""
    body = await r.read()
    try:
        code = json.loads(body)["error"].get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        code = None
    phase.first_error = phase.first_error or f"HTTP {r.status}: {body[:200]!r}"
    return f"HTTP {r.status}" + (f" {code}" if code else "")


def _content_of(line: bytes) -> str:
    """The text of an SSE ``data:`` line's first choice ('' for none, or not a chunk)."""
    if not line.startswith(b"data: {"):
        return ""
    try:
        choice = (json.loads(line[6:]).get("choices") or [{}])[0]
    except (ValueError, AttributeError, IndexError):
        return ""
    return (choice.get("delta") or {}).get("content") or choice.get("text") or ""


async def b_request(s, url: str, body: bytes, phase: Phase, clock) -> None:
    """One of B's streamed requests: its TTFT (to the first chunk with content) and its
    whole time when it ends in ``[DONE]``; else a failure of its kind."""
    import aiohttp

    phase.b_sent += 1
    t0 = clock()
    first = None
    try:
        async with s.post(url, data=body) as r:
            if r.status != 200:
                bump(phase.b_failed, await _failure(r, phase))
                return
            done = False
            async for line in r.content:
                if first is None and _content_of(line):
                    first = clock() - t0
                done = done or line.startswith(b"data: [DONE]")
    except TimeoutError:
        bump(phase.b_failed, "timeout")
        return
    except (aiohttp.ClientError, OSError) as exc:
        bump(phase.b_failed, type(exc).__name__)
        phase.first_error = phase.first_error or repr(exc)[:200]
        return
    if first is None or not done:
        bump(phase.b_failed, "broken stream")
        return
    phase.b_ttft_s.append(first)
    phase.b_total_s.append(clock() - t0)


async def a_client(s, url: str, choices: list[bytes], counts: Phase, window, rng: random.Random) -> None:
    """One of A's closed-loop clients, until cancelled, each request one of ``choices``
    (drawn with ``rng``): counts (``counts.a_ok``) answers ending in ``[DONE]`` inside
    ``window`` = [start, end] (``time.monotonic()``, the same clock in every process),
    failures always."""
    import aiohttp

    while True:
        try:
            async with s.post(url, data=rng.choice(choices)) as r:
                if r.status != 200:
                    bump(counts.a_failed, await _failure(r, counts))
                    await asyncio.sleep(0.05)
                    continue
                data = await r.read()
        except TimeoutError:
            bump(counts.a_failed, "timeout")
            continue
        except (aiohttp.ClientError, OSError) as exc:
            bump(counts.a_failed, type(exc).__name__)
            counts.first_error = counts.first_error or repr(exc)[:200]
            await asyncio.sleep(0.05)  # a refused connection would spin otherwise
            continue
        if b"[DONE]" not in data[-64:]:
            bump(counts.a_failed, "broken stream")
        elif window[0] <= time.monotonic() <= window[1]:
            counts.a_ok += 1


async def _a_load(url: str, key: str, clients: int, choices: list[bytes], timeout_s: float, window, stop,
                  stagger: tuple[int, float]) -> Phase:
    import aiohttp

    counts = Phase("a", "A", 0.0, clients, 0.0)
    first, apart_s = stagger
    async with session(aiohttp, Target("team-a", url, key), clients, timeout_s) as s:
        tasks = []
        for i in range(clients):
            rng = random.Random(i)
            tasks.append(asyncio.ensure_future(a_client(s, url, choices, counts, window, rng)))
            if i < first and apart_s:
                await asyncio.sleep(apart_s)
        while not stop.is_set():
            await asyncio.sleep(0.05)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return counts


def a_load_main(url: str, key: str, clients: int, choices: list[bytes], timeout_s: float, window, stop, results,
                stagger: tuple[int, float]) -> None:
    """The child process of :class:`ALoad`: A's clients until ``stop`` is set, then its
    counts (``a_ok``, ``a_failed``, ``first_error``) onto ``results``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it
    counts = run_async(_a_load(url, key, clients, choices, timeout_s, window, stop, stagger))
    results.put({"a_ok": counts.a_ok, "a_failed": counts.a_failed, "first_error": counts.first_error})


class ALoad:
    """Team A's closed-loop clients in a process of their own (spawned, on the load
    generator's cores): reading 10·C streams would otherwise delay the event loop on which
    B's TTFT is timed. Stopped by :meth:`finish`, killed if it does not stop.

    ``choices``: the bodies a request is drawn from. ``stagger`` = (n, seconds): the first n
    clients start that far apart, the rest at once. Requests of one length started together
    end together, and a closed loop keeps them in step (slots that once free together are
    refilled together, so a jittery engine only merges them into bigger clumps): every slot
    would free at the same moment once per request, and a request of B's would wait up to a
    whole request for one. Mixed lengths (``--a-lengths mixed``) and the stagger keep the
    slots freeing apart, as real traffic's do."""

    def __init__(self, url: str, key: str, clients: int, choices: list[bytes], timeout_s: float,
                 stagger: tuple[int, float] = (0, 0.0)) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.window = ctx.Array("d", [math.inf, math.inf], lock=False)
        self.stop = ctx.Event()
        self.results = ctx.Queue()
        self.proc = ctx.Process(target=a_load_main, name="bench-team-a", daemon=True,
                                args=(url, key, clients, choices, timeout_s, self.window, self.stop, self.results,
                                      stagger))
        self.proc.start()

    def set_window(self, start: float, end: float) -> None:
        """Count A's answers that end between ``start`` and ``end`` (``time.monotonic()``)."""
        self.window[0], self.window[1] = start, end

    def finish(self, timeout_s: float = 30.0) -> dict | None:
        """Stop the clients; their counts (None when the process gave none)."""
        import queue

        self.stop.set()
        try:
            result = self.results.get(timeout=timeout_s)
        except queue.Empty:
            result = None
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        return result


async def engine_load(s, metrics_url: str) -> tuple[int, int] | None:
    """(running, waiting) from the slow engine's vLLM-style /metrics; None when unread."""
    try:
        async with s.get(metrics_url) as r:
            text = await r.text()
    except Exception:  # a sample missed is a sample missed
        return None
    values = {}
    for line in text.splitlines():
        for name in ("num_requests_running", "num_requests_waiting"):
            if line.startswith(f"vllm:{name}"):
                values[name] = int(float(line.rsplit(" ", 1)[1]))
    if len(values) < 2:
        return None
    return values["num_requests_running"], values["num_requests_waiting"]


async def run_phase(phase: Phase, gateway_url: str, a_key: str, b_key: str, engine_url: str, engine_key: str,
                    body: bytes, args, gateway_pid: int, seed: int) -> None:
    """Run one phase: A's ``phase.a_clients`` closed-loop clients (:class:`ALoad`, warmed
    up until the engine runs C requests, at most 30 s, then ``args.warmup_s``), then B's
    open-loop arrivals for ``phase.seconds`` while the engine's load is sampled; then A is
    hung up and B's last requests are awaited. ``args``: bench/tenants.py's (capacity,
    tokens, token_delay_ms, a_lengths, warmup_s, timeout_s)."""
    import aiohttp

    url = gateway_url + "/v1/chat/completions"
    rng = random.Random(seed)
    samples: list[tuple[int, int]] = []
    metrics = aiohttp.ClientSession(headers={"Authorization": f"Bearer {engine_key}"},
                                    timeout=aiohttp.ClientTimeout(total=5))
    b_session = session(aiohttp, Target("team-b", url, b_key), 1000, args.timeout_s)
    b_tasks: list[asyncio.Task] = []
    a_load = None
    clock = time.monotonic
    try:
        if phase.a_clients:
            stagger = (args.capacity, args.tokens * args.token_delay_ms / 1000 / args.capacity)
            a_load = ALoad(url, a_key, phase.a_clients, a_bodies(args), args.timeout_s, stagger)
            deadline = clock() + 30
            while clock() < deadline:
                load = await engine_load(metrics, engine_url + "/metrics")
                if load and load[0] >= args.capacity:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(args.warmup_s)  # the queue behind the slots fills, the closed loop settles
        cpu0 = cpu_seconds(gateway_pid)
        start = clock()
        end = start + phase.seconds
        if a_load:
            a_load.set_window(start, end)
        next_at, next_sample = start, start
        while True:
            now = clock()
            if now >= end:
                break
            if now >= next_sample:
                load = await engine_load(metrics, engine_url + "/metrics")
                if load:
                    samples.append(load)
                next_sample = now + 0.2
            if now >= next_at:
                b_tasks.append(asyncio.ensure_future(b_request(b_session, url, body, phase, time.perf_counter)))
                next_at += rng.expovariate(phase.b_rate_per_s)
            await asyncio.sleep(max(0.0, min(next_at, next_sample, end) - clock()))
        cpu1 = cpu_seconds(gateway_pid)
        if cpu0 is not None and cpu1 is not None:
            phase.gateway_cpu_s = cpu1 - cpu0
        b_answered = len(phase.b_ttft_s)
        if a_load:
            counts, a_load = a_load.finish(), None
            if counts is None:
                bump(phase.a_failed, "A's load process gave no counts")
            else:
                phase.a_ok = counts["a_ok"]
                phase.a_failed = counts["a_failed"]
                phase.first_error = phase.first_error or counts["first_error"]
        phase.answered = phase.a_ok + b_answered
        if b_tasks:
            await asyncio.wait(b_tasks, timeout=args.timeout_s + 5)
    finally:
        if a_load:
            a_load.finish(timeout_s=5)
        for t in b_tasks:
            t.cancel()
        await asyncio.gather(*b_tasks, return_exceptions=True)
        for s in (b_session, metrics):
            await s.close()
    if samples:
        phase.engine_running_max = max(r for r, _ in samples)
        phase.engine_waiting_max = max(w for _, w in samples)


async def wait_idle(engine_url: str, engine_key: str, timeout_s: float = 60.0) -> None:
    """Until the slow engine runs nothing (the hung-up requests have left), at most
    ``timeout_s``."""
    import aiohttp

    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {engine_key}"},
                                     timeout=aiohttp.ClientTimeout(total=5)) as s:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            load = await engine_load(s, engine_url + "/metrics")
            if load == (0, 0):
                return
            await asyncio.sleep(0.2)
    say(f"the slow engine was still busy after {timeout_s:g} s")


def say_phase(p: Phase) -> None:
    failed = merged(p.b_failed, p.a_failed)
    extra = f", failed {dict(failed)}" if failed else ""
    cpu = f", gateway {p.cpu_ms:.2f} ms CPU/answer" if p.cpu_ms is not None else ""
    say(f"[{p.name}]   B TTFT p50 {p.b_ms(50):.1f} ms p95 {p.b_ms(95):.1f} ms ({len(p.b_ttft_s)}/{p.b_sent}); "
        f"A {p.a_rps:.1f} req/s; engine running ≤ {p.engine_running_max} waiting ≤ {p.engine_waiting_max}"
        f"{cpu}{extra}" + (f"  first error: {p.first_error}" if p.first_error else ""))
