"""The end of a benchmark run, shared by the scripts that start real processes: no second
Ctrl-C cutting the cleanup short, and the processes' logs shown (and kept) when it failed."""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path


def shield_cleanup() -> None:
    """Ignore SIGINT/SIGTERM from here on: the processes started must still be stopped."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def finish_logs(tmp: Path, ok: bool, keep: bool) -> None:
    """On failure print the tail of every ``*.log`` in ``tmp``; keep ``tmp`` if asked or
    on failure, else delete it."""
    if not ok:
        for log in sorted(tmp.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
    if keep or not ok:
        print(f"logs kept in {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
