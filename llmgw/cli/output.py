"""Output helpers for the CLI: tables for people (rich), JSON for scripts."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

#: Exit codes scripts can rely on.
OK, FAILED, USAGE, NO_SYSTEMD = 0, 1, 2, 3


def console(stdout) -> Console:
    return Console(file=stdout, highlight=False, soft_wrap=True, width=120)


def table(title: str, columns: list[str], rows: list[list]) -> Table:
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in columns:
        t.add_column(column)
    for row in rows:
        t.add_row(*["" if v is None else str(v) for v in row])
    return t


def write_json(stdout, data) -> None:
    stdout.write(json.dumps(data, indent=2, default=str) + "\n")
