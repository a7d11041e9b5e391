"""The agent program without a control plane: presets' command lines, metrics parsing,
inventory on a machine without GPUs, and real engine processes (the fake engine)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from catalog.presets import PRESETS
from fleet.agent.engines import AgentConfig, EngineManager, process_start_time, render_command
from fleet.agent.inventory import read_inventory
from fleet.agent.metrics import parse_metric
from fleet.agent.weights import WeightsError, fetch_weights
from fleet.states import ReplicaState as S

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
FAKE_ENGINE = str(Path(__file__).parent / "fake_engine.py")

VALUES = {"python": "/usr/bin/python3", "weights_path": "/w/model", "host": "0.0.0.0", "port": 20001,
          "served_name": "llama-70b", "gpus": "0,1", "tp_size": 2, "threads": 4}


# --- presets (vLLM, SGLang, llama-server cannot run here: their command lines are pinned) ---

@pytest.mark.parametrize("preset, expected", [
    ("vllm", "vllm serve /w/model --host 0.0.0.0 --port 20001 --served-model-name llama-70b --tensor-parallel-size 2"),
    ("sglang", "/usr/bin/python3 -m sglang.launch_server --model-path /w/model --host 0.0.0.0 --port 20001"
               " --served-model-name llama-70b --tp-size 2 --enable-metrics"),
    ("llama-server-gpu", "llama-server -m /w/model --host 0.0.0.0 --port 20001 --alias llama-70b --metrics -ngl 999"),
    ("llama-cpp-python-cpu", "/usr/bin/python3 -m llama_cpp.server --model /w/model --host 0.0.0.0 --port 20001"
                             " --model_alias llama-70b --n_ctx 2048 --chat_format gemma --n_threads 4"
                             " --interrupt_requests False"),
])
def test_preset_command_lines(preset, expected):
    assert render_command(PRESETS[preset]["command"], VALUES) == expected.split()


def test_placeholders_inside_a_word_are_filled():
    assert render_command("serve --url=http://{host}:{port}/x", VALUES) == ["serve", "--url=http://0.0.0.0:20001/x"]


# --- engine metrics --------------------------------------------------------------------------

@pytest.mark.parametrize("fixture, running_name, waiting_name, expected", [
    ("vllm.txt", "vllm:num_requests_running", "vllm:num_requests_waiting", (3, 7)),
    ("sglang.txt", "sglang:num_running_reqs", "sglang:num_queue_reqs", (12, 0)),
    ("llamacpp.txt", "llamacpp:requests_processing", "llamacpp:requests_deferred", (2, 5)),
    ("vllm_missing_waiting.txt", "vllm:num_requests_running", "vllm:num_requests_waiting", (1, None)),
])
def test_engine_metrics_are_read_by_the_names_the_profile_declares(fixture, running_name, waiting_name, expected):
    text = (FIXTURES / fixture).read_text()
    assert (parse_metric(text, running_name), parse_metric(text, waiting_name)) == expected


def test_an_unparsable_metric_is_unknown_not_zero():
    assert parse_metric("vllm:num_requests_waiting{a=\"b\"} NaNx\n", "vllm:num_requests_waiting") is None
    assert parse_metric("", "vllm:num_requests_waiting") is None


def test_a_machine_without_an_nvidia_driver_reports_cpu_and_ram_and_no_gpus():
    inventory = read_inventory()
    assert inventory["gpus"] == [] or all("memory_total_mib" in g for g in inventory["gpus"])
    assert inventory["cpu_cores"] >= 1 and inventory["memory_mib"] > 0


def test_missing_weights_file_is_a_clear_error(tmp_path):
    with pytest.raises(WeightsError, match="does not exist"):
        fetch_weights("file:/nonexistent/model.gguf", tmp_path)


# --- real engine processes --------------------------------------------------------------------

def spec(replica_id: int, *extra: str, timeout_s: int = 20, readiness: str = "/v1/models") -> dict:
    return {
        "replica_id": replica_id, "served_name": "fake-model", "weights": "file:/dev/null",
        "command": f"{{python}} {FAKE_ENGINE} --port {{port}} --served-name {{served_name}} " + " ".join(extra),
        "env": {}, "gpu_indices": [], "cpu_cores": 1, "readiness_path": readiness,
        "startup_timeout_s": timeout_s, "metrics_path": "/metrics",
        "metric_running": "vllm:num_requests_running", "metric_waiting": "vllm:num_requests_waiting",
    }


async def wait_state(manager: EngineManager, replica_id: int, state: S, timeout_s: float = 20) -> None:
    for _ in range(int(timeout_s / 0.05)):
        engine = manager.engines.get(replica_id)
        if engine is not None and engine.state == state:
            return
        if engine is None and state == S.STOPPED:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"replica {replica_id} not {state}: {manager.reports()}")


@pytest.fixture
async def manager(tmp_path):
    config = AgentConfig(state_dir=tmp_path / "agent", port_min=21100, port_max=21199, stop_grace_s=2,
                         readiness_poll_s=0.05, load_poll_s=0.2)
    m = EngineManager(config, on_change=lambda: None)
    yield m
    await m.stop_all()
    await m.close()


async def test_an_assigned_engine_starts_in_its_own_process_group_and_becomes_ready(manager):
    manager.apply([spec(1)])
    await wait_state(manager, 1, S.READY)
    engine = manager.engines[1]
    assert os.getpgid(engine.pid) == engine.pid != os.getpgid(0)
    assert engine.port and 21100 <= engine.port <= 21199
    await asyncio.sleep(0.5)
    assert engine.running == 0 and engine.waiting == 0  # load read from its metrics


async def test_an_engine_no_longer_assigned_is_stopped(manager):
    manager.apply([spec(1)])
    await wait_state(manager, 1, S.READY)
    pid = manager.engines[1].pid
    manager.apply([])
    await wait_state(manager, 1, S.STOPPED)
    assert process_start_time(pid) is None
    assert [r["state"] for r in manager.reports()] == ["stopped"]


async def test_an_engine_ignoring_sigterm_is_killed_after_the_grace(manager, tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import signal, sys, time, runpy\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"sys.argv = [{FAKE_ENGINE!r}] + sys.argv[1:]\n"
        f"runpy.run_path({FAKE_ENGINE!r}, run_name='__main__')\n"
    )
    s = spec(1)
    s["command"] = f"{sys.executable} {script} --port {{port}}"
    manager.apply([s])
    await wait_state(manager, 1, S.READY)
    pid = manager.engines[1].pid
    manager.apply([])
    await wait_state(manager, 1, S.STOPPED, timeout_s=10)
    assert process_start_time(pid) is None


async def test_an_engine_that_exits_is_failed_with_its_last_log_lines(manager):
    manager.apply([spec(1, "--exit-after-s", "0.5")])
    await wait_state(manager, 1, S.READY)
    await wait_state(manager, 1, S.FAILED)
    assert "exited with code 1" in manager.engines[1].error


async def test_an_engine_that_never_gets_ready_fails_after_its_startup_timeout(manager):
    manager.apply([spec(1, timeout_s=1, readiness="/never")])
    await wait_state(manager, 1, S.FAILED, timeout_s=10)
    assert "not ready after 1 s" in manager.engines[1].error


async def test_a_command_that_cannot_run_fails_instead_of_crashing_the_agent(manager):
    s = spec(1)
    s["command"] = "/nonexistent/engine --port {port}"
    manager.apply([s])
    await wait_state(manager, 1, S.FAILED)
    assert "No such file" in manager.engines[1].error
