"""``llmgw restart`` with real processes: the agent re-executes itself, adopts its engine
(same pid), the replica stays ready and a stream started before the restart completes."""

from __future__ import annotations

import io
import threading
import time

import httpx
import pytest
from django.core.management import call_command

from catalog.models import Model
from fleet.models import Replica
from tests.cluster import fake_profile, live_cluster_fixture
from tests.processes import wait_until

HI = [{"role": "user", "content": "x"}]  # the smallest valid chat

pytestmark = [pytest.mark.timeout(120)]


# A restart must be shorter than the lost-agent grace to place nothing anew: on a loaded
# 2-core machine re-executing the agent (Python and Django start-up) can take more than the
# 5 s the other live clusters use.
live = live_cluster_fixture("restart", extra_env={"LLMGW_AGENT_LOST_AFTER": "30s"})


def test_engines_keep_serving_through_an_agent_restart(live):
    profile = fake_profile("steady", "--tokens", "20", "--token-delay-ms", "150")
    model = Model(name="steady", weights="file:/dev/null", profile=profile, min_replicas=1, max_replicas=1)
    model.full_clean()
    model.save()
    replica = wait_until(lambda: Replica.objects.filter(model=model, state="ready").first(), timeout_s=30,
                         what="the replica to be ready")
    pid = replica.pid
    assert pid

    first_chunk = threading.Event()
    result = {}

    def stream():
        body = b""
        with httpx.Client(base_url=live.url, timeout=60) as client:
            with client.stream("POST", "/v1/chat/completions",
                               json={"model": "steady", "stream": True, "messages": HI}) as r:
                result["status"] = r.status_code
                for chunk in r.iter_raw():
                    body += chunk
                    first_chunk.set()
        result["body"] = body

    reader = threading.Thread(target=stream)
    reader.start()
    assert first_chunk.wait(10)
    old_agent_pid = live.agent.pid
    out = io.StringIO()
    call_command("llmgw", "restart", "--agents-only", "--timeout-s", "20", stdout=out, stderr=out)
    assert "local: back" in out.getvalue(), out.getvalue() + live.logs()
    reader.join(30)

    assert result["status"] == 200
    assert result["body"].count(b"tok") == 20 and b"[DONE]" in result["body"]
    assert live.agent.pid == old_agent_pid  # re-executed in place: same process, new program
    assert "adopted engine of replica" in live.agent.log()
    time.sleep(1.0)
    replica.refresh_from_db()
    assert replica.state == "ready" and replica.pid == pid
    replicas = list(Replica.objects.filter(model=model).values_list("id", "state", "reason"))
    assert len(replicas) == 1, f"placed anew: {replicas}\n{live.logs()}"  # nothing placed anew
    with httpx.Client(base_url=live.url, timeout=30) as client:
        assert client.post("/v1/chat/completions", json={"model": "steady", "messages": HI}).status_code == 200
