"""Cold-start benchmark: how fast does a request for a cold on-demand model get an answer?

    python bench/cold_start.py [--runs 5] [--engine-load-s 2.0] [--keep]

Starts a real local cluster (daphne, ``manage.py llmgw worker``, ``manage.py llmgw agent``, each
a subprocess, as tests/cluster.py does) on a fresh SQLite file in a temp dir. Each run creates
a new on-demand model (min 0, max 1) whose engine is tests/fake_engine.py with
``--startup-delay-s S`` (its known load time), sends one streaming chat request through the
gateway with httpx and measures, on the wall clock (time.time()):

  spawn        engine process started - request sent. The profile command runs a tiny wrapper
               that appends time.time() to a file, then execs the fake engine.
  first token  (first SSE chunk with content - request sent) - S

Also shown, to locate a slow step: placed (the reconciler created the replica row) and ready
(the agent reported the engine ready), both relative to the request. Goals: spawn <= 0.5 s;
first token <= S + 1 s. Prints per-run rows, medians, PASS/MISS. Logs (web, worker, agent,
engines) are in a temp dir, printed and kept on failure, kept with --keep. Every process
is stopped at the end, also on error or Ctrl-C (or SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._cleanup import finish_logs, shield_cleanup  # noqa: E402
from tests.cluster import FAKE_ENGINE, FAST_ENV  # noqa: E402
from tests.processes import PYTHON, Proc, free_port, wait_for_port, wait_until  # noqa: E402

SPAWN_GOAL_S = 0.5
FIRST_TOKEN_SLACK_S = 1.0

WRAPPER = """import os, sys, time
with open(sys.argv[1], "a") as f:
    f.write(f"{time.time():.6f} {os.getpid()}\\n")
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def setup_env(tmp: Path) -> None:
    """The bench's own database and data dir, for this process (Django in-process) and, by
    inheritance, every subprocess. Must run before django.setup()."""
    os.environ.update(FAST_ENV)
    os.environ["LLMGW_DATA_DIR"] = str(tmp / "data")
    os.environ["LLMGW_SQLITE_PATH"] = str(tmp / "bench.sqlite3")
    os.environ["PYTHONUNBUFFERED"] = "1"
    subprocess.run([PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, check=True)
    import django

    django.setup()


def start_cluster(tmp: Path, procs: list[Proc]) -> str:
    """daphne, a worker and an agent (appended to ``procs`` as they start); returns the URL."""
    from catalog.models import ClusterSettings
    from fleet.models import Agent

    ClusterSettings.get_solo()
    agent_row, token = Agent.create_with_token("bench")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    procs.append(Proc([PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "llmgw.asgi:application"],
                      tmp / "web.log"))
    wait_for_port(port, proc=procs[-1].proc)
    procs.append(Proc([PYTHON, "manage.py", "llmgw", "worker"], tmp / "worker.log"))
    procs.append(Proc([PYTHON, "manage.py", "llmgw", "agent", "--server", url, "--token", token, "--name", "bench",
                       "--state-dir", str(tmp / "agent"), "--heartbeat-s", "0.5", "--stop-grace-s", "3",
                       "--port-range", "23000-23999", "--stop-engines-on-exit"], tmp / "agent.log"))
    wait_until(lambda: Agent.objects.filter(pk=agent_row.pk, connected=True).exclude(address="").exists(),
               timeout_s=30, what="the agent to connect")
    return url


def create_model(name: str, wrapper: Path, spawn_file: Path, load_s: float):
    from catalog.models import Model, Profile

    command = (f"{{python}} {wrapper} {spawn_file} {FAKE_ENGINE} --host {{host}} --port {{port}}"
               " --served-name {served_name} --api-key {api_key} "
               f"--startup-delay-s {load_s}")
    profile = Profile(name=f"p-{name}", engine=Profile.Engine.CUSTOM, command=command, gpus_needed=0,
                      gpu_memory_mib=0, cpu_cores=0.1, memory_mib=64, readiness_path="/v1/models",
                      startup_timeout_s=int(load_s) + 30)
    profile.full_clean()
    profile.save()
    model = Model(name=name, weights="file:/dev/null", profile=profile, min_replicas=0, max_replicas=1,
                  on_demand=True)
    model.full_clean()
    model.save()
    return model


def timed_request(url: str, name: str) -> tuple[float, float]:
    """Stream one chat request; time.time() when it is sent (the client is built before: its
    SSL context takes tens of ms) and of the first SSE data chunk with content."""
    import httpx

    body = {"model": name, "stream": True, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with httpx.Client(base_url=url, timeout=120) as client:
        t0 = time.time()
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{name}: HTTP {r.status_code}: {r.read().decode(errors='replace')[:500]}")
            lines = r.iter_lines()
            for line in lines:
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                choices = json.loads(line[5:]).get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    t_first = time.time()
                    for _ in lines:  # drain the rest of the answer
                        pass
                    return t0, t_first
    raise RuntimeError(f"{name}: the stream ended without content")


def one_run(i: int, url: str, tmp: Path, wrapper: Path, load_s: float) -> dict:
    from fleet.models import Replica

    name = f"cold-{i}"
    spawn_file = tmp / f"spawn-{name}.txt"
    model = create_model(name, wrapper, spawn_file, load_s)
    time.sleep(1.0)  # let the gateway's view and the reconciler settle: the model is cold, not new
    t0, t_first = timed_request(url, name)
    stamp, pid = spawn_file.read_text().split()[:2]
    replica = Replica.objects.filter(model=model).order_by("id").first()
    rel = lambda dt: dt.timestamp() - t0 if dt else float("nan")  # noqa: E731
    return {"run": i, "pid": int(pid), "spawn": float(stamp) - t0,
            "placed": rel(replica.created_at if replica else None),
            "ready": rel(replica.ready_at if replica else None),
            "total": t_first - t0, "first_token": t_first - t0 - load_s}


def report(rows: list[dict], load_s: float) -> None:
    cols = ["run", "placed", "spawn", "ready", "total", "first_token"]
    print("\n" + "  ".join(f"{c:>11}" for c in cols))
    for row in rows:
        print("  ".join(f"{row[c]:>11}" if c == "run" else f"{row[c]:>10.3f}s" for c in cols))
    spawn = statistics.median(r["spawn"] for r in rows)
    first = statistics.median(r["first_token"] for r in rows)
    verdict = lambda ok: "PASS" if ok else "MISS"  # noqa: E731
    print(f"\nmedians over {len(rows)} runs (engine load time S = {load_s:g} s):")
    print(f"  request -> engine spawned:        {spawn:7.3f} s   goal <= {SPAWN_GOAL_S} s      "
          f"{verdict(spawn <= SPAWN_GOAL_S)}")
    print(f"  request -> first token, minus S:  {first:7.3f} s   goal <= {FIRST_TOKEN_SLACK_S} s      "
          f"{verdict(first <= FIRST_TOKEN_SLACK_S)}")


def stop_all(procs: list[Proc], tmp: Path) -> None:
    for proc in reversed(procs):  # agent first (it stops its engines), then worker, then web
        try:
            proc.stop()
        except Exception as exc:  # keep stopping the others
            print(f"stopping {proc.log_path.name}: {exc}", file=sys.stderr)
    for spawn_file in tmp.glob("spawn-*.txt"):  # any engine the agent left behind
        for line in spawn_file.read_text().splitlines():
            try:
                os.killpg(int(line.split()[1]), signal.SIGKILL)
            except (IndexError, ValueError, ProcessLookupError, PermissionError):
                pass


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--engine-load-s", type=float, default=2.0)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, database)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-bench-"))
    wrapper = tmp / "spawn_stamp.py"
    wrapper.write_text(WRAPPER)
    procs: list[Proc] = []
    rows: list[dict] = []
    ok = False
    try:
        setup_env(tmp)
        url = start_cluster(tmp, procs)
        print(f"cluster at {url}; logs in {tmp}")
        for i in range(1, args.runs + 1):
            rows.append(one_run(i, url, tmp, wrapper, args.engine_load_s))
            r = rows[-1]
            print(f"run {i}: spawn {r['spawn']:.3f} s, first token {r['total']:.3f} s "
                  f"({r['first_token']:+.3f} s beyond load)", flush=True)
        report(rows, args.engine_load_s)
        ok = True
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
    finally:
        shield_cleanup()
        stop_all(procs, tmp)
        finish_logs(tmp, ok, args.keep)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
