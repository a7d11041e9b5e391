"""Shared fixtures: catalog rows, a running watcher cleaned up after each async test, and a
log directory for real processes."""

from __future__ import annotations

import pytest

from catalog.models import ClusterSettings, Model, Profile


@pytest.fixture
def log_dir(tmp_path):
    path = tmp_path / "logs"
    path.mkdir()
    return path


@pytest.fixture
def cpu_profile(db):
    profile = Profile(name="fake-cpu", engine=Profile.Engine.CUSTOM,
                      command="{python} tests/fake_engine.py --port {port} --served-name {served_name}",
                      gpus_needed=0, cpu_cores=1, memory_mib=128, readiness_path="/v1/models",
                      startup_timeout_s=30)
    profile.full_clean()
    profile.save()
    return profile


@pytest.fixture
def make_model(cpu_profile):
    def make(name="fake-model", **kw):
        kw.setdefault("weights", "file:/dev/null")
        kw.setdefault("profile", cpu_profile)
        kw.setdefault("min_replicas", 1)
        kw.setdefault("max_replicas", max(1, kw["min_replicas"]))
        m = Model(name=name, **kw)
        m.full_clean()
        m.save()
        return m
    return make


@pytest.fixture
def cluster(db):
    return ClusterSettings.get_solo()


@pytest.fixture
async def watcher_cleanup():
    from fleet.live import watcher

    yield watcher
    await watcher.stop()
    watcher.agents.clear()
