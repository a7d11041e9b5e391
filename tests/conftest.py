"""Shared fixtures: catalog rows, a running watcher cleaned up after each async test, and a
log directory for real processes."""

from __future__ import annotations

import pytest
import pytest_django.fixtures

from catalog.models import ClusterSettings, Model, Profile


_databases_for_setup = pytest_django.fixtures._get_databases_for_setup


def _always_the_default_database(items):
    """Modules that run a live cluster use the test database from module fixtures (their
    processes share it), without a django_db mark: per-test flushes would pull rows from
    under running processes. pytest-django only creates databases that marked tests need,
    so always ask for the default one."""
    aliases, serialized = _databases_for_setup(items)
    return set(aliases) | {"default"}, serialized


pytest_django.fixtures._get_databases_for_setup = _always_the_default_database


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database, whose PostgreSQL sessions left by this process's
    threads (the watcher's, the async ORM's) are ended before it is dropped: PostgreSQL
    refuses to drop a database in use."""
    yield
    from django.db import connection

    if connection.vendor == "postgresql":
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")


@pytest.fixture
def log_dir(tmp_path):
    path = tmp_path / "logs"
    path.mkdir()
    return path


@pytest.fixture
def cpu_profile(db):
    profile = Profile(name="fake-cpu", engine=Profile.Engine.CUSTOM,
                      command="{python} tests/fake_engine.py --host {host} --port {port} --served-name {served_name}"
                              " --api-key {api_key}",
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
    from fleet.live.watch import watcher

    yield watcher
    await watcher.stop()
    watcher.agents.clear()
    watcher.consumers.clear()


def _refuse_exec(name: str):
    def refused(*args, **kwargs):
        raise RuntimeError(f"a test called os.{name}{args[:2]!r}: it would replace the test process (pytest) "
                           "with another program; monkeypatch it in the test")
    return refused


@pytest.fixture(autouse=True)
def no_exec_in_the_test_process(monkeypatch):
    """``llmgw web`` and ``llmgw up`` end in ``os.execve``: a test that forgot to replace it
    turned pytest into uvicorn, which then died of the test's timeout alarm (its SIGALRM
    timer survives exec, its handler does not) and ended the whole run. Every ``os.exec*``
    raises here instead; a test replaces the one it expects. (subprocess does not use them.)"""
    import os

    for name in ("execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe"):
        monkeypatch.setattr(os, name, _refuse_exec(name))


@pytest.fixture(autouse=True)
def fresh_login_counters(monkeypatch):
    """Failed-login counters (llmgw.auth_throttle) of their own for each test, so one
    test's failures never throttle the next one's logins. A new key prefix, not
    ``cache.clear()``: on Redis that would flush the whole database other runs share."""
    import uuid

    from llmgw import auth_throttle

    monkeypatch.setattr(auth_throttle, "KEY", f"llmgw:auth-failures:test-{uuid.uuid4().hex[:12]}")


@pytest.fixture(autouse=True)
def fresh_channel_layer():
    """A new channel layer object for each test. channels keeps one per process, but each
    async test runs in an event loop of its own, and channels_redis's layer holds loop-bound
    state (its receive lock and buffers): a consumer cancelled with one test's loop could
    leave the next test's loop waiting forever when it closes."""
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def _flush_with_retries(original):
    """On PostgreSQL, the TRUNCATE that ends a transactional test can deadlock with a live
    server process writing at that moment (usage records, heartbeats); PostgreSQL then
    aborts one side. Retry the flush a few times instead of failing the next test."""
    import time

    from django.core.management.base import CommandError
    from django.db import OperationalError

    def teardown(self):
        for attempt in range(5):
            try:
                return original(self)
            except (CommandError, OperationalError) as exc:
                if "deadlock" not in str(exc.__cause__ or exc).lower() and "deadlock" not in str(exc).lower():
                    raise
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    return teardown


from django.test.testcases import TransactionTestCase  # noqa: E402

TransactionTestCase._fixture_teardown = _flush_with_retries(TransactionTestCase._fixture_teardown)
