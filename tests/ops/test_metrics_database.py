"""``/metrics`` while the database is away (``llmgw.metrics.read_database``): the gateway's
own series are served all the same, the fleet's gauges are left out rather than stale, the
token series keep the names last read, ``llmgw_metrics_database_up`` says 0 — and the outage
is logged once when it begins and once when it ends, not per scrape."""

from __future__ import annotations

import logging

import pytest
from channels.testing import HttpCommunicator
from django.db import OperationalError
from prometheus_client.parser import text_string_to_metric_families

from fleet.models import Agent, Replica
from gateway import metrics
from gateway.metrics import TokenCounts
from gateway.models import ApiKey, Team
from llmgw.asgi import application
from tests.llmgw.test_health import broken_database

pytestmark = pytest.mark.django_db(transaction=True)


async def scrape() -> tuple[int, dict[tuple[str, tuple], float]]:
    """GET /metrics through the real ASGI app: its status and (sample name, sorted labels) → value."""
    communicator = HttpCommunicator(application, "GET", "/metrics", headers=[(b"host", b"127.0.0.1")])
    answer = await communicator.get_response(timeout=30)
    samples = {}
    if answer["status"] == 200:
        for family in text_string_to_metric_families(answer["body"].decode()):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return answer["status"], samples


def names(samples: dict) -> set[str]:
    return {name for name, _ in samples}


def replicas_of(samples: dict, model: str) -> float:
    """``outage-m``'s live replicas, whatever state its agent's silence shows them in."""
    return sum(v for (name, labels), v in samples.items() if name == "llmgw_model_replicas"
               and dict(labels)["model"] == model)


@pytest.fixture
def fleet_and_tokens(make_model):
    """A replica of model ``outage-m`` (fleet series), a request and tokens counted for
    a team's key (the gateway's series)."""
    m = make_model("outage-m")
    agent = Agent.objects.create(name="outage-a", connected=True, address="127.0.0.1", cpu_cores=4, memory_mib=4096)
    Replica.objects.create(model=m, model_name=m.name, profile=m.profile, agent=agent, state="ready", cpu_cores=1,
                           memory_mib=128)
    team = Team.objects.create(name="outage-team")
    key, _ = ApiKey.create_key("outage-key")
    ApiKey.objects.filter(pk=key.pk).update(team=team)
    metrics.REQUESTS.labels("outage-m", "200").inc()
    metrics.TOKENS.add("outage-m", team.pk, key.pk, 7, 3)


async def test_metrics_serve_the_gateways_series_while_the_database_is_down_and_say_so(
        fleet_and_tokens, monkeypatch, tmp_path, caplog):
    requests = ("llmgw_requests_total", (("model", "outage-m"), ("status", "200")))
    tokens = ("llmgw_tokens_total", (("kind", "prompt"), ("model", "outage-m"), ("team", "outage-team")))
    status, before = await scrape()
    assert status == 200
    assert before[("llmgw_metrics_database_up", ())] == 1
    assert replicas_of(before, "outage-m") == 1
    assert before[tokens] == 7
    with caplog.at_level(logging.INFO, logger="llmgw.metrics"):
        with monkeypatch.context() as broken:
            # (On PostgreSQL a kept connection is dropped as each request starts, as a database
            # that went away drops it: the scrape must reconnect.)
            broken_database(broken, tmp_path)
            away = [await scrape() for _ in range(3)]
        status, back = await scrape()
    for status, samples in away:
        assert status == 200
        assert samples[("llmgw_metrics_database_up", ())] == 0
        assert samples[requests] == before[requests]  # the gateway's own series, served
        assert samples[tokens] == 7  # named as last read
        assert not names(samples) & {"llmgw_replicas", "llmgw_model_replicas", "llmgw_agents_connected"}
    assert status == 200 and back[("llmgw_metrics_database_up", ())] == 1
    assert replicas_of(back, "outage-m") == 1
    told = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "llmgw.metrics"]
    assert [level for level, _ in told] == [logging.WARNING, logging.INFO], told  # once each, not per scrape
    assert told[0][1].startswith("/metrics: database unavailable (")
    assert str(tmp_path) not in told[0][1]
    assert told[1][1].startswith("/metrics: database back after ")


def test_token_series_named_by_no_read_yet_are_left_out_while_the_database_is_away(monkeypatch):
    team = Team.objects.create(name="known")
    known, _ = ApiKey.create_key("known-key")
    later, _ = ApiKey.create_key("later-key")
    counts = TokenCounts()
    counts.add("m", team.pk, known.pk, 5, 1)
    assert {f.name: len(f.samples) for f in counts.collect()} == {"llmgw_tokens": 2, "llmgw_key_tokens": 2}

    def database_away(*args, **kwargs):
        raise OperationalError("could not connect to server")

    monkeypatch.setattr("django.db.models.query.QuerySet.__iter__", database_away)
    named = {f.name: {tuple(s.labels.values()): s.value for s in f.samples} for f in counts.collect()}
    assert named["llmgw_tokens"] == {("m", "known", "prompt"): 5, ("m", "known", "completion"): 1}
    counts.add("m", None, later.pk, 2, 2)  # a key no read has named: its team is none, its name unknown
    assert list(counts.collect()) == []  # left out, not summed without it (a counter must never go down)
