"""Measuring a model's capacity through the gateway (``llmgw bench``).

Ramp concurrency 1, 2, 4, … and the cap itself; at each step send streamed chat requests with realistic
prompts, measure TTFT (first content chunk) and TPOT (time per output token after the
first), and stop at the first step that misses the SLO. The highest step that met it,
divided by the ready replicas, is the measured max concurrency per replica that load
scaling uses (docs/architecture.md, R7: "measured capacity").
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx

PROMPTS = [
    "Summarise the plot of Hamlet in three sentences.",
    "Write a short, polite email asking a colleague to review a pull request.",
    "Explain what a hash table is to a new programmer.",
    "List five things to check before deploying a web service on a Friday.",
    "Translate 'the weather is lovely today' into French and Spanish.",
    "Give me a haiku about GPUs waiting for work.",
    "What are the trade-offs between SQLite and PostgreSQL for a small web app?",
    "Describe how a reconcile loop keeps a cluster in its desired state.",
]

#: The fewest answered requests a step's p95 is worth reading from: a p95 is the slowest one
#: request in twenty, so with fewer it is simply the slowest request, and one slow answer
#: decides the step. ``llmgw bench`` warns below it.
MIN_REQUESTS_FOR_P95 = 20


def concurrency_steps(max_concurrency: int) -> list[int]:
    """The ramp's steps: 1, 2, 4, … below ``max_concurrency``, then ``max_concurrency``
    itself, so the cap is always measured (6 gives 1, 2, 4, 6); [] below 1."""
    steps, concurrency = [], 1
    while concurrency < max_concurrency:
        steps.append(concurrency)
        concurrency *= 2
    if max_concurrency >= 1:
        steps.append(max_concurrency)
    return steps


def requests_for_step(concurrency: int, requests_per_step: int | None = None) -> int:
    """Requests sent at one step: ``requests_per_step``, else max(:data:`MIN_REQUESTS_FOR_P95`,
    3 × concurrency)."""
    return requests_per_step or max(MIN_REQUESTS_FOR_P95, 3 * concurrency)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[rank]


@dataclass
class StepResult:
    """One concurrency step. Times in milliseconds."""

    concurrency: int
    requests: int = 0
    errors: int = 0
    duration_s: float = 0.0
    ttft_ms: list[float] = field(default_factory=list, repr=False)
    tpot_ms: list[float] = field(default_factory=list, repr=False)

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0

    def summary(self) -> dict:
        return {
            "concurrency": self.concurrency, "requests": self.requests, "errors": self.errors,
            "requests_per_s": round(self.requests_per_s, 2),
            "ttft_p50_ms": _r(percentile(self.ttft_ms, 50)), "ttft_p95_ms": _r(percentile(self.ttft_ms, 95)),
            "tpot_p50_ms": _r(percentile(self.tpot_ms, 50)), "tpot_p95_ms": _r(percentile(self.tpot_ms, 95)),
        }

    def meets(self, slo_ttft_p95_ms: float, slo_tpot_p95_ms: float | None) -> bool:
        if self.errors or not self.ttft_ms:
            return False
        if percentile(self.ttft_ms, 95) > slo_ttft_p95_ms:
            return False
        if slo_tpot_p95_ms is not None and self.tpot_ms and percentile(self.tpot_ms, 95) > slo_tpot_p95_ms:
            return False
        return True


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


async def _one(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, step: StepResult) -> None:
    started = time.monotonic()
    first = last = None
    chunks = 0
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "messages": [{"role": "user", "content": prompt}]}
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                step.errors += 1
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                try:
                    data = json.loads(line[5:])
                except ValueError:
                    continue
                choices = data.get("choices") or []
                if choices and ((choices[0].get("delta") or {}).get("content") or choices[0].get("text")):
                    now = time.monotonic()
                    first = first or now
                    last = now
                    chunks += 1
    except httpx.HTTPError:
        step.errors += 1
        return
    if first is None:
        step.errors += 1
        return
    step.requests += 1
    step.ttft_ms.append((first - started) * 1000)
    if chunks > 1:
        step.tpot_ms.append((last - first) * 1000 / (chunks - 1))


async def run_step(base_url: str, api_key: str, model: str, concurrency: int, requests: int, max_tokens: int,
                   on_done=None) -> StepResult:
    """Send ``requests`` streamed requests, ``concurrency`` at a time."""
    step = StepResult(concurrency)
    queue = list(range(requests))
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"},
                                 timeout=httpx.Timeout(300, connect=10), limits=limits) as client:
        async def worker():
            while queue:
                i = queue.pop()
                await _one(client, model, PROMPTS[i % len(PROMPTS)], max_tokens, step)
                if on_done:
                    on_done()

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        step.duration_s = time.monotonic() - started
    return step


@dataclass
class RampResult:
    """The steps run, in order, and the highest concurrency that met the SLO (None: none
    did). ``max_concurrency``: the ramp's cap."""

    steps: list[StepResult]
    best_concurrency: int | None
    max_concurrency: int | None = None

    def as_json(self) -> list[dict]:
        return [s.summary() for s in self.steps]

    @property
    def capped(self) -> bool:
        """Every step met the SLO and the ramp stopped at its cap: the capacity may be higher
        than ``best_concurrency`` (a lower bound, not a measurement)."""
        return bool(self.steps) and self.best_concurrency == self.steps[-1].concurrency

    def warnings(self) -> list[str]:
        """Why the result may not be what it seems, in sentences for the operator: capped by
        the ramp's cap (the SLO was never crossed), or a step's p95 read from fewer than
        :data:`MIN_REQUESTS_FOR_P95` requests."""
        found = []
        if self.capped:
            found.append(f"every step met the SLO up to concurrency {self.best_concurrency}, the cap "
                         f"(--max-concurrency {self.max_concurrency}): the SLO was never crossed, so the capacity "
                         "may be higher and the figure is a lower bound (raise --max-concurrency to measure it)")
        few = [s for s in self.steps if s.requests + s.errors < MIN_REQUESTS_FOR_P95]
        if few:
            found.append("TTFT p95 measured from too few requests at concurrency "
                         + ", ".join(f"{s.concurrency} ({s.requests + s.errors} requests)" for s in few)
                         + f": a p95 needs at least {MIN_REQUESTS_FOR_P95} (raise --requests-per-step)")
        return found


async def ramp(base_url: str, api_key: str, model: str, slo_ttft_p95_ms: float, slo_tpot_p95_ms: float | None,
               max_concurrency: int = 64, requests_per_step: int | None = None, max_tokens: int = 32,
               progress=None) -> RampResult:
    """Concurrency 1, 2, 4, … then ``max_concurrency`` (:func:`concurrency_steps`); stops at the first step missing the
    SLO. ``progress(step_concurrency, done, total)`` is called as requests finish."""
    steps: list[StepResult] = []
    best = None
    for concurrency in concurrency_steps(max_concurrency):
        total = requests_for_step(concurrency, requests_per_step)
        done = [0]

        def tick(c=concurrency, t=total):
            done[0] += 1
            if progress:
                progress(c, done[0], t)

        step = await run_step(base_url, api_key, model, concurrency, total, max_tokens, tick)
        steps.append(step)
        if not step.meets(slo_ttft_p95_ms, slo_tpot_p95_ms):
            break
        best = concurrency
    return RampResult(steps, best, max_concurrency)
