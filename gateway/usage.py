"""Usage records: kept in memory per request, written in batches, flushed at exit.

One writer task per web process (started lazily: daphne has no ASGI lifespan) writes the
buffer every ``LLMGW_USAGE_FLUSH_INTERVAL``; an ``atexit`` hook writes what is left when
the process shuts down on SIGTERM, so nothing is lost (SIGKILL loses what is in memory).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import IntegrityError, InterfaceError, OperationalError, close_old_connections, transaction

from gateway.models import ApiKey, UsageRecord

#: Records kept in memory while the database is unreachable (about 300 bytes each).
MAX_BUFFERED_ROWS = 200_000

log = logging.getLogger(__name__)


class UsageBuffer:
    def __init__(self) -> None:
        self._rows: list[dict] = []
        self._lock = threading.Lock()
        self._task: asyncio.Task | None = None
        self._atexit = False

    def add(self, **fields) -> None:
        with self._lock:
            self._rows.append(fields)
        self._ensure_writer()

    def _ensure_writer(self) -> None:
        if not self._atexit:
            atexit.register(self.flush)
            self._atexit = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._writer())

    async def _writer(self) -> None:
        while True:
            await asyncio.sleep(settings.LLMGW_USAGE_FLUSH_INTERVAL_S)
            try:
                await sync_to_async(self.flush, thread_sensitive=False)()
            except Exception:
                log.exception("could not write usage records; keeping them for the next try")

    def take(self) -> list[dict]:
        with self._lock:
            rows, self._rows = self._rows, []
        return rows

    def flush(self) -> int:
        """Write buffered records now; returns how many. If the database is unreachable
        they go back (up to ``MAX_BUFFERED_ROWS``, oldest dropped first); a row the
        database refuses for its values is dropped with a warning — never the batch."""
        rows = self.take()
        if not rows:
            return 0
        close_old_connections()
        try:
            with transaction.atomic():  # all or nothing: a retry must not write a row twice
                UsageRecord.objects.bulk_create([UsageRecord(**row) for row in rows], batch_size=500)
        except IntegrityError:
            # A key deleted since the request: keep the record, without the key.
            live = set(ApiKey.objects.filter(pk__in={r["key_id"] for r in rows if r.get("key_id")})
                       .values_list("pk", flat=True))
            for row in rows:
                if row.get("key_id") not in live:
                    row["key_id"] = None
            return self._write_each(rows)
        except (OperationalError, InterfaceError):
            self._put_back(rows)
            raise
        except Exception:  # a bad value in some row: write the others
            return self._write_each(rows)
        return len(rows)

    def _write_each(self, rows: list[dict]) -> int:
        written = 0
        for i, row in enumerate(rows):
            try:
                UsageRecord.objects.create(**row)
                written += 1
            except (OperationalError, InterfaceError):
                self._put_back(rows[i:])
                raise
            except Exception as exc:  # noqa: BLE001 (one bad row must not block the rest)
                log.warning("dropped a usage record the database refused (%s): %s", exc, row)
        return written

    def _put_back(self, rows: list[dict]) -> None:
        with self._lock:
            self._rows = rows + self._rows
            extra = len(self._rows) - MAX_BUFFERED_ROWS
            if extra > 0:
                del self._rows[:extra]
                log.warning("usage buffer full while the database is away: dropped the %d oldest records", extra)


usage_records = UsageBuffer()
