"""The gateway's database questions, asked as Django asks them for a request.

A warm ``/v1/`` request touches no database (its keys, models and routes are in memory:
``gateway.cache``, ``fleet.live``), so the lean handler (``llmgw/asgi.py``) runs Django's
``request_started``/``request_finished`` receivers — which close a connection that is
obsolete or broken — at most once a second, not around every request. The few paths that do
ask the database (a key or a model not in memory yet, ``/v1/models``, an on-demand model
wanted) call :func:`database_checked` first: the connection of the shared sync thread, where
Django's async ORM runs, is checked (closed if past ``CONN_MAX_AGE`` — at once by default — or
unusable), so a PostgreSQL restart since its last use costs a reconnect, not a 503.
"""

from __future__ import annotations

import logging

from asgiref.sync import sync_to_async
from django.db import connections

log = logging.getLogger(__name__)


def close_old_connections() -> None:
    """Django's ``close_old_connections`` for the connections of this thread that are not
    inside a transaction: one in an ``atomic`` block is the caller's (a test's transaction,
    under Django's test clients, which disconnect the signal's receiver for that reason);
    closing it would end that transaction.

    Never raises: the check only tidies up, so a failure of its own (closing a connection
    already broken) leaves the question that follows to meet the database as it is — a
    503 then, as before, never the question skipped."""
    for conn in connections.all(initialized_only=True):
        if conn.in_atomic_block:
            continue
        try:
            conn.close_if_unusable_or_obsolete()
        except Exception as exc:  # noqa: BLE001 (see above)
            log.debug("could not check the database connection %r: %s", conn.alias, exc)


async def database_checked() -> None:
    """``close_old_connections()`` in the shared sync thread (the thread of the async ORM's
    queries and of ``sync_to_async`` calls that are thread-sensitive), as Django's
    ``request_started`` would have run it for this request. Blocking work only in that
    thread; about 0.1 ms."""
    await sync_to_async(close_old_connections)()


def checked(blocking):
    """``blocking`` (a sync function that queries the database) preceded by
    ``close_old_connections()`` in whichever thread it runs — for a call through
    ``sync_to_async``."""

    def run(*args, **kwargs):
        close_old_connections()
        return blocking(*args, **kwargs)

    run.__name__ = getattr(blocking, "__name__", "checked")
    run.__doc__ = blocking.__doc__
    return run
