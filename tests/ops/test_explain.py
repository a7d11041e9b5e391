"""``fleet.ops.explain``: the last failure is the meaningful line of the newest failed
replica's error (not its log's last line), with when it failed to the second, and is
cleared once the model is healthy again; ``explain_text`` is what ``llmgw explain`` prints
and the model's admin page shows."""

from __future__ import annotations

import re
from datetime import UTC, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from fleet.models import ControlPlane, Replica
from fleet.ops.explain import explain_model, explain_text
from tests import rows
from tests.cli import llmgw

pytestmark = pytest.mark.django_db

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "engine_logs"


@pytest.fixture(autouse=True)
def no_control_planes():
    """Each test says which agents are silent: a web process's row left by an earlier test
    (committed on PostgreSQL) would make ``listening_since`` "now" and every silent agent
    heard from (as in tests/ops/test_read_model.py)."""
    ControlPlane.objects.all().delete()


def failed(model, agent, log_name: str, ago_s: float, why: str = "engine exited with code 1 while starting"):
    """A replica of ``model`` that failed ``ago_s`` seconds ago with a fixture log tail."""
    error = f"{why}\n--- last log lines ---\n{(LOGS / log_name).read_text().strip()}"
    r = rows.replica(model, agent, state="failed", error=error)
    Replica.objects.filter(pk=r.pk).update(state_changed_at=timezone.now() - timedelta(seconds=ago_s))
    r.refresh_from_db()
    return r


def test_the_last_failure_is_the_meaningful_line_of_the_newest_failure_with_its_time(make_model):
    m = make_model("chat")
    a = rows.agent("gpu-1")
    failed(m, a, "llama_cpp_python_missing_model.log", ago_s=120)
    newest = failed(m, a, "uvicorn_address_in_use.log", ago_s=30)
    info = explain_model(m)
    assert info["last_failure"] == ("engine exited with code 1 while starting: ERROR:    [Errno 98] error while "
                                    "attempting to bind on address ('127.0.0.1', 20001): address already in use")
    assert info["last_failure_at"] == newest.state_changed_at.replace(microsecond=0).isoformat()
    assert info["last_failure_replica"] == newest.pk and "Application shutdown complete." in info["last_failure_log"]
    # The log's last line is not what the failure is summed up by.
    assert "Application shutdown complete" not in info["last_failure"]
    replica_row = next(r for r in info["replicas"] if r["id"] == newest.pk)
    assert replica_row["error"] == info["last_failure"]


def test_the_last_failure_is_cleared_once_a_replica_is_ready_again(make_model):
    m = make_model("chat")
    a = rows.agent("gpu-1")
    broken = failed(m, a, "vllm_cuda_oom_root_cause_above.log", ago_s=60)
    # Ready before the failure (another replica): the model has not healed since.
    rows.replica(m, a, state="ready", ready_at=broken.state_changed_at - timedelta(seconds=5))
    assert explain_model(m)["last_failure"].endswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                                     "2.00 GiB. GPU 0 has a total capacity of 39.39 GiB of which "
                                                     "1.12 GiB is free.")
    # Ready since, but on an agent gone silent: not healthy.
    silent = rows.agent("gpu-2", seen_s_ago=3600)
    rows.replica(m, silent, state="ready", ready_at=timezone.now())
    assert explain_model(m)["last_failure"] is not None
    rows.replica(m, a, state="ready", ready_at=timezone.now())
    info = explain_model(m)
    assert (info["last_failure"], info["last_failure_at"], info["last_failure_log"]) == (None, None, None)
    assert "last failure" not in explain_text(info)


def test_explain_prints_the_failure_line_its_time_and_the_log_lines(make_model):
    m = make_model("chat")
    r = failed(m, rows.agent("gpu-1"), "llama_cpp_python_missing_model.log", ago_s=5)
    code, out, _ = llmgw("explain", "chat")
    assert code == 0
    when = f"{r.state_changed_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    assert (f"  last failure: {when} (replica {r.pk}): engine exited with code 1 while starting: ValueError: Model "
            "path does not exist: /var/lib/llmgw/weights/gemma-3-270m.gguf\n") in out
    assert "    AttributeError: 'Llama' object has no attribute '_sampler'\n" in out  # the log lines follow
    assert out == explain_text(explain_model(m))
    assert re.search(r"\d\d:\d\d:\d\d\.\d", out) is None  # every time to the second


def test_a_model_that_never_failed_has_no_last_failure(make_model):
    m = make_model("chat")
    rows.replica(m, rows.agent("gpu-1"), state="ready", ready_at=timezone.now())
    info = explain_model(m)
    assert info["last_failure"] is None and info["last_failure_at"] is None
