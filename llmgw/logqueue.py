"""Log lines written by a thread, not by the event loop (issue 20: no stall over 20 ms).

A web process logs from its event loop — uvicorn's access line for every request under
``llmgw up``, the gateway's warnings — and a ``StreamHandler`` writes to a pipe or a terminal:
a reader that falls behind (a full pipe, a slow terminal, a disk) would block the loop, and
every request with it. :func:`install` puts each handler behind a :class:`Deferred` one that
applies its filters and level where the record is made (so what is dropped is dropped at
once, as before) and queues the record; one daemon thread formats and writes them in order.
At exit the queue is drained (``atexit``), so no line is lost on a clean shutdown.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading

_queue: queue.SimpleQueue | None = None
_thread: threading.Thread | None = None


class Deferred(logging.Handler):
    """Stands for ``target`` on its loggers: its level and filters (moved here) are applied
    by the caller; the record is handed to the writer thread, which calls
    ``target.handle(record)``."""

    def __init__(self, target: logging.Handler, out: queue.SimpleQueue) -> None:
        super().__init__(target.level)
        self.target = target
        self.out = out
        self.filters, target.filters = list(target.filters), []

    def emit(self, record: logging.LogRecord) -> None:
        self.out.put((self.target, record))

    def __repr__(self) -> str:
        return f"<Deferred {self.target!r}>"


def _write(out: queue.SimpleQueue) -> None:
    while True:
        target, record = out.get()
        if target is None:
            return
        try:
            target.handle(record)
        except Exception:  # noqa: BLE001 (as Handler.handleError: one bad line never stops the writer)
            target.handleError(record)


def install() -> None:
    """Put every handler of the root logger and of any logger that has its own (Django's
    ``LOGGING``, uvicorn's access and error loggers) behind a :class:`Deferred` one, and
    start the writer thread. Idempotent: handlers already deferred stay as they are."""
    global _queue, _thread
    if _queue is None:
        _queue = queue.SimpleQueue()
        _thread = threading.Thread(target=_write, args=(_queue,), name="llmgw-log-writer", daemon=True)
        _thread.start()
        atexit.register(drain)
    loggers = [logging.getLogger()] + [logger for logger in list(logging.Logger.manager.loggerDict.values())
                                       if isinstance(logger, logging.Logger) and logger.handlers]
    for logger in loggers:
        logger.handlers = [h if isinstance(h, Deferred) else Deferred(h, _queue) for h in logger.handlers]


def drain(timeout_s: float | None = 5.0) -> None:
    """Give every logger its own handlers back, write what is queued and stop the writer
    thread (at exit; tests); ``timeout_s`` None waits until every queued line is written."""
    global _queue, _thread
    out, thread = _queue, _thread
    if out is None or thread is None:
        return
    for logger in [logging.getLogger()] + [lg for lg in list(logging.Logger.manager.loggerDict.values())
                                           if isinstance(lg, logging.Logger)]:
        if any(isinstance(h, Deferred) for h in logger.handlers):
            logger.handlers = [_restored(h) if isinstance(h, Deferred) else h for h in logger.handlers]
    _queue = _thread = None
    out.put((None, None))
    thread.join(timeout_s)


def _restored(handler: Deferred) -> logging.Handler:
    handler.target.filters = handler.filters
    return handler.target
