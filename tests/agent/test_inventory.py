"""Simulated GPUs (``llmgw agent --fake-gpus``, for tests and demos): what the inventory
reports with them, and what the agent's command line refuses."""

from __future__ import annotations

import pytest

from fleet.agent import inventory
from fleet.agent.inventory import FAKE_GPUS_ENV, parse_fake_gpus, read_inventory
from tests.cli import llmgw


def test_fake_gpus_parse_count_times_mib_in_order_with_nothing_used():
    gpus = parse_fake_gpus("1x81920, 2x24576")
    assert [(g["index"], g["memory_total_mib"], g["memory_used_mib"]) for g in gpus] == [
        (0, 81920, 0), (1, 24576, 0), (2, 24576, 0)]
    assert len({g["uuid"] for g in gpus}) == 3
    assert parse_fake_gpus("") == []


@pytest.mark.parametrize("spec", ["2", "x24576", "2x", "0x1024", "2x-5", "twoxbig"])
def test_fake_gpus_that_do_not_parse_are_refused(spec):
    with pytest.raises(ValueError, match="COUNTxMIB"):
        parse_fake_gpus(spec)


def test_the_inventory_reports_the_simulated_gpus_and_never_asks_the_driver(monkeypatch):
    monkeypatch.setenv(FAKE_GPUS_ENV, "2x24576")
    monkeypatch.setattr(inventory, "read_gpus", lambda: pytest.fail("the driver was asked"))
    report = read_inventory()
    assert [g["memory_total_mib"] for g in report["gpus"]] == [24576, 24576]
    assert report["cpu_cores"] >= 1 and report["memory_mib"] > 0


def test_without_the_option_the_real_gpus_are_reported(monkeypatch):
    monkeypatch.delenv(FAKE_GPUS_ENV, raising=False)
    monkeypatch.setattr(inventory, "read_gpus", lambda: [])
    assert read_inventory()["gpus"] == []


def test_llmgw_agent_refuses_fake_gpus_that_do_not_parse(monkeypatch, capsys):
    monkeypatch.delenv(FAKE_GPUS_ENV, raising=False)
    code, _, _ = llmgw("agent", "--server", "http://127.0.0.1:9", "--token", "t", "--fake-gpus", "lots")
    assert code == 2
    assert "--fake-gpus: fake GPUs 'lots' are not COUNTxMIB" in capsys.readouterr().err
