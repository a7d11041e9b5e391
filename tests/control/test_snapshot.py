"""Snapshot loading on the database (``fleet.control.snapshot``): the failures a model's
crash loop is counted from."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.rows import agent, replica

pytestmark = pytest.mark.django_db


# --- crash loops ---------------------------------------------------------------------------

def test_an_engine_dying_soon_after_each_start_stays_in_its_crash_loop(make_model, settings):
    from fleet.control.snapshot import load_snapshot

    settings.LLMGW_BACKOFF_RESET_AFTER_S = 60.0
    a = agent("a")
    m = make_model("m", min_replicas=1)
    now = timezone.now()
    for seconds_ago in (50, 30, 10):  # each was ready for 5 s, then died
        replica(m, a, state="failed", ready_at=now - timedelta(seconds=seconds_ago + 5),
                state_changed_at=now - timedelta(seconds=seconds_ago), error="engine exited with code -9")
    assert len(next(v for v in load_snapshot(now).models if v.id == m.id).failures) == 3


def test_a_replica_ready_for_the_reset_period_ends_the_crash_loop(make_model, settings):
    from fleet.control.snapshot import load_snapshot

    settings.LLMGW_BACKOFF_RESET_AFTER_S = 60.0
    a = agent("a")
    m = make_model("m", min_replicas=1)
    now = timezone.now()
    replica(m, a, state="failed", state_changed_at=now - timedelta(seconds=200))
    replica(m, a, state="failed", ready_at=now - timedelta(seconds=190),  # served 70 s: proved itself
            state_changed_at=now - timedelta(seconds=120))
    replica(m, a, state="failed", state_changed_at=now - timedelta(seconds=20))
    failures = next(v for v in load_snapshot(now).models if v.id == m.id).failures
    assert [round((now - f).total_seconds()) for f in failures] == [120, 20]
