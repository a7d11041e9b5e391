"""Ready replicas on fake engines, for the tests that drive a real web process: the rows
the gateway routes to, and how to tell which one answered."""

from __future__ import annotations

from django.utils import timezone

from fleet.models import Agent, Replica

#: The engine key of every replica these tests serve from: the fake engines refuse
#: requests without it, so every relayed answer proves the gateway sent it.
ENGINE_KEY = "test-engine-key"


def serve(model, port: int, engine_key: str = ENGINE_KEY) -> Replica:
    """A ready replica of ``model`` on the engine at ``port`` (started with ``engine_key``)."""
    agent, _ = Agent.objects.get_or_create(name="local", defaults={"address": "127.0.0.1"})
    Agent.objects.filter(pk=agent.pk).update(connected=True, last_seen_at=timezone.now(), address="127.0.0.1")
    return Replica.objects.create(model=model, profile=model.profile, agent=agent, state="ready", port=port,
                                  cpu_cores=1, memory_mib=128, engine_key=engine_key)


def routed_to(response, replica: Replica) -> bool:
    """The gateway answered from ``replica`` (not from a view older than this test: the
    web process's routing table may still hold the previous test's replica of a model of
    the same name, then catch up with the flush that removed it)."""
    return response.headers.get("x-llmgw-replica", "").startswith(f"{replica.pk}@")
