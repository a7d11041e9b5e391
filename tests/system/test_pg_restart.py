"""Production mode losing its database: two web processes, a worker and an agent on a
PostgreSQL instance of this test's own (never the machine's shared server) and Redis. The
database goes away for longer than the agents' lost grace, under load, and comes back:
engines keep running, agents reconnect and report, routing resumes, nothing is placed
anew, and no request is answered with a 500."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import httpx
import psycopg
import pytest

from tests.multicluster import FAULT_ENV, MultiCluster, Traffic
from tests.pg import PrivatePostgres, postgres_bin, redis_available, require
from tests.processes import PYTHON, ROOT, wait_until

pytestmark = [pytest.mark.timeout(180)]

OUTAGE_S = 7.0  # longer than LLMGW_AGENT_LOST_AFTER (5 s in FAULT_ENV)

SETUP = """
from catalog.models import ClusterSettings, Model
from fleet.models import Agent
from tests.cluster import fake_profile
ClusterSettings.get_solo()
agent, token = Agent.create_with_token("a")
Model.objects.create(name="steady", weights="file:/dev/null", profile=fake_profile("p-steady"),
                     min_replicas=1, max_replicas=1)
print(token)
"""


@pytest.fixture(scope="module")
def production(tmp_path_factory):
    require(postgres_bin() is not None, "PostgreSQL restarts: initdb/pg_ctl are not installed here")
    require(redis_available(), "PostgreSQL restarts: Redis is not running on 127.0.0.1:6379")
    pg = PrivatePostgres().start()
    try:
        pg.createdb("llmgw")
        run_id = uuid.uuid4().hex[:8]
        data = tmp_path_factory.mktemp("pg-restart")
        env = {
            "DJANGO_SETTINGS_MODULE": "llmgw.settings",
            "LLMGW_DATABASE_URL": pg.url("llmgw"),
            "LLMGW_REDIS_URL": "redis://127.0.0.1:6379/15",
            "LLMGW_REDIS_PREFIX": f"llmgw_pgrestart_{run_id}",
            "LLMGW_DATA_DIR": str(data / "data"),
            "LLMGW_SECRET_KEY": f"pg-restart-{run_id}-" + "k" * 40,  # production mode: one shared secret
        }
        full_env = {**os.environ, **FAULT_ENV, **env}
        subprocess.run([PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=full_env,
                       check=True, timeout=120)
        token = subprocess.run([PYTHON, "manage.py", "shell", "-c", SETUP], cwd=ROOT, env=full_env, check=True,
                               capture_output=True, text=True, timeout=60).stdout.strip().splitlines()[-1]
        cluster = MultiCluster(data, {"a": token}, webs=2, workers=1, env=env)
        try:
            yield pg, cluster
        finally:
            cluster.stop()
    finally:
        pg.destroy()


def query(pg: PrivatePostgres, sql: str) -> list[tuple]:
    with psycopg.connect(pg.url("llmgw"), connect_timeout=2) as conn:
        return conn.execute(sql).fetchall()


def replicas(pg: PrivatePostgres) -> list[tuple]:
    return query(pg, "SELECT id, state, pid, reason FROM fleet_replica ORDER BY id")


def test_engines_keep_serving_and_nothing_is_placed_anew_when_postgresql_restarts(production):
    pg, cluster = production
    wait_until(lambda: [r for r in replicas(pg) if r[1] == "ready"], timeout_s=40, what="the replica to be ready")
    before = replicas(pg)
    assert len(before) == 1
    replica_id, _, pid, _ = before[0]
    with Traffic(cluster.url, "steady", threads=2) as traffic:
        time.sleep(1.0)
        pg.stop("fast")
        down_at = time.monotonic()
        time.sleep(OUTAGE_S)
        os.kill(pid, 0)  # the engine never noticed
        pg.start()
        up_at = time.monotonic()
        wait_until(lambda: query(pg, "SELECT count(*) FROM fleet_agent WHERE connected")[0][0] == 1,
                   timeout_s=30, what="the agent to be connected")
        time.sleep(OUTAGE_S)  # past the lost grace again, counted from the restart
    after = replicas(pg)
    assert [(r[0], r[1], r[2]) for r in after] == [(replica_id, "ready", pid)], (after, cluster.logs())
    assert "silent" not in after[0][3] and "came back" not in after[0][3]  # never lost, nothing re-placed
    os.kill(pid, 0)
    # No request answered with a 500: while the database was away a request got a 503 with
    # Retry-After (the gateway reads the model's row per request); the engine, its route and
    # the agent's websocket stayed, so answers came again as soon as the database was back.
    assert traffic.statuses() <= {200, 503}, traffic.summary()
    assert set(traffic.served_by()) == {f"{replica_id}@a"}
    during = [a for a in traffic.answers if down_at < a.at < up_at]
    assert during, traffic.summary()
    late = [a for a in traffic.answers if a.at > up_at + 3]
    assert late and all(a.status == 200 for a in late), traffic.summary()


def test_the_gateways_own_database_questions_reconnect_after_a_restart(production):
    """Under ``/v1/`` Django's request signals (which close an obsolete or broken connection)
    run at most once a second, so the connection of the thread where the async ORM runs can
    outlive its request: after a restart, the next question on it (``/v1/models``, a model or
    key not in memory) was answered 503. Each such question now checks it first."""
    pg, cluster = production
    wait_until(lambda: httpx.get(cluster.url + "/v1/models", timeout=10).status_code == 200, timeout_s=60,
               what="/v1/models to answer")
    for _ in range(8):  # in quick succession: some within a second of the signals' last run keep their connection
        assert httpx.get(cluster.url + "/v1/models", timeout=10).status_code == 200
    pg.stop("fast")
    pg.start()
    wait_until(lambda: query(pg, "SELECT 1") == [(1,)], timeout_s=30, what="PostgreSQL to be back")
    answers = [(path, httpx.get(cluster.url + path, timeout=10).status_code)
               for path in ("/v1/models", "/v1/models/steady") * 3]
    assert answers == [(path, 200) for path in ("/v1/models", "/v1/models/steady") * 3], cluster.logs()
