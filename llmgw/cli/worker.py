"""``llmgw worker``: this machine's worker — django-q2's task cluster (requested passes, the
watchdog, retention) and, in this process beside it, the leader loop that runs the passes
on the cadence while this worker holds the leader lease (``fleet.control.leader``).

What the systemd worker unit and ``llmgw up`` run. SIGTERM or SIGINT: the lease is given
up at once (a standby leads within a renewal), the task cluster gets
``LLMGW_WORKER_STOP_GRACE`` to finish its tasks, and whatever is left of it is then killed,
so the process exits within the grace whatever a task is doing.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

from django.conf import settings
from django.db import connections
from django_q.cluster import Cluster

from fleet.control.leader import LeaderLoop
from llmgw.cli.output import FAILED, OK

HELP = ("Run this machine's worker in the foreground: django-q2's task cluster plus the leader loop "
        "(one worker of the cluster leads and runs the reconcile passes; the others stand by and take "
        "over within seconds). SIGTERM stops it within LLMGW_WORKER_STOP_GRACE. Used by the systemd "
        "worker unit and `llmgw up`.")

log = logging.getLogger("llmgw.worker")


def add_arguments(parser) -> None:
    pass


def run(options, stdout, stderr) -> int:
    """Start the task cluster, lead or stand by until a signal (or the cluster's death),
    then stop within the grace. Exit 0 when stopped by a signal, 1 when the task cluster
    died on its own."""
    stop, signalled = threading.Event(), threading.Event()
    signalled_at = [0.0]

    def on_signal(signum, frame) -> None:
        if not signalled.is_set():
            signalled_at[0] = time.monotonic()
        signalled.set()
        stop.set()

    # The sentinel is forked next: it must not inherit this process's database connections
    # (closing a shared one in the child would end it for the parent too).
    connections.close_all()
    cluster = Cluster()
    for sig in (signal.SIGTERM, signal.SIGINT):  # after Cluster(), which installs its own
        signal.signal(sig, on_signal)
    cluster.start()
    stdout.write(f"llmgw worker: task cluster {cluster.name} running; leader loop started\n")
    stdout.flush()
    LeaderLoop().run(stop, alive=cluster.sentinel.is_alive)
    # Under systemd the whole group gets SIGTERM, the sentinel too: that is no failure.
    died = not cluster.sentinel.is_alive() and not signalled.is_set()
    # One grace in all, counted from the signal: a pass under way had some of it already.
    grace_s = settings.LLMGW_WORKER_STOP_GRACE_S
    left_s = grace_s - (time.monotonic() - signalled_at[0]) if signalled.is_set() else grace_s
    stopped_in_s = stop_cluster(cluster, max(0.5, left_s))
    if died:
        stderr.write(f"llmgw worker: the task cluster exited (code {cluster.sentinel.exitcode}); stopping\n")
        return FAILED
    stdout.write(f"llmgw worker: stopped in {stopped_in_s:.1f} s (lease released)\n")
    return OK


def stop_cluster(cluster: Cluster, grace_s: float) -> float:
    """Ask the task cluster to stop (its workers finish their current task), wait up to
    ``grace_s`` seconds, then SIGKILL whatever is left of it: the sentinel and every
    process under it, and forks of this process a dead sentinel left behind
    (``leftover_forks``). Returns the seconds it took."""
    started = time.monotonic()
    sentinel = cluster.sentinel
    if sentinel.is_alive():
        cluster.stop_event.set()
        sentinel.join(grace_s)
    left = sorted(({sentinel.pid, *descendants(sentinel.pid)} if sentinel.is_alive() else set())
                  | set(leftover_forks()))
    if left:
        log.warning("task cluster still running after %.1f s: killing %s", time.monotonic() - started, left)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        sentinel.join(5)
    return time.monotonic() - started


def leftover_forks() -> list[int]:
    """Processes of this process group, other than this one, running this very command
    line: forks of this process (django-q2's sentinel forks its pusher, monitor and task
    processes without exec) that outlived a dead sentinel. Other members of the group
    (a shell's pipeline) run other commands and are left alone."""
    me, group = os.getpid(), os.getpgrp()
    try:
        command = Path(f"/proc/{me}/cmdline").read_bytes()
    except OSError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text()
            same_group = int(stat[stat.rindex(")") + 2:].split()[2]) == group
            if same_group and (entry / "cmdline").read_bytes() == command:
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (children, their children…), from /proc; [] where
    /proc cannot be read."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid …": comm may hold spaces and parentheses.
        parent = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
