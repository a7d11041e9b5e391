"""Output helpers for the CLI: tables for people (rich), JSON for scripts, times to the
second and sentences for empty lists."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table

#: Exit codes scripts can rely on.
OK, FAILED, USAGE, NO_SYSTEMD = 0, 1, 2, 3


def console(stdout) -> Console:
    return Console(file=stdout, highlight=False, soft_wrap=True, width=120)


def table(title: str, columns: list[str], rows: list[list], no_wrap: tuple[str, ...] = ()) -> Table:
    """A table for people; the columns named in ``no_wrap`` keep each cell on one line
    (a health word split over two reads as two values)."""
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in columns:
        t.add_column(column, no_wrap=column in no_wrap)
    for row in rows:
        t.add_row(*["" if v is None else str(v) for v in row])
    return t


def print_table(out: Console, title: str, columns: list[str], rows: list[list], empty: str,
                no_wrap: tuple[str, ...] = ()) -> None:
    """Print a table, or for no rows the sentence ``empty`` (a header over nothing reads as
    output that broke): ``"no agents registered yet: …"``."""
    if rows:
        out.print(table(title, columns, rows, no_wrap))
    else:
        out.print(f"{title}: {empty}", markup=False)


def when(value: datetime | str | None, none: str = "—") -> str:
    """An instant for people, to the second, in UTC: ``2026-12-04 18:23:33 UTC``. Takes an
    aware datetime or an ISO 8601 string (a naive one is read as UTC); ``none`` for None or
    ""."""
    if value is None or value == "":
        return none
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def duration(seconds: float) -> str:
    """Seconds as a person reads them, to the second under an hour: ``0 s``, ``42 s``,
    ``3 min 12 s``, ``2 h 5 min``, ``3 d 4 h``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min" + (f" {s % 60} s" if s % 60 else "")
    if s < 86400:
        return f"{s // 3600} h" + (f" {s % 3600 // 60} min" if s % 3600 // 60 else "")
    return f"{s // 86400} d" + (f" {s % 86400 // 3600} h" if s % 86400 // 3600 else "")


def write_json(stdout, data) -> None:
    stdout.write(json.dumps(data, indent=2, default=str) + "\n")
