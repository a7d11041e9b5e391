"""The agent program without a control plane: presets' command lines, metrics parsing,
inventory on a machine without GPUs, and real engine processes (the fake engine)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import httpx
import pytest

from catalog.presets import PRESETS
from catalog.presets import uses_api_key
from fleet.agent.engines import (AgentConfig, EngineManager, _port_free, engine_environment, probe_host,
                                 process_start_time, render_command, resolve_bind_host)
from fleet.agent.inventory import read_inventory
from fleet.agent.metrics import parse_metric
from fleet.agent.weights import WeightsError, fetch_weights
from fleet.states import ReplicaState as S
from tests.sockets import listening_addresses, refused

FIXTURES = Path(__file__).parent.parent / "fixtures" / "metrics"
FAKE_ENGINE = str(Path(__file__).parent.parent / "fake_engine.py")

VALUES = {"python": "/usr/bin/python3", "weights_path": "/w/model", "host": "10.0.0.5", "port": 20001,
          "served_name": "llama-70b", "gpus": "0,1", "tp_size": 2, "threads": 4, "api_key": "K3y"}


# --- presets (vLLM, SGLang, llama-server cannot run here: their command lines are pinned) ---

@pytest.mark.parametrize("preset, expected, key_env", [
    ("vllm", "vllm serve /w/model --host 10.0.0.5 --port 20001 --served-model-name llama-70b"
             " --tensor-parallel-size 2", {"VLLM_API_KEY": "K3y"}),
    # SGLang reads no variable for its key: it is on the command line.
    ("sglang", "/usr/bin/python3 -m sglang.launch_server --model-path /w/model --host 10.0.0.5 --port 20001"
               " --served-model-name llama-70b --tp-size 2 --enable-metrics --api-key K3y", {}),
    ("llama-server-gpu", "llama-server -m /w/model --host 10.0.0.5 --port 20001 --alias llama-70b --metrics -ngl 999",
     {"LLAMA_API_KEY": "K3y"}),
    ("llama-cpp-python-cpu", "/usr/bin/python3 -m llama_cpp.server --model /w/model --host 10.0.0.5 --port 20001"
                             " --model_alias llama-70b --n_ctx 2048 --chat_format gemma --n_threads 4"
                             " --interrupt_requests False", {"API_KEY": "K3y"}),
])
def test_preset_command_lines_and_engine_keys(preset, expected, key_env):
    """Every preset listens on the agent's address and is started with the replica's key,
    in its environment where the engine reads one there (never on the command line, which
    every local user can read), else on the command line."""
    argv = render_command(PRESETS[preset]["command"], VALUES)
    assert argv == expected.split()
    env = engine_environment({"PATH": "/bin"}, PRESETS[preset].get("env"), VALUES["gpus"], VALUES["api_key"])
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1", **key_env}
    assert uses_api_key(PRESETS[preset]["command"], PRESETS[preset].get("env"))
    assert ("K3y" in argv) == (not key_env)


def test_the_engine_environment_carries_no_agent_secret_and_no_bind_override():
    inherited = {"PATH": "/usr/bin", "HOME": "/home/a", "LLMGW_AGENT_TOKEN": "llmgw-agent-x",
                 "LLMGW_SECRET_KEY": "s", "LLMGW_DATABASE_URL": "postgres://u:p@db/llmgw", "llmgw_lower": "x",
                 "LLMGW_METRICS_TOKEN": "m", "HOST": "0.0.0.0", "PORT": "80", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    env = engine_environment(inherited, {"OMP_NUM_THREADS": "1", "MY_KEY": "pre-{api_key}"}, "", "sekrit")
    assert env == {"PATH": "/usr/bin", "HOME": "/home/a", "OMP_NUM_THREADS": "1", "MY_KEY": "pre-sekrit",
                   "CUDA_VISIBLE_DEVICES": ""}
    # From a control plane that sends no key: no variable set to an empty key.
    assert "VLLM_API_KEY" not in engine_environment({}, {"VLLM_API_KEY": "{api_key}"}, "0", "")


def test_placeholders_inside_a_word_are_filled():
    assert render_command("serve --url=http://{host}:{port}/x", VALUES) == ["serve", "--url=http://10.0.0.5:20001/x"]


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


def test_a_machine_without_an_nvidia_driver_reports_cpu_and_ram_and_no_gpus(monkeypatch):
    """NVML is there but finds no driver (the library installed on a CPU machine): no GPUs,
    and NVML is not asked again."""
    import types

    from fleet.agent import inventory as inventory_module

    class NVMLError(Exception):
        pass

    calls = []

    def no_driver():
        calls.append("nvmlInit")
        raise NVMLError("Driver Not Loaded")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=no_driver))
    monkeypatch.setattr(inventory_module, "_no_driver", False)
    inventory = read_inventory()
    assert inventory["gpus"] == []
    assert inventory["cpu_cores"] == len(os.sched_getaffinity(0)) and inventory["memory_mib"] > 0
    assert read_inventory()["gpus"] == [] and calls == ["nvmlInit"]


def test_missing_weights_file_is_a_clear_error(tmp_path):
    with pytest.raises(WeightsError, match="does not exist"):
        fetch_weights("file:/nonexistent/model.gguf", tmp_path)


# --- real engine processes --------------------------------------------------------------------

def spec(replica_id: int, *extra: str, timeout_s: int = 20, readiness: str = "/v1/models") -> dict:
    return {
        "replica_id": replica_id, "served_name": "fake-model", "weights": "file:/dev/null",
        "command": (f"{{python}} {FAKE_ENGINE} --host {{host}} --port {{port}} --served-name {{served_name}}"
                    " --api-key {api_key} " + " ".join(extra)),
        "env": {}, "gpu_indices": [], "cpu_cores": 1, "readiness_path": readiness,
        "startup_timeout_s": timeout_s, "metrics_path": "/metrics",
        "metric_running": "vllm:num_requests_running", "metric_waiting": "vllm:num_requests_waiting",
        "api_key": f"engine-key-{replica_id}",
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


async def test_a_stop_that_lands_while_a_status_is_on_its_way_is_reported_in_the_next(manager):
    """Building and sending a status both wait; an engine that stops meanwhile must not be
    forgotten with the stops that did go out (its replica would stay stopping for ever)."""
    manager.apply([spec(1), spec(2)])
    await wait_state(manager, 1, S.READY)
    await wait_state(manager, 2, S.READY)
    manager.apply([spec(2)])
    await wait_state(manager, 1, S.STOPPED)
    on_its_way = manager.reports()  # the status being built: replica 1 stopped, 2 ready
    manager.apply([])
    await wait_state(manager, 2, S.STOPPED)  # 2 stops before that status is sent
    manager.sent(on_its_way)
    assert [(r["replica_id"], r["state"]) for r in manager.reports()] == [(2, "stopped")]
    manager.sent(manager.reports())
    assert manager.reports() == []


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


# --- engines reachable only through the gateway (issue 12) ------------------------------------

async def test_an_engine_port_refuses_requests_without_its_key_while_the_agents_probes_pass(manager, tmp_path):
    record = tmp_path / "record.jsonl"
    manager.apply([spec(1, "--record", str(record))])
    await wait_state(manager, 1, S.READY)
    engine = manager.engines[1]
    for _ in range(100):  # the metrics probe sent the key too: load is known, not None
        if engine.running is not None:
            break
        await asyncio.sleep(0.05)
    assert (engine.running, engine.waiting) == (0, 0)
    base = f"http://127.0.0.1:{engine.port}"
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        for headers in ({}, {"Authorization": "Bearer engine-key-2"}, {"Authorization": "engine-key-1"},
                        {"Authorization": "Bearer engine-key-1x"}):
            answer = await client.post("/v1/chat/completions", json=chat, headers=headers)
            assert answer.status_code == 401, (headers, answer.text)
            assert answer.json()["error"]["code"] == "invalid_api_key"
            for path in ("/v1/models", "/metrics", "/health"):
                assert (await client.get(path, headers=headers)).status_code == 401
        events = [json.loads(line)["event"] for line in record.read_text().splitlines()]
        assert "request" not in events and events.count("refused") == 16  # nothing reached inference
        ok = await client.post("/v1/chat/completions", json=chat, headers={"Authorization": "Bearer engine-key-1"})
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]
    assert manager.engines[1].state == S.READY  # the agent's own probes keep passing


async def test_an_engine_listens_on_the_advertised_address_only(manager):
    manager.advertise("127.0.0.2")
    manager.apply([spec(1)])
    await wait_state(manager, 1, S.READY)
    engine = manager.engines[1]
    assert listening_addresses(engine.port) == {"127.0.0.2"}  # not 0.0.0.0, not 127.0.0.1
    assert refused("127.0.0.1", engine.port)
    async with httpx.AsyncClient(timeout=10) as client:
        answer = await client.get(f"http://127.0.0.2:{engine.port}/v1/models",
                                  headers={"Authorization": "Bearer engine-key-1"})
    assert answer.status_code == 200


async def test_an_engine_listens_on_an_advertised_ipv6_address(manager):
    manager.advertise("::1")
    manager.apply([spec(1)])
    await wait_state(manager, 1, S.READY)
    port = manager.engines[1].port
    assert listening_addresses(port) == {"::1"}
    assert refused("127.0.0.1", port)


async def test_without_an_advertised_address_engines_listen_on_loopback(manager):
    manager.apply([spec(1)])
    await wait_state(manager, 1, S.READY)
    assert listening_addresses(manager.engines[1].port) == {"127.0.0.1"}


def test_the_port_check_looks_at_the_advertised_address_ipv6_too():
    for family, host in ((socket.AF_INET, "127.0.0.2"), (socket.AF_INET6, "::1")):
        with socket.socket(family, socket.SOCK_STREAM) as taken:
            taken.bind((host, 0))
            taken.listen()
            port = taken.getsockname()[1]
            assert not _port_free(host, port)
        assert _port_free(host, port)


async def test_an_advertised_address_of_another_machine_is_a_clear_start_failure(manager):
    manager.advertise("192.0.2.10")  # TEST-NET-1: never an address of this machine
    manager.apply([spec(1)])
    await wait_state(manager, 1, S.FAILED)
    assert "cannot listen on 192.0.2.10: not an address of this machine" in manager.engines[1].error


async def test_an_engine_inherits_no_llmgw_variable_and_not_the_agents_token(tmp_path, monkeypatch):
    token = "llmgw-agent-Secret0123456789"
    # Values no machine's own environment holds by chance (a container named "...pw..." once matched "pw").
    secrets_here = {"LLMGW_AGENT_TOKEN": token, "LLMGW_SECRET_KEY": "django-secret-Q7v2", "LLMGW_ADMIN_PASSWORD":
                    "admin-pw-Q7v2", "LLMGW_DATABASE_URL": "postgres://llmgw:dbpass-Q7v2@db/llmgw",
                    "LLMGW_METRICS_TOKEN": "metrics-token-Q7v2"}
    for name, value in secrets_here.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOST", "0.0.0.0")  # would move llama-cpp-python's server off the advertised address
    config = AgentConfig(state_dir=tmp_path / "agent", port_min=21100, port_max=21199, stop_grace_s=2,
                         readiness_poll_s=0.05)
    manager = EngineManager(config, on_change=lambda: None, server_url="ws://127.0.0.1:1", token=token)
    dump = tmp_path / "engine-env.json"
    s = spec(1, "--dump-env", str(dump))
    s["env"] = {"OMP_NUM_THREADS": "1", "ENGINE_SECRET": "{api_key}"}
    try:
        manager.apply([s])
        await wait_state(manager, 1, S.READY)
        seen = json.loads(dump.read_text())
    finally:
        await manager.stop_all()
        await manager.close()
    assert not [name for name in seen if name.upper().startswith("LLMGW")]
    assert not [name for name, value in seen.items() if any(v in value for v in secrets_here.values())]
    assert "HOST" not in seen and seen["PATH"] == os.environ["PATH"]
    assert (seen["OMP_NUM_THREADS"], seen["ENGINE_SECRET"], seen["CUDA_VISIBLE_DEVICES"]) == ("1", "engine-key-1", "")


async def test_an_adopted_engine_is_probed_with_its_key_and_the_state_file_is_private(tmp_path):
    config = AgentConfig(state_dir=tmp_path / "agent", port_min=21100, port_max=21199, stop_grace_s=2,
                         readiness_poll_s=0.05, load_poll_s=0.2)
    first = EngineManager(config, on_change=lambda: None)
    first.advertise("127.0.0.2")
    first.apply([spec(1)])
    await wait_state(first, 1, S.READY)
    pid, port = first.engines[1].pid, first.engines[1].port
    await first.close()  # the agent goes away (re-exec, crash): its engine keeps serving
    assert config.state_file.stat().st_mode & 0o777 == 0o600
    assert config.state_dir.stat().st_mode & 0o777 == 0o700
    second = EngineManager(config, on_change=lambda: None)
    try:
        assert await second.adopt() == 1
        engine = second.engines[1]
        assert (engine.pid, engine.host, engine.port, engine.state) == (pid, "127.0.0.2", port, S.READY)
        for _ in range(100):
            if engine.running is not None:
                break
            await asyncio.sleep(0.05)
        assert engine.running == 0  # its metrics answered the key
        await asyncio.sleep(config.readiness_watch_s + 1.0)
        assert engine.state == S.READY and not engine.error  # readiness keeps passing
    finally:
        await second.stop_all()
        await second.close()
    assert process_start_time(pid) is None


async def test_a_failed_engines_log_lines_reported_upstream_do_not_carry_its_key(manager, tmp_path):
    script = tmp_path / "chatty.py"
    script.write_text("import sys\nprint('server_args:', sys.argv, flush=True)\nsys.exit(3)\n")
    s = spec(1)
    s["command"] = f"{sys.executable} {script} --port {{port}} --api-key {{api_key}}"
    manager.apply([s])
    await wait_state(manager, 1, S.FAILED)
    error = manager.engines[1].error
    assert "server_args:" in error and "--api-key" in error and "engine-key-1" not in error


def test_an_advertised_name_is_resolved_to_the_address_engines_listen_on(monkeypatch):
    assert resolve_bind_host("10.1.2.3") == "10.1.2.3" and resolve_bind_host("[fd00::5]") == "fd00::5"
    # A name: its first address, whichever this machine's resolver puts first.
    first = socket.getaddrinfo("localhost", None, type=socket.SOCK_STREAM)[0][4][0]
    assert resolve_bind_host("localhost") == first
    answers = [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::7", 0, 0, 0)),
               (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.9.8.7", 0))]
    with monkeypatch.context() as patched:
        patched.setattr(socket, "getaddrinfo", lambda *a, **k: answers)
        assert resolve_bind_host("gpu-7.example.com") == "fd00::7"
    with pytest.raises(ValueError, match="cannot resolve the advertised address"):
        resolve_bind_host("no-such-host.invalid")
    assert [probe_host(h) for h in ("0.0.0.0", "::", "10.1.2.3", "fd00::5")] == [
        "127.0.0.1", "[::1]", "10.1.2.3", "[fd00::5]"]


@pytest.mark.parametrize("answer", ["0.0.0.0", "::"])
def test_an_advertised_name_that_resolves_to_every_interface_is_refused(monkeypatch, answer):
    """A name whose DNS (or hosts file: sinkholes answer 0.0.0.0) says "unspecified" would
    have engines listen on every interface, which only ``--bind-host 0.0.0.0`` may ask for."""
    family = socket.AF_INET6 if ":" in answer else socket.AF_INET
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [(family, socket.SOCK_STREAM, 6, "", (answer, 0))])
    with pytest.raises(ValueError, match="every interface"):
        resolve_bind_host("gpu-1.example.com")
    with pytest.raises(ValueError, match="every interface"):
        resolve_bind_host(answer)


async def test_a_key_cut_by_the_log_tails_window_does_not_leak_its_end(manager, tmp_path):
    """The tail reported upstream is within the log's last LOG_WINDOW_BYTES: a key printed
    just before them would be cut, and its end (not equal to the key, so not masked)
    reported. The tail starts at a whole line."""
    from fleet.agent.engines import LOG_WINDOW_BYTES

    key = "K" + "0123456789abcdefghijklmnopqrstuvwxyzABCDEFG" + "Z"
    half = len(key) // 2
    pad = LOG_WINDOW_BYTES - (len(key) - half) - 1  # the window starts in the middle of the key
    script = tmp_path / "chatty.py"
    script.write_text("import sys\n"
                      f"sys.stdout.write('server_args: --api-key ' + {key!r} + '\\n' + 'z' * {pad - 1} + '\\n')\n"
                      "sys.exit(3)\n")
    s = spec(1)
    s["api_key"] = key
    s["command"] = f"{sys.executable} {script} --port {{port}} --api-key {{api_key}}"
    manager.apply([s])
    await wait_state(manager, 1, S.FAILED)
    error = manager.engines[1].error
    assert "zzzz" in error  # the tail is there
    assert key[half:] not in error and key[-8:] not in error, error[:300]


# --- load on every heartbeat (issue 14) --------------------------------------------------------

class RecordingSocket:
    """Stands in for the websocket: keeps every message the agent sends."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    async def send(self, text: str) -> None:
        self.sent.append(json.loads(text))


async def test_heartbeats_carry_the_load_read_afresh_from_the_engine_while_nothing_changes(tmp_path, monkeypatch):
    """A steady engine: no status goes out, but every heartbeat carries its load, and the
    agent keeps reading the engine's metrics every ``load_poll_s`` meanwhile (the numbers a
    heartbeat carries are that fresh). A replica whose load is unknown is left out."""
    from fleet.agent import engines
    from fleet.agent.client import Agent, ClientOptions

    reads = []
    real_read_load = engines.read_load

    async def counted(*args, **kwargs):
        reads.append(args[1])
        return await real_read_load(*args, **kwargs)

    monkeypatch.setattr(engines, "read_load", counted)
    config = AgentConfig(state_dir=tmp_path / "agent", port_min=21100, port_max=21199, stop_grace_s=2,
                         readiness_poll_s=0.05, load_poll_s=0.2)
    agent = Agent(ClientOptions(server="ws://127.0.0.1:1", token="t", heartbeat_s=0.1), config)
    try:
        agent.manager.apply([spec(1), {**spec(2), "metrics_path": ""}])  # 2: no metrics, load unknown
        await wait_state(agent.manager, 1, S.READY)
        await wait_state(agent.manager, 2, S.READY)
        for _ in range(100):
            if agent.manager.engines[1].running is not None:
                break
            await asyncio.sleep(0.05)
        agent._status_due.clear()  # what changed until now has been "sent"
        ws, before = RecordingSocket(), len(reads)
        sender = asyncio.create_task(agent._send_loop(ws))
        # Until five heartbeats went out and the engine was read three more times (a busy
        # machine stretches both cadences; nothing here counts on how long they take).
        for _ in range(600):
            if len(reads) - before >= 3 and sum(m["type"] == "heartbeat" for m in ws.sent) >= 5:
                break
            await asyncio.sleep(0.05)
        sender.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sender
        heartbeats = [m for m in ws.sent if m["type"] == "heartbeat"]
        assert [m["type"] for m in ws.sent] == ["heartbeat"] * len(ws.sent) and len(heartbeats) >= 5
        assert all(m["loads"] == [[1, 0, 0]] and m["v"] == 1 for m in heartbeats)
        assert len(reads) - before >= 3  # read on its cadence, though nothing changed
    finally:
        await agent.manager.stop_all()
        await agent.manager.close()


def test_a_heartbeat_is_bare_when_no_load_is_known_and_old_ends_accept_both():
    from fleet import protocol

    reports = [{"replica_id": 1, "state": "ready", "running": None, "waiting": None},
               {"replica_id": 2, "state": "starting", "running": 1, "waiting": 0},
               {"replica_id": 3, "state": "ready", "running": 4, "waiting": None},
               {"replica_id": 4, "state": "stopped", "running": 1, "waiting": 1}]
    assert protocol.loads_of(reports) == [[3, 4, None]]
    assert protocol.heartbeat(protocol.loads_of(reports[:2])) == {"type": "heartbeat", "v": 1}
    message = protocol.heartbeat([[3, 4, None]])
    # A control plane of either kind reads its type and version only, then its fields.
    assert protocol.check_fields(protocol.check_message(message, protocol.AGENT_MESSAGES)) == message
    assert protocol.check_message(protocol.heartbeat(), protocol.AGENT_MESSAGES) == {"type": "heartbeat", "v": 1}
    for bad in ([[3, 4]], [["3", 4, 0]], [[3, True, 0]], "3,4,0"):
        with pytest.raises(protocol.ProtocolError):
            protocol.check_fields({"type": "heartbeat", "v": 1, "loads": bad})
