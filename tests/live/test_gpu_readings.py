"""GPU readings through the agents' websocket (the real ASGI app): a hello's inventory and
the heartbeats' ``gpus`` land on ``Gpu`` rows, and one ``GpuSample`` per GPU is written at
most once per ``LLMGW_GPU_SAMPLE_EVERY_S``; older agents, unknown figures and bad fields."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from fleet import protocol
from fleet.live import consumer
from fleet.models import Agent, Gpu, GpuSample
from llmgw.asgi import application

pytestmark = [pytest.mark.django_db(transaction=True)]


def gpu(index: int, **figures) -> dict:
    entry = {"index": index, "uuid": f"GPU-{index}", "name": "H100", "memory_total_mib": 81559,
             "memory_used_mib": 1000 + index}
    entry.update(figures)
    return entry


def hello(gpus: list[dict]) -> dict:
    return {"type": "hello", "v": protocol.PROTOCOL_VERSION, "name": "gpu-1", "version": "test",
            "address": "10.0.0.5", "inventory": {"gpus": gpus, "cpu_cores": 32, "memory_mib": 256000},
            "replicas": []}


async def connect(name: str = "gpu-1", gpus: list[dict] | None = None):
    agent, token = await sync_to_async(Agent.create_with_token)(name)
    ws = WebsocketCommunicator(application, "/ws/agent/", headers=[(b"authorization", f"Bearer {token}".encode())])
    connected, _ = await ws.connect()
    assert connected
    gpus = gpus if gpus is not None else [gpu(0, utilisation_pct=87, temperature_c=64.5),
                                          gpu(1, utilisation_pct=3, temperature_c=31)]
    await ws.send_json_to(hello(gpus))
    # Not the first assign: the watcher may push one before the hello is recorded.
    await until(lambda: _stored(agent, len(gpus)), "the hello's GPUs to be stored")
    return agent, ws


async def _stored(agent, n: int) -> bool:
    return await Gpu.objects.filter(agent=agent).acount() == n


async def readings(agent) -> list[tuple]:
    return [(g.index, g.memory_used_mib, g.memory_total_mib, g.utilisation_pct, g.temperature_c)
            async for g in Gpu.objects.filter(agent=agent).order_by("index")]


async def samples(agent) -> list[tuple]:
    return [(s.agent_name, s.index, s.memory_used_mib, s.utilisation_pct, s.temperature_c)
            async for s in GpuSample.objects.filter(agent=agent).order_by("at", "index")]


async def until(check, what: str, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def sample_every(settings, monkeypatch):
    settings.LLMGW_GPU_SAMPLE_EVERY_S = 3600.0  # one sample per test unless a test shrinks it
    monkeypatch.setattr(consumer, "GPU_READINGS_EVERY_S", 0.0)  # every heartbeat's readings applied
    return settings


async def test_a_hello_stores_each_gpus_reading_and_one_sample_of_each(watcher_cleanup, sample_every):
    agent, ws = await connect()
    assert await readings(agent) == [(0, 1000, 81559, 87.0, 64.5), (1, 1001, 81559, 3.0, 31.0)]
    assert await samples(agent) == [("gpu-1", 0, 1000, 87.0, 64.5), ("gpu-1", 1, 1001, 3.0, 31.0)]
    await ws.disconnect()


async def test_heartbeat_readings_update_the_gpus_and_are_sampled_at_most_once_per_interval(watcher_cleanup,
                                                                                          sample_every):
    agent, ws = await connect()
    await ws.send_json_to(protocol.heartbeat(gpus=[
        {"index": 0, "memory_used_mib": 50000, "memory_total_mib": 81559, "utilisation_pct": 99,
         "temperature_c": 80},
        {"index": 1, "memory_used_mib": 2000, "memory_total_mib": 81559, "utilisation_pct": 10,
         "temperature_c": 35}]))
    await until(lambda: _first_used(agent, 50000), "the heartbeat's reading on the Gpu row")
    assert await readings(agent) == [(0, 50000, 81559, 99.0, 80.0), (1, 2000, 81559, 10.0, 35.0)]
    assert len(await samples(agent)) == 2  # the hello's: the interval has not passed

    sample_every.LLMGW_GPU_SAMPLE_EVERY_S = 0.2
    await asyncio.sleep(0.3)
    await ws.send_json_to(protocol.heartbeat(gpus=[{"index": 0, "memory_used_mib": 60000, "utilisation_pct": 100,
                                                    "temperature_c": 83}]))
    taken = await until(lambda: _samples_at_least(agent, 3), "a second sample")
    assert taken[-1] == ("gpu-1", 0, 60000, 100.0, 83.0)  # only the GPUs the heartbeat read
    await ws.disconnect()


async def _first_used(agent, used: int) -> bool:
    return (await readings(agent))[0][1] == used


async def _samples_at_least(agent, n: int) -> list | None:
    found = await samples(agent)
    return found if len(found) >= n else None


async def test_unknown_figures_keep_the_last_memory_and_leave_utilisation_and_temperature_unknown(watcher_cleanup,
                                                                                                  sample_every):
    agent, ws = await connect()
    await ws.send_json_to(protocol.heartbeat(gpus=[
        {"index": 0, "memory_used_mib": None, "utilisation_pct": None, "temperature_c": 1e9},
        {"index": 1, "memory_used_mib": 7, "utilisation_pct": 250, "temperature_c": 40},
        {"index": 9, "memory_used_mib": 7, "utilisation_pct": 5}]))  # not in the inventory: skipped
    await until(lambda: _second_used(agent, 7), "the heartbeat applied")
    # Memory unknown keeps the last figure (placement counts on it); out of range is unknown.
    assert await readings(agent) == [(0, 1000, 81559, None, None), (1, 7, 81559, None, 40.0)]
    assert not await Gpu.objects.filter(agent=agent, index=9).aexists()
    await ws.disconnect()


async def _second_used(agent, used: int) -> bool:
    return (await readings(agent))[1][1] == used


async def test_an_older_agent_without_readings_still_works(watcher_cleanup, sample_every):
    agent, ws = await connect(gpus=[{"index": 0, "uuid": "GPU-0", "name": "A100", "memory_total_mib": 40960,
                                     "memory_used_mib": 5}])
    assert await readings(agent) == [(0, 5, 40960, None, None)]
    await ws.send_json_to(protocol.heartbeat(loads=[]))
    answers = []
    while not await ws.receive_nothing(timeout=0.5):
        answers.append(await ws.receive_json_from())
    assert [a for a in answers if a["type"] == "error"] == []  # a bare heartbeat is no error
    assert (await Agent.objects.aget(pk=agent.pk)).connected
    await ws.disconnect()


@pytest.mark.parametrize("gpus, words", [
    ("all", "'gpus' must be a list"),
    ([{"memory_used_mib": 5}], "gpus[]: 'index' is missing"),
    ([{"index": 0, "utilisation_pct": "high"}], "gpus[]: 'utilisation_pct' must be a number or null"),
    ([{"index": 0, "memory_used_mib": 1.5}], "gpus[]: 'memory_used_mib' must be an integer or null"),
    ([7], "every GPU reading must be an object"),
])
async def test_a_bad_reading_is_answered_and_nothing_of_it_is_stored(watcher_cleanup, sample_every, gpus, words):
    agent, ws = await connect()
    before = await readings(agent)
    await ws.send_json_to({"type": "heartbeat", "v": protocol.PROTOCOL_VERSION, "gpus": gpus})
    reply = await ws.receive_json_from(timeout=10)
    while reply["type"] == "assign":  # the watcher may push one meanwhile
        reply = await ws.receive_json_from(timeout=10)
    assert reply["type"] == "error" and words in reply["message"], reply
    assert await readings(agent) == before
    await ws.disconnect()


async def test_figures_no_float_holds_or_more_used_than_there_is_are_not_readings(watcher_cleanup, sample_every):
    """A hostile or broken agent: an integer of 400 digits is unknown, not an error that
    stops the hello half-recorded; more memory used than the GPU has keeps the last figure."""
    huge = int("9" * 400)
    agent, ws = await connect(gpus=[gpu(0, utilisation_pct=huge, temperature_c=huge),
                                    gpu(1, memory_used_mib=2_000_000_000, memory_total_mib=100)])
    assert await readings(agent) == [(0, 1000, 81559, None, None), (1, 0, 100, None, None)]
    await ws.send_json_to(protocol.heartbeat(gpus=[{"index": 0, "memory_used_mib": 90000, "utilisation_pct": huge},
                                                   {"index": 1, "memory_used_mib": 60, "temperature_c": huge}]))
    await until(lambda: _second_used(agent, 60), "the heartbeat applied")
    assert await readings(agent) == [(0, 1000, 81559, None, None), (1, 60, 100, None, None)]
    await ws.send_json_to({"type": "status", "v": protocol.PROTOCOL_VERSION, "replicas": []})
    assert await ws.receive_nothing(0.3) or True  # the session lives on
    assert (await Agent.objects.aget(pk=agent.pk)).connected
    await ws.disconnect()


async def test_an_agent_sending_readings_fast_gets_no_more_writes(watcher_cleanup, sample_every, monkeypatch):
    monkeypatch.setattr(consumer, "GPU_READINGS_EVERY_S", 3600.0)
    agent, ws = await connect()
    for used in (50000, 51000, 52000):
        await ws.send_json_to(protocol.heartbeat(gpus=[{"index": 0, "memory_used_mib": used}]))
    await until(lambda: _first_used(agent, 50000), "the first heartbeat's reading")
    await asyncio.sleep(0.5)  # the later two were read and skipped, not queued
    assert (await readings(agent))[0][1] == 50000
    await ws.disconnect()
