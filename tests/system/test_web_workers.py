"""Several web processes on one port (``llmgw web --workers 2``) in production mode's Redis,
as real processes: both serve ``/v1/``, ``/metrics`` answers the sum over both whichever
process a scrape lands on, and each process's usage report is its own row."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import httpx
import pytest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from fleet.models import ControlPlane, UsageReport
from gateway.models import ApiKey
from tests.pg import private_redis
from tests.processes import PYTHON, ROOT, Proc, fake_engine, free_port, wait_for_port, wait_until
from tests.replicas import routed_to, serve

pytestmark = [pytest.mark.django_db(transaction=True)]

HI = [{"role": "user", "content": "x"}]
#: Completion tokens the fake engine answers each request with.
TOKENS = 3


@pytest.fixture(scope="module")
def redis_server():
    with private_redis() as server:
        yield server


@pytest.fixture(scope="module")
def two_workers(django_db_setup, redis_server, tmp_path_factory):
    logs = tmp_path_factory.mktemp("web-workers")
    engine_port, port = free_port(), free_port()
    engine = fake_engine(engine_port, logs, "--tokens", str(TOKENS))
    wait_for_port(engine_port)
    env = {"DJANGO_SETTINGS_MODULE": "llmgw.settings", "LLMGW_DATA_DIR": str(logs), "LLMGW_REDIS_URL": redis_server.url,
           "LLMGW_WATCH_INTERVAL": "50ms", "LLMGW_USAGE_FLUSH_INTERVAL": "0.2s"}
    web = Proc([PYTHON, str(ROOT / "manage.py"), "llmgw", "web", "--port", str(port), "--workers", "2"],
               logs / "web.log", env=env)
    try:
        wait_for_port(port, timeout_s=60, proc=web.proc)
        yield {"base": f"http://127.0.0.1:{port}", "web": web, "engine": engine_port,
               "metrics_dir": Path(logs) / f"prometheus-web-{port}"}
    finally:
        web.stop()
        engine.stop()
    assert "Traceback" not in web.log(), web.log()[-5000:]


def post(base: str, key: str) -> httpx.Response:
    # A new connection each time: the kernel hands it to whichever process accepts first.
    return httpx.post(base + "/v1/chat/completions", json={"model": "shared", "messages": HI, "max_tokens": TOKENS},
                      headers={"Authorization": f"Bearer {key}"}, timeout=60)


def requests_by_pid(metrics_dir: Path) -> dict[int, float]:
    """``llmgw_requests_total`` as each process wrote it in its own file."""
    counts: dict[int, float] = {}
    for name in glob.glob(str(metrics_dir / "counter_*.db")):
        pid = int(os.path.basename(name)[len("counter_"):-3])
        for key, value, _, _ in MmapedDict.read_all_values_from_file(name):
            if json.loads(key)[1] == "llmgw_requests_total":
                counts[pid] = counts.get(pid, 0.0) + value
    return counts


def scraped(base: str, name: str) -> float:
    """The sum of one metric's samples in a ``/metrics`` scrape."""
    text = httpx.get(base + "/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name)


def test_two_web_processes_serve_one_port_and_metrics_and_reports_add_up(two_workers, make_model):
    base, web = two_workers["base"], two_workers["web"]
    # Both processes are up and registered, each a control plane of its own.
    wait_until(lambda: len(set(ControlPlane.objects.filter(role=ControlPlane.Role.WEB).values_list("pid", flat=True))
                           - {web.pid}) >= 2, timeout_s=60, what="two web processes registered")
    model = make_model("shared")
    replica = serve(model, two_workers["engine"])
    _, key = ApiKey.create_key("workers")
    wait_until(lambda: routed_to(post(base, key), replica), timeout_s=60, what="routed")
    sent = 1
    # Until both processes have answered some (bounded by a count, not a time).
    while sent < 2000 and len([c for c in requests_by_pid(two_workers["metrics_dir"]).values() if c > 0]) < 2:
        assert post(base, key).status_code == 200
        sent += 1
    by_pid = requests_by_pid(two_workers["metrics_dir"])
    assert len([c for c in by_pid.values() if c > 0]) == 2, by_pid
    wait_until(lambda: sum(requests_by_pid(two_workers["metrics_dir"]).values()) >= sent, timeout_s=30,
               what="every answer counted")
    # Whichever process answers the scrape, it says the sum over both.
    for _ in range(6):
        assert scraped(base, "llmgw_requests_total") == sent
        assert scraped(base, "llmgw_tokens_total") >= sent * TOKENS  # completion tokens (+ prompt)
        assert scraped(base, "llmgw_requests_in_flight") == 0
    # Each process reports its own in-flight/last-use row for the replica: two rows, not one overwritten.
    wait_until(lambda: UsageReport.objects.filter(replica=replica).values("process").distinct().count() == 2,
               timeout_s=30, what="a usage report from each process")
    processes = set(UsageReport.objects.filter(replica=replica).values_list("process", flat=True))
    assert {p.rsplit(":", 1)[1] for p in processes} == {str(pid) for pid in by_pid if by_pid[pid] > 0}
