"""Engine processes by pid and start time, and the agent's state file (fleet.agent.processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.agent.engines import AgentConfig, EngineManager
from fleet.agent.processes import (LOCK_FILE, StateDirInUse, group_gone, hold_state_dir, kill_leftovers, process_alive,
                                   process_start_time, read_state, write_state)

pytestmark = pytest.mark.timeout(60)


def sleeper() -> subprocess.Popen:
    """A process leading a group of its own, as an engine does."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


def test_a_process_is_named_by_pid_and_start_time_and_its_group_is_gone_only_when_empty():
    proc = sleeper()
    try:
        start = process_start_time(proc.pid)
        assert process_alive(proc.pid, start) and not group_gone(proc.pid, start)
        assert not process_alive(proc.pid, "1")  # the same pid with another start: another process
        assert group_gone(proc.pid, "1")  # ...so the group recorded is long gone
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not process_alive(proc.pid, start) and group_gone(proc.pid, start)


def unreaped_engine(with_worker: bool = False) -> tuple[subprocess.Popen, int]:
    """(its parent, its pid): a process leading a group of its own, as an engine does, whose
    parent is not this process and never reaps it — as init may not, soon, for an engine
    adopted after its agent was killed. ``with_worker``: it starts a worker in its group."""
    engine = ("import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)" if with_worker
              else "import time; time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               f"child = subprocess.Popen([sys.executable, '-c', {engine!r}], start_new_session=True)\n"
                               "print(child.pid, flush=True)\ntime.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    return parent, int(parent.stdout.readline())


def wait_for(predicate, what: str, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_an_engine_dead_but_not_yet_reaped_by_its_parent_is_gone_unless_a_worker_of_its_group_lives():
    """A zombie holds nothing: waiting for init to reap an adopted engine held its failure
    or stop report (and kept its record) for as long as that took."""
    parent, pid = unreaped_engine()
    try:
        start = process_start_time(pid)
        assert not group_gone(pid, start)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: zombie(pid), "the engine to be a zombie")
        assert process_start_time(pid) == start and not process_alive(pid, start)
        assert group_gone(pid, start)
    finally:
        parent.kill()
        parent.wait()

    parent, pid = unreaped_engine(with_worker=True)
    try:
        start = process_start_time(pid)
        wait_for(lambda: len([p for p in os.listdir("/proc") if p.isdigit() and _pgrp(int(p)) == pid]) == 2,
                 "its worker to start")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: zombie(pid), "the engine to be a zombie")
        assert not group_gone(pid, start)  # its worker still runs
        kill_leftovers(pid, start)  # the leader's zombie still names the group: the worker is killed
        wait_for(lambda: group_gone(pid, start), "its worker to be killed")
    finally:
        parent.kill()
        parent.wait()


def _pgrp(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


async def test_an_adopted_engine_that_dies_unreaped_is_failed_and_forgotten_at_once(tmp_path):
    """Adopted after a kill -9 of its agent, its parent is init: once it dies its failure is
    reported and its record dropped without waiting for init to reap it."""
    import asyncio

    parent, pid = unreaped_engine()
    config = AgentConfig(state_dir=tmp_path / "agent", port_min=21700, port_max=21799, readiness_poll_s=0.05)
    spec = {"replica_id": 5, "served_name": "m", "weights": "file:/dev/null", "command": "x", "env": {},
            "gpu_indices": [], "cpu_cores": 1, "readiness_path": "/v1/models", "startup_timeout_s": 120,
            "metrics_path": "", "metric_running": "", "metric_waiting": "", "api_key": "k"}
    config.state_dir.mkdir(parents=True)
    write_state(config.state_file, [{"pid": pid, "start_time": process_start_time(pid), "replica_id": 5,
                                     "host": "127.0.0.1", "port": 21799, "spec": spec, "stopping": False}])
    manager = EngineManager(config, on_change=lambda: None)
    try:
        assert await manager.adopt() == 0  # nothing listens on its port: starting
        os.kill(pid, signal.SIGKILL)
        for _ in range(600):
            if manager.engines[5].state.value == "failed":
                break
            await asyncio.sleep(0.05)
        assert manager.engines[5].error.startswith("engine exited (adopted: exit status unknown) while starting")
        assert zombie(pid)  # still unreaped: nobody waited for that
        assert pid not in manager.spawned and read_state(config.state_file) == []
    finally:
        await manager.stop_all()
        await manager.close()
        parent.kill()
        parent.wait()


def test_the_state_file_is_private_and_lists_records_and_an_older_agents_file_is_read(tmp_path):
    path = tmp_path / "engines.json"
    record = {"pid": 4711, "start_time": "99", "replica_id": 3, "host": "127.0.0.1", "port": 20002,
              "spec": {"replica_id": 3, "api_key": "k"}, "started_at": 1.5, "stopping": True}
    write_state(path, [record, {"pid": "bad", "spec": {}}])
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_state(path) == [record]  # a record without an integer pid is left out
    # Version 1 (agents before issue 14): the engines held, by replica id; none stopping.
    path.write_text(json.dumps({"7": {"pid": 42, "start_time": "5", "port": 20001, "spec": {"replica_id": 7}}}))
    assert read_state(path) == [{"pid": 42, "start_time": "5", "port": 20001, "spec": {"replica_id": 7},
                                 "replica_id": 7, "stopping": False}]
    path.write_text("not json")
    assert read_state(path) == [] and read_state(tmp_path / "missing.json") == []


async def test_a_port_an_engine_being_stopped_still_holds_is_not_picked(tmp_path):
    config = AgentConfig(state_dir=tmp_path / "agent", port_min=21600, port_max=21699)
    manager = EngineManager(config, on_change=lambda: None)
    try:
        first = manager._pick_port("127.0.0.1")
        manager.spawned[4711] = {"pid": 4711, "replica_id": 9, "port": first, "stopping": True}
        assert manager._pick_port("127.0.0.1") not in (first, None)
        assert manager._pick_port("127.0.0.1", avoid=[first + 1]) not in (first, first + 1)
    finally:
        await manager.close()


def test_wait_exit_wakes_when_the_process_exits_not_at_its_timeout():
    """The agent's watch loop wakes on a pidfd (fleet.agent.processes.wait_exit), so a dead
    engine is reported at once rather than at the next poll."""
    import asyncio
    import subprocess
    import time

    from fleet.agent.processes import wait_exit

    proc = subprocess.Popen(["sleep", "60"])
    try:
        assert asyncio.run(wait_exit(proc.pid, 0.2)) is False  # alive: the timeout
        started = time.monotonic()

        async def kill_then_wait():
            asyncio.get_running_loop().call_later(0.1, proc.kill)
            return await wait_exit(proc.pid, 120)

        assert asyncio.run(kill_then_wait()) is True
        assert time.monotonic() - started < 60  # woken by the exit, far before the 120 s timeout
    finally:
        proc.kill()
        proc.wait()
    assert asyncio.run(wait_exit(proc.pid, 5)) is True  # gone (reaped): at once


def test_a_state_directory_is_held_by_one_agent_process_at_a_time(tmp_path):
    """A second agent on one state directory would overwrite the first's state file and keep
    engines the control plane no longer tells it about (it talks to one socket of an agent):
    it exits with code 2 before adopting or starting anything."""
    state_dir = tmp_path / "agent"
    fd = hold_state_dir(state_dir)
    try:
        assert not os.get_inheritable(fd)  # engines never hold it; an agent re-executing takes it again
        assert (state_dir / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(StateDirInUse, match=rf"another agent \(pid {os.getpid()}\) uses the state directory"):
            hold_state_dir(state_dir)
        second = subprocess.run([sys.executable, "-m", "fleet.agent", "--server", "http://127.0.0.1:9", "--token", "t",
                                 "--state-dir", str(state_dir)], capture_output=True, text=True, timeout=120,
                                cwd=Path(__file__).resolve().parents[2])
        assert second.returncode == 2, second.stderr
        assert f"another agent (pid {os.getpid()}) uses the state directory {state_dir}" in second.stderr
        assert not (state_dir / "engines.json").exists()  # it adopted nothing, wrote nothing
    finally:
        os.close(fd)
    os.close(hold_state_dir(state_dir))  # released with its holder: the next agent takes it
