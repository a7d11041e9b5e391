"""The data directory (``LLMGW_DATA_DIR``) and the files llmgw keeps in it, private to the
user llmgw runs as (docs/architecture.md, "Security": data directory): the directory is 0700,
its files 0600 — the secret key, the admin password, the demo API key, the metrics token, the
SQLite database with its ``-wal``/``-shm``, the local agent's state and logs.

Imported by the settings, before Django is set up: no Django imports here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: Bits nobody but the owner may have on what llmgw writes.
PRIVATE_UMASK = 0o077


def restrict_umask() -> None:
    """Add ``PRIVATE_UMASK`` to this process's umask, so every file and directory it (and
    any child, engines included) creates is private whatever the caller's umask was."""
    os.umask(os.umask(PRIVATE_UMASK) | PRIVATE_UMASK)


def tighten(path: Path) -> str | None:
    """Remove group and other permissions from ``path`` (a file or directory) if it has
    any; returns a sentence saying what changed, or None. Links are left alone."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode) or not info.st_mode & 0o077:
        return None
    old = stat.S_IMODE(info.st_mode)
    new = 0o700 if stat.S_ISDIR(info.st_mode) else old & 0o700 or 0o600
    os.chmod(path, new)
    return f"{path}: mode {old:04o} -> {new:04o}"


def prepare(data_dir: Path, extra_files: tuple[Path, ...] = ()) -> list[str]:
    """Create ``data_dir`` (0700) or tighten an existing one and the entries directly in
    it, plus ``extra_files`` that live elsewhere (a SQLite database outside it, with its
    ``-wal``/``-shm``). Returns what was tightened, one sentence each, for a log line."""
    changed = []
    if not data_dir.exists():
        data_dir.mkdir(parents=True, mode=0o700)
    for path in [data_dir, *sorted(data_dir.iterdir()), *extra_files]:
        note = tighten(path)
        if note:
            changed.append(note)
    return changed


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as a 0600 file (created so, never readable by others
    even for an instant; an existing file is tightened first)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
