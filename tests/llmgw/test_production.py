"""Production mode: ``LLMGW_DATABASE_URL`` and ``LLMGW_REDIS_URL`` switch on PostgreSQL, the
Redis channel layer and django-q2's Redis broker; ``LLMGW_REDIS_PREFIX`` alone keeps
clusters sharing a Redis apart (the task queue's name follows it); production mode refuses
to start without a shared ``LLMGW_SECRET_KEY``; with Redis the reconciler nudges an
agent's websocket at once; a request that cannot reach the database is a 503, not a 500.
(The whole suite also runs in production mode: the second pass of .ci/run.)"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import OperationalError

from tests.processes import PYTHON, ROOT

HI = [{"role": "user", "content": "x"}]  # the smallest valid chat

SHOW_SETTINGS = """
import json, django
django.setup()
from django.conf import settings as s

db = s.DATABASES["default"]
print(json.dumps({"engine": db["ENGINE"], "name": db["NAME"], "health_checks": db.get("CONN_HEALTH_CHECKS"),
                  "layer": s.CHANNEL_LAYERS["default"]["BACKEND"], "layer_config": s.CHANNEL_LAYERS["default"].get("CONFIG"),
                  "broker": "redis" if "redis" in s.Q_CLUSTER else "orm", "redis": s.Q_CLUSTER.get("redis"),
                  "queue": s.Q_CLUSTER["name"], "cache_prefix": s.CACHES["default"].get("KEY_PREFIX")}))
"""


def project_env(**env: str) -> dict[str, str]:
    """This environment without the run's service URLs or secret, plus ``env``."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("LLMGW_DATABASE_URL", "LLMGW_REDIS_URL", "LLMGW_SECRET_KEY")}
    full.update(DJANGO_SETTINGS_MODULE="llmgw.settings", **env)
    return full


def project_settings(**env: str) -> dict:
    done = subprocess.run([PYTHON, "-c", SHOW_SETTINGS], cwd=ROOT, env=project_env(**env), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def manage(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "manage.py", *argv], cwd=ROOT, env=project_env(**env), capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_embedded_default_needs_no_services():
    s = project_settings()
    assert s["engine"].endswith("sqlite3") and s["broker"] == "orm"
    assert s["layer"] == "channels.layers.InMemoryChannelLayer"


def test_database_and_redis_urls_switch_on_production_mode():
    s = project_settings(LLMGW_DATABASE_URL="postgres://llmgw@db.example:5432/llmgw",
                         LLMGW_REDIS_URL="redis://cache.example:6379/2", LLMGW_REDIS_PREFIX="fleet1")
    assert s["engine"] == "django.db.backends.postgresql" and s["name"] == "llmgw"
    assert s["health_checks"] is True  # a restarted PostgreSQL leaves no process with a dead connection
    assert s["layer"] == "llmgw.channel_layer.RedisChannelLayer"
    assert s["layer_config"] == {"hosts": ["redis://cache.example:6379/2"], "prefix": "fleet1"}
    assert s["broker"] == "redis" and s["redis"] == "redis://cache.example:6379/2"


def test_clusters_sharing_one_redis_need_only_a_prefix_each():
    redis = {"LLMGW_DATABASE_URL": "postgres://llmgw@db.example:5432/llmgw", "LLMGW_REDIS_URL": "redis://r:6379/0"}
    one = project_settings(**redis, LLMGW_REDIS_PREFIX="fleet1")
    two = project_settings(**redis, LLMGW_REDIS_PREFIX="fleet2")
    assert (one["queue"], one["layer_config"]["prefix"], one["cache_prefix"]) == ("fleet1", "fleet1", "fleet1:cache")
    assert (two["queue"], two["layer_config"]["prefix"], two["cache_prefix"]) == ("fleet2", "fleet2", "fleet2:cache")


def test_production_mode_refuses_to_start_without_a_shared_secret_key(tmp_path):
    production = {"LLMGW_DATABASE_URL": "postgres://llmgw@db.example:5432/llmgw", "LLMGW_DATA_DIR": str(tmp_path)}
    refused = manage("llmgw", "worker", **production)
    assert refused.returncode != 0 and "llmgw.E004" in refused.stderr, refused.stdout + refused.stderr
    assert "LLMGW_SECRET_KEY" in refused.stderr and "secrets.token_urlsafe" in refused.stderr  # the hint
    assert manage("check", **production, LLMGW_SECRET_KEY="s" * 50).returncode == 0
    # Embedded mode keeps its generated key.
    embedded = manage("check", LLMGW_DATA_DIR=str(tmp_path / "embedded"), LLMGW_SQLITE_PATH="")
    assert embedded.returncode == 0, embedded.stderr
    assert (tmp_path / "embedded" / "secret_key").exists()


@pytest.mark.django_db
def test_a_request_that_cannot_reach_the_database_is_a_503_to_retry(client, monkeypatch):
    from catalog.models import Model

    async def database_away(cls, name):
        raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")

    monkeypatch.setattr(Model, "aresolve", classmethod(database_away))
    monkeypatch.setattr(settings, "LLMGW_GATEWAY_AUTH", False, raising=False)
    r = client.post("/v1/chat/completions", {"model": "m", "messages": HI}, content_type="application/json")
    assert r.status_code == 503 and r["Retry-After"] == "2"
    assert r.json()["error"]["code"] == "database_unavailable"


@pytest.mark.skipif(not settings.REDIS_URL, reason="runs in production mode (LLMGW_REDIS_URL; the second pass of .ci/run)")
@pytest.mark.django_db(transaction=True)
async def test_with_redis_the_reconciler_nudges_the_agent_at_once(make_model, watcher_cleanup, monkeypatch):
    from channels.testing import WebsocketCommunicator

    from fleet import protocol
    from fleet.live.watch import watcher
    from fleet.models import Agent
    from fleet.control.reconciler import reconcile
    from llmgw.asgi import application

    _, token = await sync_to_async(Agent.create_with_token)("cpu-1")
    ws = WebsocketCommunicator(application, "/ws/agent/", headers=[(b"authorization", f"Bearer {token}".encode())])
    connected, _ = await ws.connect()
    assert connected
    await ws.send_json_to({"type": "hello", "v": protocol.PROTOCOL_VERSION, "name": "cpu-1", "version": "t",
                           "address": "127.0.0.1", "inventory": {"gpus": [], "cpu_cores": 4, "memory_mib": 8192},
                           "replicas": []})
    assert (await ws.receive_json_from(timeout=5))["replicas"] == []

    async def no_watcher_pushes():
        return None

    monkeypatch.setattr(watcher, "_push_agents", no_watcher_pushes)  # only the nudge can deliver now
    await sync_to_async(make_model)("nudged", min_replicas=1)
    await sync_to_async(reconcile)()
    assign = await ws.receive_json_from(timeout=5)
    while not assign["replicas"]:  # sets sent before the model existed
        assign = await ws.receive_json_from(timeout=5)
    assert [r["served_name"] for r in assign["replicas"]] == ["nudged"]
    await ws.disconnect()


def test_the_redis_layer_polls_for_less_than_redis_py_waits_for_an_answer():
    from redis._defaults import DEFAULT_SOCKET_TIMEOUT

    from llmgw.channel_layer import RedisChannelLayer

    assert RedisChannelLayer.brpop_timeout < DEFAULT_SOCKET_TIMEOUT


def test_a_leader_lease_shorter_than_two_renewals_is_refused(tmp_path):
    done = manage("check", LLMGW_DATA_DIR=str(tmp_path), LLMGW_SQLITE_PATH="", LLMGW_LEADER_LEASE="1s",
                  LLMGW_LEADER_RENEW="1s")
    assert done.returncode != 0 and "llmgw.E005" in done.stderr, done.stdout + done.stderr
