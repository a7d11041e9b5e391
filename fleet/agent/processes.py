"""Engine processes as the kernel sees them, and the agent's state file that remembers them
(docs/architecture.md, "Agent protocol": on the machine; "Decisions": restarts keep engines
serving, no orphan engines).

A process is named by its pid *and* its start time (field 22 of /proc/PID/stat), so a pid
reused by another program is never taken for an engine. Each engine leads a process group
of its own (its pgid is its pid); it is gone when that group is empty.

The state file (``engines.json``, mode 0600: specs hold engine keys) lists every engine
process the agent started and has not yet seen gone, one record each::

    {"v": 2, "engines": [{"pid": 4711, "start_time": "123456", "replica_id": 12,
                          "host": "10.0.0.5", "port": 20002, "served_name": "m",
                          "spec": {...AssignedReplica...}, "log_path": "...",
                          "started_at": 1764600000.5, "stopping": false}]}

``started_at`` is wall-clock seconds (a restarted agent resumes the startup timeout from it);
``stopping`` is true once the agent began stopping it (a restarted agent finishes the stop).
Version 1 files (a dict by replica id, from older agents) are read too.

One agent process at a time uses a state directory (:func:`hold_state_dir`): a second one
would overwrite the first's state file, and the control plane talks to one socket of an
agent only, so the engines the other started would run on with nobody telling them to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
from pathlib import Path

STATE_VERSION = 2


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/PID/stat), or None if gone.
    With the pid it identifies a process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            data = fh.read()
    except OSError:
        return None
    return data.rsplit(")", 1)[1].split()[19]


def process_alive(pid: int, start_time: str | None) -> bool:
    """True if ``pid`` is the process that started at ``start_time`` and has not exited. An
    adopted engine is still our child after an in-place restart (exec keeps the pid): once
    it exits it is a zombie until reaped, so zombies are reaped and count as dead."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    if fields[19] != start_time:
        return False
    if fields[0] in ("Z", "X"):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


async def wait_exit(pid: int, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds for ``pid`` to exit; True as soon as it has (or is
    gone already), False on timeout. Uses a pidfd (Linux 5.3+), which becomes readable the
    moment the process exits, child or not (an adopted engine too), so the agent reports a
    dead engine within milliseconds instead of at its next poll — the window in which a
    process that takes the dead engine's port could be sent requests (docs/architecture.md,
    "Decisions": readiness proves identity). Without pidfds it simply sleeps ``timeout_s``
    and returns False; the caller's own liveness check then decides."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):
        await asyncio.sleep(timeout_s)
        return False
    loop = asyncio.get_running_loop()
    exited = loop.create_future()
    try:
        loop.add_reader(fd, lambda: exited.done() or exited.set_result(True))
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: it can drop a cancel (gh-86296)
                return await exited
        except asyncio.TimeoutError:
            return False
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


def reap_children() -> None:
    """Collect exited children so their pids are not mistaken for live engines."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_group(pid: int, sig: int) -> None:
    """``sig`` to process group ``pid`` (an engine's), ignoring a group already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def group_gone(pid: int, start_time: str | None) -> bool:
    """Whether the engine that started as ``pid`` at ``start_time`` and every process of its
    group are gone: exited, zombies included. Linux does not reuse a number still in use as
    a process group, so a pid now held by another process means the old group is empty.

    A zombie holds no memory, GPU or socket, and an adopted engine's zombie is not ours to
    reap: after the agent was killed its engines are init's children, and init reaps when it
    gets to it (over a second in some containers, never under a PID 1 that does not reap).
    Waiting for that reaping held the engine's report — failed, or stopped — as long."""
    if process_alive(pid, start_time):
        return False
    now = process_start_time(pid)
    if now is not None and now != start_time:
        return True  # the number was free for reuse: nothing of the old group is left
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return True  # not ours to signal: not our engine's group
    return group_live_members(pid) == 0  # members left: only zombies? (unknown without /proc: not gone)


def group_live_members(pgid: int) -> int | None:
    """How many processes of group ``pgid`` have not exited (zombies do not count), from
    /proc; None where /proc cannot be listed."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    live = 0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            live += 1
    return live


def kill_leftovers(pid: int, start_time: str | None) -> None:
    """SIGKILL what is left of a dead engine's group (its workers): when the pid names no
    process, or still the engine itself as a zombie nobody has reaped yet. Not when the pid
    now names another process (then the old group is already empty: :func:`group_gone`)."""
    now = process_start_time(pid)
    if now is None or (now == start_time and not process_alive(pid, start_time)):
        kill_group(pid, signal.SIGKILL)


def write_state(path: Path, records: list[dict]) -> None:
    """Write ``records`` (the module docstring's shape) to ``path`` atomically, mode 0600
    from the start (the specs hold the engine keys)."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps({"v": STATE_VERSION, "engines": records}))
    os.chmod(tmp, 0o600)  # a file left by an older agent keeps its mode otherwise
    tmp.replace(path)


def read_state(path: Path) -> list[dict]:
    """The records of the state file at ``path`` (version 2, or version 1 converted: it
    listed the engines held, none stopping); [] if there is none or it cannot be read.
    Records without a pid or a spec are left out."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict):
        return []
    if data.get("v") == STATE_VERSION:
        records = data.get("engines") if isinstance(data.get("engines"), list) else []
    else:
        records = []
        for key, item in data.items():
            if isinstance(item, dict):
                with contextlib.suppress(ValueError):
                    records.append({**item, "replica_id": int(key), "stopping": False})
    return [r for r in records if isinstance(r, dict) and isinstance(r.get("pid"), int)
            and isinstance(r.get("spec"), dict)]


#: The lock file in an agent's state directory (:func:`hold_state_dir`); it holds the pid.
LOCK_FILE = "agent.lock"


class StateDirInUse(RuntimeError):
    """Another live agent process holds the state directory."""


def hold_state_dir(state_dir: Path) -> int:
    """Take ``state_dir`` (created, mode 0700, if absent) for this agent process: an exclusive
    ``flock`` on its ``agent.lock``, which records this pid. Returns the lock's fd; the lock
    lasts until the process exits or the fd is closed. The fd is not inherited (engines
    never hold it) and closes on exec, so an agent re-executing itself in place takes it
    again. Raises StateDirInUse, naming the holder's pid, while another process holds it."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StateDirInUse(f"another agent (pid {holder}) uses the state directory {state_dir}: run one agent per "
                            "state directory (--state-dir), or stop the other first") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
