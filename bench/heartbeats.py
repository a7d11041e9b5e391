"""Heartbeat benchmark: many agents on one web process.

    python bench/heartbeats.py [--agents 1000] [--heartbeat-s 5] [--measure-s 60] [--samples 100]
                               [--database-url postgres://…] [--redis-url redis://…] [--keep]

Starts one web process (daphne, production periods: watcher every 0.2 s) on a fresh
database — a SQLite file in a temp dir, or a new database on the PostgreSQL server of
``--database-url`` (dropped at the end) — and, in a second process, ``--agents`` simulated
agents: each opens the agents' websocket with its own token, says hello, then sends a
heartbeat every ``--heartbeat-s`` (start times spread over the period) and records when an
``assign`` brings a replica it did not have. Measured:

  CPU          the web process's CPU time (user + system, all its threads) over
               ``--measure-s`` of steady heart-beating, as a share of one core;
  assignment   time from an assignment committed to the database (a Replica row and the
               agent's generation moved, as the reconciler writes them; with Redis, then the
               nudge it sends) to the agent receiving it: median and p99 over ``--samples``.

Goals: CPU <= 25% of a core; assignment p99 <= 1 s. Prints PASS/MISS. Logs and the
database are in a temp dir, kept with --keep or on failure. Every process is stopped at the
end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._cleanup import finish_logs, shield_cleanup  # noqa: E402
from tests.processes import PYTHON, Proc, free_port, wait_for_port, wait_until

CPU_GOAL = 0.25
P99_GOAL_S = 1.0
TICKS = os.sysconf("SC_CLK_TCK")


# --- the simulated agents (a process of their own) -----------------------------------------

async def simulate(url: str, tokens: list[str], heartbeat_s: float, concurrency: int) -> None:
    """Run one simulated agent per token until stdin closes; report on stdout: "connected N",
    "ready", "assign REPLICA_ID UNIX_TIME"."""
    from websockets.asyncio.client import connect

    gate = asyncio.Semaphore(concurrency)  # a bounded connect rate, as after a control-plane restart
    connected = 0
    out = sys.stdout

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    async def heartbeats(ws, offset: float) -> None:
        await asyncio.sleep(offset)
        message = json.dumps({"type": "heartbeat", "v": 1})
        while True:
            await ws.send(message)
            await asyncio.sleep(heartbeat_s)

    async def agent(i: int, token: str) -> None:
        nonlocal connected
        hello = {"type": "hello", "v": 1, "name": f"sim-{i}", "version": "bench", "address": "127.0.0.1",
                 "inventory": {"gpus": [], "cpu_cores": 8, "memory_mib": 32768}, "replicas": []}
        async with gate:
            ws = await connect(url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=120,
                               ping_interval=20, ping_timeout=20, max_size=16 * 1024 * 1024)
            await ws.send(json.dumps(hello))
            first = json.loads(await ws.recv())  # the full desired set answers the hello
        known = {r["replica_id"] for r in first.get("replicas", [])}
        connected += 1
        if connected % 100 == 0 or connected == len(tokens):
            say(f"connected {connected}")
        if connected == len(tokens):
            say("ready")
        beat = asyncio.create_task(heartbeats(ws, random.random() * heartbeat_s))
        try:
            async for raw in ws:
                now = time.time()
                message = json.loads(raw)
                if message.get("type") != "assign":
                    continue
                ids = {r["replica_id"] for r in message["replicas"]}
                for rid in ids - known:
                    say(f"assign {rid} {now:.6f}")
                known = ids
        finally:
            beat.cancel()

    tasks = [asyncio.create_task(agent(i, t)) for i, t in enumerate(tokens)]
    stop = asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # parent closes stdin: stop
    done, _ = await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        if task in done and task.exception():
            say(f"error {task.exception()!r}")
    for task in tasks:
        task.cancel()


# --- the bench ---------------------------------------------------------------------------

def setup(tmp: Path, args) -> dict[str, str]:
    """Environment for this process and the web process; a fresh database, migrated."""
    env = {
        "DJANGO_SETTINGS_MODULE": "llmgw.settings",
        "LLMGW_DATA_DIR": str(tmp / "data"),
        "LLMGW_SQLITE_PATH": str(tmp / "bench.sqlite3"),
        "LLMGW_LOG_LEVEL": "WARNING",
        "LLMGW_GATEWAY_AUTH": "false",
        "LLMGW_DATABASE_URL": "",
        "LLMGW_REDIS_URL": args.redis_url or "",
        "LLMGW_REDIS_PREFIX": f"llmgw_bench_{uuid.uuid4().hex[:8]}",
        "PYTHONUNBUFFERED": "1",
    }
    if args.database_url:
        import psycopg

        name = f"llmgw_bench_{uuid.uuid4().hex[:8]}"
        server = urlsplit(args.database_url)
        with psycopg.connect(urlunsplit(server._replace(path="/postgres")), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        env["LLMGW_DATABASE_URL"] = urlunsplit(server._replace(path="/" + name))
        env["LLMGW_SECRET_KEY"] = f"{name}-" + "k" * 40  # production mode needs one shared secret
        args.created_database = name
    os.environ.update(env)
    subprocess.run([PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, check=True)
    import django

    django.setup()
    return env


def drop_database(args) -> None:
    name = getattr(args, "created_database", None)
    if not name:
        return
    import psycopg
    from django.db import connections

    connections.close_all()
    server = urlsplit(args.database_url)
    with psycopg.connect(urlunsplit(server._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def create_fleet(n: int) -> tuple[list[int], list[str], object]:
    """``n`` agents (ids, tokens) and a model whose replicas the bench assigns."""
    from catalog.models import ClusterSettings, Model, Profile
    from fleet.models import Agent
    from llmgw.tokens import new_token

    ClusterSettings.get_solo()
    tokens = [new_token("agent") for _ in range(n)]
    agents = []
    for i, token in enumerate(tokens):
        agent = Agent(name=f"sim-{i}")
        agent.set_token(token)
        agents.append(agent)
    Agent.objects.bulk_create(agents, batch_size=500)
    ids = list(Agent.objects.order_by("id").values_list("id", flat=True))
    profile = Profile.objects.create(name="bench", engine=Profile.Engine.CUSTOM, command="true", gpus_needed=0,
                                     cpu_cores=0, memory_mib=0, readiness_path="/", startup_timeout_s=30)
    model = Model.objects.create(name="bench-model", weights="file:/dev/null", profile=profile, min_replicas=0,
                                 max_replicas=1)
    return ids, tokens, model


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def measure_cpu(pid: int, seconds: float) -> float:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def assign_once(model, agent_id: int, receipts: dict, nudge: bool, timeout_s: float = 10.0) -> float | None:
    """Assign a new replica of ``model`` to ``agent_id`` as the reconciler does; seconds
    until the agent had it (None: not within ``timeout_s``)."""
    from django.db import transaction

    from fleet.models import Agent, Replica
    from fleet.groups import nudge_agents

    with transaction.atomic():
        replica = Replica.objects.create(model=model, profile=model.profile, agent_id=agent_id, state="placing",
                                         reason="bench")
        Agent.bump_generation([agent_id])
    t0 = time.time()
    if nudge:
        nudge_agents([agent_id])
    deadline = time.monotonic() + timeout_s
    while replica.pk not in receipts and time.monotonic() < deadline:
        time.sleep(0.002)
    Replica.objects.filter(pk=replica.pk).update(state="stopped")  # out of its set at the next push
    got = receipts.get(replica.pk)
    return None if got is None else got - t0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--heartbeat-s", type=float, default=5.0)
    parser.add_argument("--measure-s", type=float, default=60.0)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--database-url", default="", help="a PostgreSQL server (a database is created on it)")
    parser.add_argument("--redis-url", default="", help="Redis: channel layer (nudges) and broker")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, database)")
    parser.add_argument("--simulate", help=argparse.SUPPRESS)  # internal: the agents' process
    parser.add_argument("--concurrency", type=int, default=50, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.simulate:
        tokens = json.loads(Path(args.simulate).read_text())
        asyncio.run(simulate(os.environ["BENCH_WS_URL"], tokens, args.heartbeat_s, args.concurrency))
        return 0

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-bench-hb-"))
    procs: list[Proc] = []
    sim: subprocess.Popen | None = None
    ok = False
    try:
        env = setup(tmp, args)
        ids, tokens, model = create_fleet(args.agents)
        (tmp / "tokens.json").write_text(json.dumps(tokens))
        port = free_port()
        web = Proc([PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "llmgw.asgi:application"],
                   tmp / "web.log", env=env)
        procs.append(web)
        wait_for_port(port, proc=web.proc)
        mode = ("PostgreSQL" if args.database_url else "SQLite") + (" + Redis" if args.redis_url else "")
        print(f"{args.agents} agents -> one web process (pid {web.pid}, {mode}); logs in {tmp}", flush=True)

        receipts: dict[int, float] = {}
        sim_log = open(tmp / "agents.log", "w")  # noqa: SIM115 (the simulator's stderr, for its life)
        started = time.monotonic()
        sim = subprocess.Popen([PYTHON, __file__, "--simulate", str(tmp / "tokens.json"), "--heartbeat-s",
                                str(args.heartbeat_s), "--concurrency", str(args.concurrency)],
                               cwd=ROOT, env={**os.environ, "BENCH_WS_URL": f"ws://127.0.0.1:{port}/ws/agent/"},
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sim_log, text=True)
        ready = threading.Event()

        def read_simulator() -> None:
            for line in sim.stdout:
                if line.startswith("assign "):
                    _, rid, at = line.split()
                    receipts[int(rid)] = float(at)
                    continue
                print(f"  agents: {line.strip()}", flush=True)
                if line.strip() == "ready":
                    ready.set()

        threading.Thread(target=read_simulator, daemon=True).start()
        wait_until(lambda: ready.is_set() or sim.poll() is not None, timeout_s=600, interval_s=0.2,
                   what="the agents to connect")
        if not ready.is_set():
            raise RuntimeError("the simulated agents stopped: see agents.log")
        print(f"all connected after {time.monotonic() - started:.1f} s; settling for 10 s", flush=True)
        time.sleep(10)
        from fleet.models import Agent

        connected = Agent.objects.filter(connected=True).count()
        print(f"measuring the web process's CPU over {args.measure_s:.0f} s of heartbeats "
              f"({args.agents / args.heartbeat_s:.0f} messages/s)…", flush=True)
        cpu = measure_cpu(web.pid, args.measure_s)
        print(f"sending {args.samples} assignments to random agents…", flush=True)
        c0, t0 = cpu_seconds(web.pid), time.monotonic()
        latencies, missed = [], 0
        for _ in range(args.samples):
            took = assign_once(model, random.choice(ids), receipts, nudge=bool(args.redis_url))
            if took is None:
                missed += 1
            else:
                latencies.append(took)
            time.sleep(random.uniform(0.1, 0.4))  # not in step with the watcher's period
        cpu_assigning = (cpu_seconds(web.pid) - c0) / (time.monotonic() - t0)
        if not latencies:
            raise RuntimeError("no assignment reached its agent")
        median, p99 = statistics.median(latencies), percentile(latencies, 0.99)
        verdict = lambda good: "PASS" if good else "MISS"
        print(f"\n{args.agents} agents ({connected} connected), heartbeat every {args.heartbeat_s:g} s, {mode}:")
        print(f"  web process CPU, heartbeats only:   {cpu:6.1%} of a core   goal <= {CPU_GOAL:.0%}    "
              f"{verdict(cpu <= CPU_GOAL)}")
        print(f"  web process CPU, while assigning:   {cpu_assigning:6.1%} of a core")
        print(f"  assignment -> agent, median:        {median * 1000:6.0f} ms")
        print(f"  assignment -> agent, p99:           {p99 * 1000:6.0f} ms        goal <= {P99_GOAL_S * 1000:.0f} ms  "
              f"{verdict(p99 <= P99_GOAL_S and not missed)}")
        if missed:
            print(f"  {missed} of {args.samples} assignments never arrived (within 10 s)")
        ok = True
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
    finally:
        shield_cleanup()
        if sim is not None and sim.poll() is None:
            sim.stdin.close()
            try:
                sim.wait(10)
            except subprocess.TimeoutExpired:
                sim.kill()
        for proc in procs:
            proc.stop()
        try:
            drop_database(args)
        except Exception as exc:  # noqa: BLE001 (cleanup goes on)
            print(f"could not drop the bench database: {exc}", file=sys.stderr)
        finish_logs(tmp, ok, args.keep)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
