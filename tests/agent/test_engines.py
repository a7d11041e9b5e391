"""The agent's side of engine faults, with real engine processes and no control plane: an
engine that exits or stops answering is failed with its last log lines, for the planner to
replace with backoff."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from fleet.agent.engines import AgentConfig, EngineManager
from fleet.states import ReplicaState as S

FLAKY_ENGINE = str(Path(__file__).parent.parent / "flaky_engine.py")

pytestmark = pytest.mark.timeout(60)


def spec(replica_id: int, flag: Path, timeout_s: int = 20) -> dict:
    return {
        "replica_id": replica_id, "served_name": "fake-model", "weights": "file:/dev/null",
        "command": (f"{sys.executable} {FLAKY_ENGINE} --crash-while {flag} --host {{host}} --port {{port}}"
                    " --served-name {served_name} --api-key {api_key}"),
        "env": {}, "gpu_indices": [], "cpu_cores": 1, "readiness_path": "/v1/models",
        "startup_timeout_s": timeout_s, "metrics_path": "", "metric_running": "", "metric_waiting": "",
        "api_key": f"key-{replica_id}",
    }


@pytest.fixture
async def manager(tmp_path):
    config = AgentConfig(state_dir=tmp_path / "agent", port_min=21200, port_max=21299, stop_grace_s=1,
                         readiness_poll_s=0.05, readiness_watch_s=0.2, unready_fail_s=1.0, hung_fail_s=1.0)
    m = EngineManager(config, on_change=lambda: None)
    yield m
    await m.stop_all()
    await m.close()


async def wait_state(manager: EngineManager, replica_id: int, state: S, timeout_s: float = 20) -> None:
    for _ in range(int(timeout_s / 0.05)):
        engine = manager.engines.get(replica_id)
        if engine is not None and engine.state == state:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"replica {replica_id} not {state}: {manager.reports()}")


async def test_an_engine_that_crashes_while_loading_is_failed_with_its_last_log_lines(manager, tmp_path):
    flag = tmp_path / "broken"
    flag.touch()
    manager.apply([spec(1, flag)])
    await wait_state(manager, 1, S.FAILED)
    error = manager.engines[1].error
    assert error.startswith("engine exited with code 1 while starting")
    assert "--- last log lines ---" in error
    assert error.splitlines()[-1] == "RuntimeError: CUDA out of memory (simulated by tests/flaky_engine.py)"
    assert manager.reports()[0]["error"] == error  # what the control plane is told


async def test_a_ready_engine_that_stops_answering_is_failed_and_stopped(manager, tmp_path):
    manager.apply([spec(1, tmp_path / "not-broken")])
    await wait_state(manager, 1, S.READY)
    engine = manager.engines[1]
    os.kill(engine.pid, signal.SIGSTOP)  # hangs: the port accepts, nothing answers
    await wait_state(manager, 1, S.FAILED, timeout_s=15)
    assert "engine stopped answering readiness (/v1/models: no answer)" in engine.error
    assert not engine.alive()  # killed, not left hanging


async def test_a_ready_engine_killed_is_failed_with_its_exit(manager, tmp_path):
    manager.apply([spec(1, tmp_path / "not-broken")])
    await wait_state(manager, 1, S.READY)
    os.kill(manager.engines[1].pid, signal.SIGKILL)
    await wait_state(manager, 1, S.FAILED)
    assert manager.engines[1].error.startswith("engine killed by signal 9")
    assert "fake engine listening on" in manager.engines[1].error


def test_an_errors_summary_is_the_agents_words_and_the_log_line_that_names_the_trouble():
    """The crash-loop answer, the planner's reason and explain's error column show one line:
    never an access-log line (fleet.protocol.error_summary)."""
    from fleet.protocol import error_summary

    access_log = ("engine killed by signal 9\n--- last log lines ---\n"
                  'INFO: 127.0.0.1:42656 - "GET /v1/models HTTP/1.1" 200 OK\nllama_perf_context_print: load time')
    assert error_summary(access_log) == "engine killed by signal 9"
    failing_requests = ("engine killed by signal 9\n--- last log lines ---\n"
                        'INFO:     127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error\n'
                        'INFO:     127.0.0.1:51236 - "GET /v1/nothing HTTP/1.1" 404 Not Found')
    assert error_summary(failing_requests) == "engine killed by signal 9"  # requests' outcomes, not its trouble
    crash = ("engine exited with code 1 while starting\n--- last log lines ---\nloading weights\n"
             "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\nexiting")
    assert error_summary(crash) == ("engine exited with code 1 while starting: "
                                    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert error_summary("") == "" and error_summary(None) == ""
    assert error_summary("port 20002 taken by pid 4711 (python3)") == "port 20002 taken by pid 4711 (python3)"
