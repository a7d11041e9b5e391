"""What would block the event loop that serves ``/v1/`` (issue 20, "no stall over 20 ms"):
database work runs in worker threads, and the garbage collector never walks the app's
long-lived objects (frozen once it is loaded)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading

import pytest

from gateway import cache  # registers its loader before the first refresh, as the web app does

from llmgw import background

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def gc_restored(monkeypatch):
    import llmgw.asgi
    from llmgw import logqueue

    threshold = gc.get_threshold()
    monkeypatch.setattr(llmgw.asgi, "_gc_settled", False)
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)
    logqueue.drain()


async def test_the_app_freezes_what_it_loaded_once_at_startup(gc_restored):
    from llmgw import asgi

    sent = []
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive():
        return next(messages)

    async def send(message):
        sent.append(message["type"])
        if message["type"] == "lifespan.startup.complete":
            frozen.append(gc.get_freeze_count())
            deferred.append(all(isinstance(h, Deferred) for h in logging.getLogger().handlers))

    from llmgw.logqueue import Deferred

    frozen: list[int] = []
    deferred: list[bool] = []
    await asgi.application({"type": "lifespan"}, receive, send)
    assert deferred == [True]  # while it serves, lines are written by a thread
    # Once shut down, the queue is written out and lines go straight out again (uvicorn
    # re-raises SIGTERM after this: no atexit hook would run).
    assert not any(isinstance(h, Deferred) for h in logging.getLogger().handlers)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert frozen[0] > 10_000  # Django, the libraries and the app: never walked by a collection again
    assert gc.get_threshold()[0] == asgi.GC_YOUNG_THRESHOLD
    before = gc.get_freeze_count()
    asgi.settle_gc()  # once per process: a later call (the first request) changes nothing
    assert gc.get_freeze_count() == before


async def test_the_usage_writer_and_the_watchers_refresh_run_off_the_event_loop(watcher_cleanup, monkeypatch, settings):
    """The database work of a web process — the usage records' batch write and the watcher's
    refresh with the gateway's cache loader — runs in worker threads: the event loop that
    serves ``/v1/`` never waits on a query."""
    from gateway import usage

    loop_thread = threading.current_thread()
    threads: dict[str, threading.Thread] = {}
    write, load = usage._insert, cache.load

    priorities: dict[str, int] = {}

    def priority() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def insert(rows, *args, **kwargs):
        threads["usage"] = threading.current_thread()
        priorities["usage"] = priority()
        return write(rows, *args, **kwargs)

    def loader():
        threads["refresh"] = threading.current_thread()
        priorities["refresh"] = priority()
        return load()

    monkeypatch.setattr(usage, "_insert", insert)
    monkeypatch.setattr(watcher_cleanup, "extra_loaders", [loader])
    settings.LLMGW_USAGE_FLUSH_INTERVAL_S = 0.05
    buffer = usage.UsageBuffer()
    buffer.add(at=None, key_id=None, team_id=None, model_name="offloop", replica_id=None, path="chat/completions",
               status=200, upstream_status=200, stream=False, prompt_tokens=1, completion_tokens=1, ttft_ms=None,
               total_ms=1.0, overhead_ms=None)  # starts its writer task on this loop
    await watcher_cleanup.refresh_now()
    for _ in range(200):
        if "usage" in threads:
            break
        await asyncio.sleep(0.05)
    buffer._task.cancel()
    assert threads["usage"] is not loop_thread and threads["refresh"] is not loop_thread, threads
    # Below the loop's priority: when both want the core, the loop runs first (llmgw/background.py).
    wanted = min(19, priority() + background.NICE)
    assert priorities == {"usage": wanted, "refresh": wanted}, priorities
    assert threads["refresh"].name.startswith("llmgw-background")


def test_log_lines_are_written_by_a_thread_after_the_filters_the_caller_applies(capsys):
    from llmgw import logqueue

    written: list[tuple[str, str]] = []

    class Slow(logging.Handler):
        def emit(self, record):
            written.append((threading.current_thread().name, self.format(record)))

    class NoSecrets(logging.Filter):
        def filter(self, record):
            return "secret" not in record.getMessage()

    logger = logging.getLogger("llmgw.test.logqueue")
    handler = Slow()
    handler.addFilter(NoSecrets())
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logqueue.install()
        deferred = logger.handlers[0]
        assert isinstance(deferred, logqueue.Deferred) and deferred.target is handler
        logger.warning("one %s", "line")
        logger.warning("a secret line")  # dropped by the handler's filter, where it was logged
        logqueue.drain()  # writes what is queued, and gives the logger its handler back
        assert written == [("llmgw-log-writer", "one line")]
        assert logger.handlers == [handler] and len(handler.filters) == 1
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
