"""No orphan engines (docs/architecture.md, "Decisions"): an agent killed with SIGKILL while
its engines start, serve and stop, then started again, adopts the engines still desired
(same pid, reported ready) and stops every other one — including one it was stopping, which
ignores SIGTERM for a while. Real processes: the agent program (``python -m fleet.agent``),
fake engines, and a scripted control plane (tests/agent/scripted_control.py) standing in for
the planner."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from fleet.agent.engines import ORPHAN_STOPPED
from fleet.agent.processes import process_alive, process_start_time
from tests.agent.scripted_control import ScriptedControlPlane
from tests.processes import PYTHON, Proc, wait_until

FAKE_ENGINE = str(Path(__file__).parent.parent / "fake_engine.py")

pytestmark = [pytest.mark.timeout(150),
              pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="Linux /proc only")]


def spec(replica_id: int, *args: str) -> dict:
    return {
        "replica_id": replica_id, "served_name": "fake-model", "weights": "file:/dev/null",
        "command": (f"{sys.executable} {FAKE_ENGINE} --host {{host}} --port {{port}} --api-key {{api_key}} "
                    + " ".join(args)).strip(),
        "env": {}, "gpu_indices": [], "cpu_cores": 1, "readiness_path": "/v1/models",
        "startup_timeout_s": 60, "metrics_path": "", "metric_running": "", "metric_waiting": "",
        "api_key": f"key-{replica_id}",
    }


def start_agent(control: ScriptedControlPlane, state_dir: Path, log_path: Path, grace_s: float) -> Proc:
    return Proc([PYTHON, "-m", "fleet.agent", "--server", control.url, "--name", "killed", "--state-dir",
                 str(state_dir), "--port-range", "21500-21599", "--heartbeat-s", "0.5",
                 "--stop-grace-s", str(grace_s)],
                log_path, env={"LLMGW_AGENT_TOKEN": "test-token"})


def state_records(state_dir: Path) -> dict[int, dict]:
    """The agent's state file by pid."""
    try:
        data = json.loads((state_dir / "engines.json").read_text())
    except (OSError, ValueError):
        return {}
    return {r["pid"]: r for r in data.get("engines", [])}


@pytest.fixture
def control():
    plane = ScriptedControlPlane()
    yield plane
    plane.close()


def test_an_agent_killed_while_engines_start_serve_and_stop_leaves_no_orphan(control, tmp_path):
    state_dir = tmp_path / "agent"
    control.desired = [spec(1), spec(2), spec(4, "--term-delay-s", "60")]
    agent = start_agent(control, state_dir, tmp_path / "agent-1.log", grace_s=60)
    second = None
    engines: dict[int, tuple[int, str]] = {}  # replica -> (pid, start time), every engine ever seen
    try:
        def ready(rid, session=None):
            report = control.latest(rid, session)
            return report if report and report["state"] == "ready" else None

        for rid in (1, 2, 4):
            pid = wait_until(lambda: (ready(rid) or {}).get("pid"), timeout_s=60, what=f"replica {rid} ready")
            engines[rid] = (pid, process_start_time(pid))

        # 3 starts (slowly), 4 is being stopped (it ignores SIGTERM for a minute), 1 and 2 serve.
        control.assign([spec(1), spec(2), spec(3, "--startup-delay-s", "6")])

        def starting_and_stopping():
            records = state_records(state_dir)
            three = [r for r in records.values() if r["replica_id"] == 3]
            stopping = records.get(engines[4][0], {}).get("stopping")
            return three[0]["pid"] if three and stopping else None

        pid3 = wait_until(starting_and_stopping, timeout_s=30, what="3 starting and 4 stopping in the state file")
        engines[3] = (pid3, process_start_time(pid3))
        assert (control.latest(3) or {}).get("state") != "ready"  # it starts for 6 s
        agent.proc.send_signal(signal.SIGKILL)
        agent.proc.wait(10)
        assert all(process_alive(*engines[rid]) for rid in (1, 2, 3, 4))  # the engines outlive it

        # While the agent was away, the control plane gave up on replica 2.
        control.desired = [spec(1), spec(3, "--startup-delay-s", "6")]
        sessions_before = control.sessions
        second = start_agent(control, state_dir, tmp_path / "agent-2.log", grace_s=2)
        session = wait_until(lambda: control.sessions > sessions_before and control.hello(control.sessions)
                             and control.sessions, timeout_s=60, what="the new agent's hello")
        hello = {r["replica_id"]: r for r in control.hello(session)["replicas"]}
        assert {rid: hello[rid]["pid"] for rid in (1, 2, 3, 4)} == {rid: engines[rid][0] for rid in (1, 2, 3, 4)}
        assert hello[1]["state"] == "ready" and hello[3]["state"] == "starting" and hello[4]["state"] == "stopping"

        # Desired ones adopted: same pid, ready (3 finishes its start under the new agent).
        for rid in (1, 3):
            report = wait_until(lambda: ready(rid, session), timeout_s=60, what=f"replica {rid} ready again")
            assert report["pid"] == engines[rid][0]
        # The rest stopped: 2 (an orphan, said so) and 4 (its stop finished: SIGKILL after the grace).
        wait_until(lambda: not process_alive(*engines[2]) and not process_alive(*engines[4]), timeout_s=30,
                   what="the engines not wanted to be gone")
        for rid in (2, 4):
            report = wait_until(lambda: (control.latest(rid, session) or {}).get("state") == "stopped"
                                and control.latest(rid, session), timeout_s=30, what=f"replica {rid} reported stopped")
        assert control.latest(2, session)["error"] == ORPHAN_STOPPED
        assert "was being stopped when the agent went away" in second.log()
        wait_until(lambda: sorted(r["replica_id"] for r in state_records(state_dir).values()) == [1, 3],
                   timeout_s=15, what="the state file to list only the engines running")
        assert all(process_alive(*engines[rid]) for rid in (1, 3))
    finally:
        for proc in (agent, second):
            if proc is not None:
                proc.stop(signal.SIGKILL)
        for pid, start in engines.values():
            if process_alive(pid, start):
                os.killpg(pid, signal.SIGKILL)
