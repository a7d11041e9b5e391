"""Pre-warm on a real cluster (issue 18; docs/architecture.md, R11): web, worker and agent
as processes, fake engines that take a few seconds to start. The model's first replica
measures its cold start; a schedule window opening half a minute later has its second
replica placed that cold start plus the margin ahead, ready when the window opens — not
a cold start after — and explained while it waits; the window's end takes it back."""

from __future__ import annotations

import time
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from catalog.models import ClusterSettings, Model, ScheduleWindow
from fleet.models import ModelState, Replica
from fleet.planning import warmth
from tests.cluster import fake_profile, live_cluster_fixture
from tests.processes import wait_until

pytestmark = [pytest.mark.timeout(240)]

# Every pass reads the measured cold starts at once (the worker's cache is a second).
live = live_cluster_fixture("prewarm", extra_env={"LLMGW_COLD_STARTS_CACHE": "1s"})


def waited(predicate, timeout_s: float, what: str, live):
    """``wait_until``, with the cluster's logs in the failure."""
    try:
        return wait_until(predicate, timeout_s=timeout_s, what=what)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{live.logs()}") from None


def test_a_windows_replica_is_placed_ahead_by_the_measured_cold_start_and_ready_when_it_opens(live):
    profile = fake_profile("p-prewarm", "--startup-delay-s", "4")
    m = Model(name="prewarm", weights="file:/dev/null", profile=profile, min_replicas=1, max_replicas=2)
    m.full_clean()
    m.save()
    waited(lambda: Replica.objects.filter(model=m, state="ready").count() == 1, timeout_s=60,
               what="the first replica to be ready", live=live)
    first = Replica.objects.get(model=m, state="ready")
    assert first.cold_start_s is not None and first.cold_start_s >= 4.0  # the engine's delay, measured
    waited(lambda: ModelState.objects.get(model=m).cold_start_samples == 1, timeout_s=10,
               what="a pass to read the measured cold start", live=live)
    measured = ModelState.objects.get(model=m).cold_start_s
    lead = warmth.lead_s(warmth.ColdStart(measured, 1))

    tz = ZoneInfo(ClusterSettings.get_solo().time_zone)
    opens = (timezone.now() + timedelta(seconds=lead + 12)).replace(microsecond=0)
    closes = opens + timedelta(seconds=15)
    ScheduleWindow.objects.create(model=m, weekdays="daily", start=opens.astimezone(tz).time(),
                                  end=closes.astimezone(tz).time(), min_replicas=2)
    created = timezone.now()

    explained = []

    def second_ready() -> bool:
        state = ModelState.objects.get(model=m)
        if state.warm_ahead:
            explained.append(state.warm_ahead)
        return Replica.objects.filter(model=m, state="ready").count() == 2

    waited(second_ready, timeout_s=lead + 40, what="the window's replica to be ready", live=live)
    second = Replica.objects.filter(model=m).exclude(pk=first.pk).get()
    placed_ahead = (opens - second.created_at).total_seconds()
    assert second.ready_at <= opens, f"ready {(second.ready_at - opens).total_seconds():.1f} s after the window opened"
    # Placed by the lead (a pass every 0.5 s), not at once when the window was made.
    assert (second.created_at - created).total_seconds() >= 5
    assert lead - 5 <= placed_ahead <= lead + 2, f"placed {placed_ahead:.1f} s ahead, the lead is {lead:.1f} s"
    assert any(text.startswith("pre-warm: window ") and "p90 of 1 start" in text for text in explained), explained

    # From the window's start the window itself holds the floor; at its end the floor drops.
    waited(lambda: timezone.now() > opens + timedelta(seconds=1), timeout_s=30, what="the window to open", live=live)
    assert ModelState.objects.get(model=m).warm_ahead == ""
    time.sleep(max(0.0, (closes - timezone.now()).total_seconds()))
    waited(lambda: Replica.objects.filter(model=m, state__in=["placing", "starting", "ready"]).count() == 1,
               timeout_s=30, what="the window's end to take its replica back", live=live)
