"""GPU readings on the agent (``fleet.agent.inventory.read_gpus`` with a fake ``pynvml``):
memory, utilisation and temperature per GPU, each optional — a reading the driver refuses
is unknown, never a GPU dropped — and heartbeats that carry them every ``gpu_readings_s``."""

from __future__ import annotations

import asyncio
import json
import sys
import types

import pytest

from fleet import protocol
from fleet.agent import client as client_module
from fleet.agent import inventory
from fleet.agent.client import Agent, ClientOptions
from fleet.agent.engines import AgentConfig
from fleet.agent.inventory import FAKE_GPUS_ENV, read_gpus, read_inventory

MIB = 1024 * 1024


class NVMLError(Exception):
    pass


def fake_pynvml(gpus: list[dict], refuse: set[tuple[int, str]] = frozenset()) -> types.SimpleNamespace:
    """A ``pynvml`` with ``gpus`` (index = position: total/used MiB, util %, temp °C);
    ``refuse``: (index, function name) pairs that raise NVMLError."""
    calls: list[tuple] = []

    def reader(name, value_of):
        def read(handle, *args):
            calls.append((name, handle, *args))
            if (handle, name) in refuse:
                raise NVMLError(f"{name}: Not Supported")
            return value_of(gpus[handle])
        return read

    return types.SimpleNamespace(
        NVMLError=NVMLError, NVML_TEMPERATURE_GPU=0, calls=calls,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetName=reader("nvmlDeviceGetName", lambda g: b"NVIDIA H100 80GB HBM3"),
        nvmlDeviceGetUUID=reader("nvmlDeviceGetUUID", lambda g: f"GPU-{g['total']}-{id(g)}"),
        nvmlDeviceGetMemoryInfo=reader("nvmlDeviceGetMemoryInfo",
                                       lambda g: types.SimpleNamespace(total=g["total"] * MIB, used=g["used"] * MIB)),
        nvmlDeviceGetUtilizationRates=reader("nvmlDeviceGetUtilizationRates",
                                             lambda g: types.SimpleNamespace(gpu=g["util"], memory=10)),
        nvmlDeviceGetTemperature=reader("nvmlDeviceGetTemperature", lambda g: g["temp"]),
    )


@pytest.fixture
def nvml(monkeypatch):
    """Install a fake pynvml: ``nvml(gpus, refuse)`` returns it."""
    monkeypatch.setattr(inventory, "_no_driver", False)
    monkeypatch.setattr(inventory, "_refused", set())
    monkeypatch.delenv(FAKE_GPUS_ENV, raising=False)

    def install(gpus, refuse=frozenset()):
        module = fake_pynvml(gpus, set(refuse))
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module
    return install


TWO = [{"total": 81559, "used": 1200, "util": 87, "temp": 64}, {"total": 81559, "used": 0, "util": 0, "temp": 31}]


def test_each_gpu_reports_memory_utilisation_and_the_die_temperature(nvml):
    module = nvml(TWO)
    gpus = read_gpus()
    assert [(g["index"], g["memory_total_mib"], g["memory_used_mib"], g["utilisation_pct"], g["temperature_c"])
            for g in gpus] == [(0, 81559, 1200, 87.0, 64.0), (1, 81559, 0, 0.0, 31.0)]
    assert gpus[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert ("nvmlDeviceGetTemperature", 0, module.NVML_TEMPERATURE_GPU) in module.calls


def test_a_reading_the_driver_refuses_is_unknown_and_the_gpu_stays(nvml, caplog):
    nvml(TWO, refuse={(0, "nvmlDeviceGetUtilizationRates"), (1, "nvmlDeviceGetTemperature"),
                      (1, "nvmlDeviceGetMemoryInfo")})
    gpus = read_gpus()
    assert [g["index"] for g in gpus] == [0, 1]  # never dropped
    assert (gpus[0]["utilisation_pct"], gpus[0]["temperature_c"]) == (None, 64.0)
    assert (gpus[1]["utilisation_pct"], gpus[1]["temperature_c"]) == (0.0, None)
    assert gpus[0]["memory_total_mib"] == 81559
    assert "memory_total_mib" not in gpus[1] and "memory_used_mib" not in gpus[1]  # unknown, not 0
    read_gpus()
    assert caplog.text.count("GPU 0: its utilisation cannot be read") == 1  # said once, not every reading
    # What it sends passes the control plane's checks.
    protocol.check_fields(protocol.heartbeat(gpus=protocol.readings_of(gpus)))
    protocol.check_fields({"type": "hello", "v": 1, "inventory": {"gpus": gpus}})


def test_an_nvidia_ml_py_without_the_temperature_function_reports_it_unknown(nvml):
    module = nvml(TWO[:1])
    del module.nvmlDeviceGetTemperature  # deprecated upstream: may go in a later release
    assert read_gpus()[0]["temperature_c"] is None


def test_simulated_gpus_report_no_utilisation_nor_temperature(monkeypatch):
    monkeypatch.setenv(FAKE_GPUS_ENV, "2x24576")
    monkeypatch.setattr(inventory, "read_gpus", lambda: pytest.fail("the driver was asked"))
    gpus = read_inventory()["gpus"]
    assert [(g["utilisation_pct"], g["temperature_c"], g["memory_used_mib"]) for g in gpus] == [(None, None, 0)] * 2
    assert protocol.readings_of(gpus) == [
        {"index": i, "memory_used_mib": 0, "memory_total_mib": 24576, "utilisation_pct": None, "temperature_c": None}
        for i in range(2)]


class Socket:
    """What ``Agent._send_loop`` writes to."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    async def send(self, text: str) -> None:
        self.sent.append(json.loads(text))


async def test_heartbeats_carry_the_gpu_readings_every_gpu_readings_s_not_every_time(tmp_path, monkeypatch):
    readings = []

    def read():
        readings.append(1)
        return [{"index": 0, "uuid": "u", "name": "n", "memory_total_mib": 100, "memory_used_mib": len(readings),
                 "utilisation_pct": 50.0, "temperature_c": 40.0}]

    monkeypatch.setattr(client_module, "current_gpus", read)
    agent = Agent(ClientOptions(server="ws://127.0.0.1:9", token="t", heartbeat_s=0.05, gpu_readings_s=0.5),
                  AgentConfig(state_dir=tmp_path / "agent"))
    ws = Socket()
    loop = asyncio.create_task(agent._send_loop(ws))
    try:
        deadline = asyncio.get_running_loop().time() + 30
        while asyncio.get_running_loop().time() < deadline:
            with_gpus = [m for m in ws.sent if m.get("gpus")]
            if len(with_gpus) >= 2:
                break
            await asyncio.sleep(0.05)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await agent.manager.close()
    beats = [m for m in ws.sent if m["type"] == "heartbeat"]
    with_gpus = [m for m in beats if m.get("gpus")]
    assert len(with_gpus) >= 2, ws.sent
    assert len(beats) > len(with_gpus)  # the other heartbeats stay bare
    assert with_gpus[0]["gpus"] == [{"index": 0, "memory_used_mib": 1, "memory_total_mib": 100,
                                     "utilisation_pct": 50.0, "temperature_c": 40.0}]
    assert with_gpus[1]["gpus"][0]["memory_used_mib"] == 2  # read afresh each time
    for message in beats:
        protocol.check_fields(protocol.check_message(message, protocol.AGENT_MESSAGES))
