"""A web process's background database work, in threads below the event loop's CPU priority
(docs/architecture.md, "Gateway rules": nothing blocks the event loop).

The watcher's refresh (several ORM queries, five times a second), the usage writer and the
heartbeat and report flushes run in worker threads so that the event loop never waits on the
database. But they still take the CPU: a web process pinned to one core (or a busy machine)
time-slices them with the loop, and a request that arrives during a refresh waited for it —
4 to 8 ms every 0.2 s, the whole of the one-client p99 above the bare stack (issue 20,
``bench/gateway.py``). In threads at ``nice`` +:data:`NICE` (Linux schedules threads on
their own), the loop runs first whenever both want the core, and the refresh uses what the
loop leaves; the GIL still passes between them at Python's switch interval.

Request-path work (a budget read, a key not yet in memory, health checks) does not run here:
it is awaited by a client.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from asgiref.sync import sync_to_async

log = logging.getLogger(__name__)

#: How much lower than the event loop the background threads run (``nice`` steps, 1-19).
NICE = 10
#: Background calls that may run at once (the watcher's steps run one after another; the
#: usage writer beside them; room for a database that hangs).
MAX_THREADS = 4

R = TypeVar("R")


def _lower_priority() -> None:
    """Run in each background thread as it starts: its own scheduling priority, lowered by
    :data:`NICE` (the process and its other threads keep theirs). Where the system has no
    per-thread priority (not Linux), the thread runs at the process's."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICE))
    except (AttributeError, OSError) as exc:  # pragma: no cover (not Linux)
        log.debug("background thread keeps the process's priority: %s", exc)


_executor = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="llmgw-background",
                               initializer=_lower_priority)


def in_background(func: Callable[..., R]) -> Callable[..., Coroutine[Any, Any, R]]:
    """``func`` (blocking: the ORM) as a coroutine function run in a background thread, as
    ``sync_to_async(func, thread_sensitive=False)`` runs it, at lower priority."""
    return sync_to_async(func, thread_sensitive=False, executor=_executor)
