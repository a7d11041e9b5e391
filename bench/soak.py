"""Long randomized soaks (tests/soak.py; docs/architecture.md, "Testing": the soak).

    python bench/soak.py --minutes N [--seed S] [--run-minutes 5] [--production]
                         [--database-url postgres://…] [--redis-url redis://…] [--keep]

Runs soaks of ``--run-minutes`` of operations each (seeds S, S+1, …) until ``--minutes`` of
operations have run, each on a fresh catalog: by default one web process and one worker on a
SQLite file in a temp dir; with ``--production`` two web processes and two workers on
PostgreSQL + Redis (``--database-url``, default postgres://root@127.0.0.1:5432/llmgw_soak,
created if absent and emptied first; ``--redis-url``, default redis://127.0.0.1:6379/14, with
a key prefix and task queue of this run's own, and one LLMGW_SECRET_KEY). Prints, per run and in all: operations
applied, invariant checks, requests, violations (the goal: 0) and the convergence time
(p50/max). A run with violations prints its report (seed, violations, operation log). Exit 0
when every run had no violation and converged. Logs are in a temp dir, kept with --keep or
on failure. Every process is stopped at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._cleanup import finish_logs, shield_cleanup  # noqa: E402

#: Databases and Redis numbers CI uses: never touched here.
CI_DATABASES = {"llmgw_ci"}
CI_REDIS_DBS = {"15"}


def configure(tmp: Path, args: argparse.Namespace) -> None:
    """The environment of this process and of every process the soak starts, before Django."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "llmgw.settings"
    os.environ["LLMGW_DATA_DIR"] = str(tmp / "data")
    os.environ.pop("LLMGW_DATABASE_URL", None)
    os.environ.pop("LLMGW_REDIS_URL", None)
    if not args.production:
        os.environ["LLMGW_SQLITE_PATH"] = str(tmp / "soak.sqlite3")
        return
    database = urlsplit(args.database_url).path.lstrip("/")
    redis_db = urlsplit(args.redis_url).path.lstrip("/") or "0"
    if database in CI_DATABASES or redis_db in CI_REDIS_DBS:
        raise SystemExit(f"bench/soak.py: {database!r} / Redis db {redis_db} are CI's; choose others")
    create_database(args.database_url)
    os.environ["LLMGW_DATABASE_URL"] = args.database_url
    os.environ["LLMGW_REDIS_URL"] = args.redis_url
    # Its own prefix (the task queue's name follows it) and one secret for every process.
    os.environ["LLMGW_REDIS_PREFIX"] = f"llmgw_soak_{os.getpid()}"
    os.environ.setdefault("LLMGW_SECRET_KEY", secrets.token_urlsafe(50))


def create_database(url: str) -> None:
    """CREATE DATABASE for ``url`` on its server unless it exists."""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, required=True, help="minutes of operations in all")
    parser.add_argument("--seed", type=int, default=1, help="the first run's seed (then +1 per run)")
    parser.add_argument("--run-minutes", type=float, default=5.0, help="minutes of operations per run")
    parser.add_argument("--production", action="store_true", help="2 web + 2 workers on PostgreSQL + Redis")
    parser.add_argument("--database-url", default="postgres://root@127.0.0.1:5432/llmgw_soak")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--port-base", type=int, default=23100,
                        help="first engine port (300 in all); another soak at once (CI's) needs another base")
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="llmgw-soak-"))
    configure(tmp, args)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from tests.soak import Soak, SoakConfig

    call_command("migrate", interactive=False, verbosity=0)
    ok, results = True, []
    left_s, seed = args.minutes * 60, args.seed
    try:
        while left_s > 0:
            duration = min(left_s, args.run_minutes * 60)
            call_command("flush", interactive=False, verbosity=0)
            config = SoakConfig(seed=seed, duration_s=duration, webs=2 if args.production else 1,
                                workers=2 if args.production else 1, port_base=args.port_base)
            started = time.monotonic()
            result = Soak(config, Path(tempfile.mkdtemp(prefix=f"run-{seed}-", dir=tmp))).run()
            connection.close()
            results.append(result)
            good = not result.violations and result.converge_s is not None
            ok = ok and good
            print(f"seed {seed}: {len(result.operations)} operations, {result.checks} checks, {result.requests} requests, "
                  f"{len(result.violations)} violations, converged "
                  + (f"in {result.converge_s:.1f} s" if result.converge_s is not None else "NOT")
                  + f" ({time.monotonic() - started:.0f} s)", flush=True)
            if not good:
                print(result.report(), flush=True)
            left_s -= duration
            seed += 1
    except KeyboardInterrupt:
        ok = False
    finally:
        shield_cleanup()
    converged = [r.converge_s for r in results if r.converge_s is not None]
    print(f"in all: {len(results)} runs, {sum(len(r.operations) for r in results)} operations applied, "
          f"{sum(r.checks for r in results)} invariant checks, {sum(r.requests for r in results)} requests, "
          f"{sum(len(r.violations) for r in results)} violations (goal 0), convergence "
          + (f"p50 {statistics.median(converged):.1f} s, max {max(converged):.1f} s" if converged else "never")
          + f", {len(results) - len(converged)} runs not converged")
    finish_logs(tmp, ok, args.keep)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
