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

from llmgw.background import in_background
from django.conf import settings
from django.db import (IntegrityError, InterfaceError, OperationalError, close_old_connections, connections, router,
                       transaction)

from django.utils import timezone

from gateway import metrics
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
        """Buffer one request's record (``UsageRecord``'s fields) and count its tokens on
        ``/metrics`` (``gateway.metrics.TOKENS``)."""
        metrics.TOKENS.add(fields.get("model_name", ""), fields.get("team_id"), fields.get("key_id"),
                           fields.get("prompt_tokens"), fields.get("completion_tokens"))
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
                await in_background(self.flush)()
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
                _insert(rows)
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


#: The Python types :func:`_insert` writes as they are, by field type: any other value (a
#: provider's "abc" for a count) raises, and the batch is written row by row through the ORM.
_KINDS = {"PositiveIntegerField": (int,), "PositiveSmallIntegerField": (int,), "IntegerField": (int,),
          "ForeignKey": (int,), "FloatField": (float, int), "CharField": (str,), "BooleanField": (bool,)}


def _insert(rows: list[dict], batch_size: int = 500) -> None:
    """Insert ``rows`` (``UsageRecord``'s fields by attribute name, as :meth:`UsageBuffer.add`
    takes them; a field left out takes its default) with one ``executemany`` per batch: the
    statement once, values as the driver takes them (only ``at`` is adapted) — not a model
    instance and a compiled statement per row (``bulk_create`` cost more CPU per request
    than the rest of the write). Raises what the database raises (a value out of range:
    the caller writes row by row)."""
    connection = connections[router.db_for_write(UsageRecord)]
    fields = [f for f in UsageRecord._meta.concrete_fields if not f.primary_key]
    quote = connection.ops.quote_name
    sql = (f"INSERT INTO {quote(UsageRecord._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
           f"VALUES ({', '.join(['%s'] * len(fields))})")
    defaults = {f.attname: f.get_default() for f in fields if f.attname != "at"}
    adapt_at = connection.ops.adapt_datetimefield_value
    names = [f.attname for f in fields]
    at = names.index("at")
    params = []
    kinds = [_KINDS.get(f.get_internal_type(), ()) for f in fields]
    for row in rows:
        values = [row[name] if name in row else defaults.get(name) for name in names]
        for value, kind, field in zip(values, kinds, fields):
            if value is None:
                if not field.null and field.attname != "at":
                    raise ValueError(f"usage record: {field.attname} may not be null")
            elif kind and type(value) not in kind:
                raise ValueError(f"usage record: {field.attname}={value!r} is not a {field.get_internal_type()}")
        values[at] = adapt_at(row["at"] if row.get("at") is not None else timezone.now())
        params.append(values)
    with connection.cursor() as cursor:
        for start in range(0, len(params), batch_size):
            cursor.executemany(sql, params[start:start + batch_size])


usage_records = UsageBuffer()
