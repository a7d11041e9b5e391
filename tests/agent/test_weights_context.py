"""The agent reads the context length from a replica's GGUF weights once they are local and
reports it (``weights_context_length``), with a real engine process and no control plane."""

from __future__ import annotations

import struct

import pytest

from fleet.agent import gguf
from fleet.agent.engines import AgentConfig, EngineManager
from fleet.states import ReplicaState as S
from tests.agent.test_engines import spec, wait_state

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def manager(tmp_path):
    config = AgentConfig(state_dir=tmp_path / "agent", port_min=21300, port_max=21399, stop_grace_s=1,
                         readiness_poll_s=0.05)
    m = EngineManager(config, on_change=lambda: None)
    yield m
    await m.stop_all()
    await m.close()


def gguf_file(path, context_length: int):
    def s(text):
        return struct.pack("<Q", len(text)) + text.encode()
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2)
                     + s("general.architecture") + struct.pack("<I", gguf.STRING) + s("llama")
                     + s("llama.context_length") + struct.pack("<II", gguf.UINT32, context_length))
    return path


async def test_a_replica_whose_weights_are_gguf_reports_their_context_length(manager, tmp_path):
    weights = gguf_file(tmp_path / "tiny.gguf", 4096)
    with_gguf = {**spec(1, tmp_path / "not-broken"), "weights": f"file:{weights}"}
    manager.apply([with_gguf, spec(2, tmp_path / "not-broken")])
    await wait_state(manager, 1, S.READY)
    await wait_state(manager, 2, S.READY)
    by_id = {r["replica_id"]: r for r in manager.reports()}
    assert by_id[1]["weights_context_length"] == 4096
    assert "weights_context_length" not in by_id[2]  # /dev/null: unknown, not sent
