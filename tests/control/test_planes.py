"""Control-plane processes on the database (``fleet.control.planes``): silence counted only
while the control plane could listen, so a database outage longer than the grace loses no
agent."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.control.planes import listening_since
from fleet.control.reconciler import reconcile
from fleet.models import ControlPlane, Replica
from tests.rows import agent, replica

pytestmark = pytest.mark.django_db


# --- listening: silence the control plane itself caused ------------------------------------

def test_without_registered_web_processes_silence_always_counts():
    assert listening_since(timezone.now()) is None


def test_when_no_web_process_has_registered_lately_nobody_is_blamed(settings):
    settings.LLMGW_CONTROL_PLANE_HEARTBEAT_S = 1.0
    now = timezone.now()
    ControlPlane.objects.create(host="h", role="web", pid=1, started_at=now - timedelta(hours=1),
                                last_seen_at=now - timedelta(seconds=30))
    assert listening_since(now) == now


def test_a_database_outage_longer_than_the_grace_loses_no_agent(make_model, settings):
    settings.LLMGW_AGENT_LOST_AFTER_S = 5.0
    settings.LLMGW_CONTROL_PLANE_HEARTBEAT_S = 1.0
    a = agent("a", seen_s_ago=30)  # its stamps could not be written for 30 s
    m = make_model("m", min_replicas=1)
    r = replica(m, a)
    now = timezone.now()
    ControlPlane.objects.create(host="h", role="web", pid=1, started_at=now - timedelta(seconds=2), last_seen_at=now)
    reconcile()
    assert Replica.objects.get(pk=r.pk).state == "ready"
    assert Replica.objects.filter(model=m).count() == 1
