"""Warm before demand where operators meet it (issue 18): the model's admin page (the
measured cold start, what is kept warm now), the cluster settings' switches, ``llmgw
explain`` in words and ``--json`` (cold start per agent where it differs, the next window
and when it is placed, the hours a model is usually asked for, the ramp), and the REST
API's explain."""
from __future__ import annotations

import json
from datetime import UTC, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from catalog.models import ClusterSettings, ScheduleWindow
from fleet.models import Agent, ModelState, Replica
from fleet.planning.warmth import ArrivalProfile, learn
from tests.cli import llmgw

pytestmark = pytest.mark.django_db


def starts(model, agent_name: str, seconds: list[float]) -> None:
    agent = Agent.objects.get_or_create(name=agent_name, defaults={"address": "127.0.0.1"})[0]
    for s in seconds:
        Replica.objects.create(model=model, profile=model.profile, agent=agent, state="stopped", cold_start_s=s)


def weekday_mornings(weeks: int = 5) -> ArrivalProfile:
    """Asked for at 09:xx on every weekday for ``weeks`` weeks, up to now."""
    now = timezone.now()
    monday = (now - timedelta(days=now.weekday() + 7 * (weeks - 1))).replace(hour=9, minute=10, second=0, microsecond=0)
    asked = [monday + timedelta(days=7 * w + d) for w in range(weeks) for d in range(5)]
    return learn(ArrivalProfile(), [a for a in asked if a < now], now.astimezone(UTC), ZoneInfo("UTC"))


def test_the_admin_shows_the_measured_cold_start_and_what_is_kept_warm(admin_client, make_model):
    m = make_model("chat")
    page = admin_client.get(f"/admin/catalog/model/{m.pk}/change/").content.decode()
    assert ">Warm before demand</h2>" in page and "not measured yet" in page
    ModelState.objects.create(model=m, cold_start_s=151.2, cold_start_samples=7,
                              warm_ahead="kept warm: usually asked for on weekdays 09–10; warm until 10:15")
    page = admin_client.get(f"/admin/catalog/model/{m.pk}/change/").content.decode()
    assert "about 151 s (the 90th percentile of its last 7 starts)" in page
    assert "kept warm: usually asked for on weekdays 09–10; warm until 10:15" in page


def test_the_cluster_settings_switch_each_rule_and_set_the_default_cold_start(admin_client):
    ClusterSettings.get_solo()
    page = admin_client.get("/admin/catalog/clustersettings/1/change/").content.decode()
    for field in ("prewarm_windows", "predictive_warmth", "ramp_scaling", "default_cold_start_s"):
        assert f'name="{field}"' in page
    cluster = ClusterSettings.get_solo()
    assert (cluster.prewarm_windows, cluster.predictive_warmth, cluster.ramp_scaling,
            cluster.default_cold_start_s) == (True, True, True, 120)


def test_explain_says_the_cold_start_per_agent_where_it_differs_and_the_next_windows_placement(make_model):
    m = make_model("big", min_replicas=1, max_replicas=3)
    starts(m, "gpu-1", [100, 110, 120, 105, 115, 108, 112, 118, 101, 109])
    starts(m, "gpu-2", [30, 32, 31])  # its weights were cached: its own figure is shown
    soon = (timezone.now() + timedelta(hours=1)).replace(second=0, microsecond=0)
    ScheduleWindow.objects.create(model=m, weekdays="daily", start=soon.time(),
                                  end=(soon + timedelta(hours=2)).time(), min_replicas=2)
    code, out, _ = llmgw("explain", "big")
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("  cold start:"))
    assert "(p90 of 13 starts)" in line and "differs on gpu-2: about 32 s (p90 of 3 starts)" in line
    assert "gpu-1:" not in line
    assert "  next window: daily" not in out  # described by its days
    window_line = next(x for x in out.splitlines() if x.startswith("  next window:"))
    assert "placed from" in window_line and "s ahead)" in window_line
    assert "  ramp:        on: a replica takes about" in out
    info = json.loads(llmgw("explain", "big", "--json")[1])["warmth"]
    assert info["cold_start"]["samples"] == 13 and [a["agent"] for a in info["cold_start"]["by_agent"]] == ["gpu-2"]
    placed = timezone.datetime.fromisoformat(info["prewarm"]["placed_from"])
    started = timezone.datetime.fromisoformat(info["prewarm"]["starts_at"])
    assert (started - placed).total_seconds() == pytest.approx(info["cold_start"]["lead_s"], abs=0.1)
    assert info["prediction"]["applies"] is False and info["ramp"]["applies"] is True
    assert "  predicted:   only for on-demand models (this one runs its min)\n" in out


def test_explain_says_when_an_on_demand_model_is_usually_asked_for_and_that_rules_are_off(make_model):
    m = make_model("od", on_demand=True, min_replicas=0)
    code, out, _ = llmgw("explain", "od")
    assert "  usually:     no habit yet (0 weeks observed" in out
    assert "  pre-warm:    no schedule window to place ahead of\n" in out
    assert "  ramp:        on: a replica takes about 120 s (not measured yet: the default)" in out
    ModelState.objects.create(model=m, arrivals=weekday_mornings().as_json())
    code, out, _ = llmgw("explain", "od")
    assert "  usually:     weekdays 09–10\n" in out
    cluster = ClusterSettings.get_solo()
    cluster.predictive_warmth = cluster.ramp_scaling = False
    cluster.save()
    code, out, _ = llmgw("explain", "od")
    assert "  predicted:   off for this cluster\n" in out and "  ramp:        off for this cluster\n" in out


def test_the_rest_api_explains_warmth_and_its_schema_names_it(make_model, admin_client):
    m = make_model("big", min_replicas=1, max_replicas=3)
    starts(m, "gpu-1", [30, 40])
    body = admin_client.get("/api/explain/big/").json()
    assert body["warmth"]["cold_start"]["samples"] == 2 and body["warmth"]["ramp"]["applies"] is False
    schema = admin_client.get("/api/schema/?format=json").json()
    assert "ExplainWarmth" in schema["components"]["schemas"]
