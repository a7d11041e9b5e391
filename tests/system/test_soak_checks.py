"""The soak's eyes (tests/soak_os.py) and its invariants (tests/soak_checks.py) on made-up
situations, so a soak that passes cannot pass because a check never fires: a real fake
engine read from /proc, over-booked GPUs, an unwanted engine outliving its grace (and not
while its agent is down), a 200 from the wrong process. Fast: not marked ``soak``."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from tests.cluster import FAKE_ENGINE
from tests.processes import free_port, wait_for_port
from tests.soak_checks import ORPHAN_GRACE_S, Answer, InvariantChecks
from tests.soak_os import GPU_MEMORY_ENV, EngineProcess, engine_processes, listeners


class Stub(InvariantChecks):
    """The state a Soak gives its checks, without a cluster."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.keys, self.pid_keys, self.unwanted_since, self.ready_wrong_since = {}, {}, {}, {}
        self.crashed_at, self.web_down, self.worker_down = {}, [], []
        self.reconnected: dict[str, float] = {}  # agent → when it reconnected (the rows' connected_since)
        self.cluster = type("C", (), {"up_since": {"gpu-a": 0.0, "gpu-b": 0.0, "cpu": 0.0}})()

    def _reconnected_at(self, now: float) -> dict[str, float]:
        return self.reconnected

    def violate(self, invariant: str, text: str, once: object = None) -> None:
        self.violations.append(f"[{invariant}] {text}")


def engine(pid: int, agent: str = "gpu-a", key: str = "k1", gpus=(0,), mib: int = 20480) -> EngineProcess:
    return EngineProcess(pid=pid, start_ticks=1, pgid=pid, agent=agent, key=key, port=23100 + pid % 100,
                         served_name="m", argv=(), gpus=tuple(gpus), gpu_memory_mib=mib)


def row(rid: int, key: str, state: str = "ready", agent: str = "gpu-a", pid: int | None = None) -> dict:
    return {"id": rid, "engine_key": key, "state": state, "agent__name": agent, "port": None, "pid": pid,
            "model__name": "m", "gpu_indices": [0], "state_changed_at": None}


def test_a_fake_engine_is_read_from_proc_with_its_key_port_gpus_and_listening_socket(tmp_path):
    state_dir = tmp_path / "agent-gpu-a"
    state_dir.mkdir()
    port = free_port()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "1", GPU_MEMORY_ENV: "12288"}
    proc = subprocess.Popen([sys.executable, str(FAKE_ENGINE), "--port", str(port), "--served-name", "m1",
                             "--api-key", "secret-key", "--echo-pid"], cwd=state_dir, env=env,
                            stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_port(port, proc=proc)
        [found] = engine_processes(tmp_path, {state_dir: "gpu-a"})
        assert (found.pid, found.agent, found.key, found.port, found.served_name) == (
            proc.pid, "gpu-a", "secret-key", port, "m1")
        assert (found.gpus, found.gpu_memory_mib, found.pgid) == ((1,), 12288, proc.pid)
        assert listeners({port}, [proc.pid]) == {port: proc.pid}
        assert engine_processes(tmp_path / "elsewhere", {}) == []
    finally:
        proc.kill()
        proc.wait()


def test_engines_over_a_gpus_memory_or_naming_gpus_on_a_cpu_agent_are_violations():
    checks = Stub()
    checks.check_gpu_memory([engine(1, key="a"), engine(2, key="b", mib=4096)], {})  # exactly full
    assert checks.violations == []
    checks.check_gpu_memory([engine(1, key="a"), engine(2, key="b")], {"a": row(7, "a")})
    assert len(checks.violations) == 1 and "gpu-a GPU 0 (24576 MiB) has 40960 MiB" in checks.violations[0]
    assert "r7 of m on gpu-a, ready" in checks.violations[0] and "no replica row (deleted)" in checks.violations[0]
    checks.check_gpu_memory([engine(3, agent="cpu", key="c")], {})
    assert "on the CPU-only agent cpu names GPUs" in checks.violations[-1]


def test_an_unwanted_engine_is_a_violation_only_after_its_grace_counted_while_its_agent_runs():
    checks = Stub()
    orphan = engine(5, key="gone")
    checks.check_wanted([orphan], {}, now=100.0)
    checks.cluster.up_since["gpu-a"] = None  # its agent is down: the clock does not count
    checks.check_wanted([orphan], {}, now=100.0 + ORPHAN_GRACE_S + 5)
    assert checks.violations == []
    checks.cluster.up_since["gpu-a"] = 120.0  # back: the grace runs from here
    checks.check_wanted([orphan], {}, now=120.0 + ORPHAN_GRACE_S - 1)
    assert checks.violations == []
    checks.check_wanted([orphan], {}, now=120.0 + ORPHAN_GRACE_S + 1)
    assert len(checks.violations) == 1 and "the row was deleted" in checks.violations[0]
    wanted = engine(6, key="here")
    checks.check_wanted([wanted], {"here": row(8, "here", pid=6)}, now=500.0)
    checks.check_wanted([wanted], {"here": row(8, "here", pid=6)}, now=600.0)
    assert len(checks.violations) == 1
    moved = engine(7, key="moved")
    checks.check_wanted([moved], {"moved": row(9, "moved", state="stopped")}, now=500.0)
    checks.check_wanted([moved], {"moved": row(9, "moved", state="stopped")}, now=500.0 + ORPHAN_GRACE_S + 1)
    assert "its replica r9 of m is stopped" in checks.violations[-1]


def test_a_200_from_a_process_other_than_its_replicas_engine_is_a_routing_violation():
    checks = Stub()
    checks.keys = {1: "key-1", 2: "key-2"}
    checks.pid_keys = {41: "key-1", 42: "key-2"}
    ok = Answer(0, 0, "m", 200, replica="1@gpu-a", fingerprint="fake-engine-pid-41")
    checks.check_routing(ok, "t")
    assert checks.violations == []
    checks.check_routing(Answer(0, 0, "m", 200, replica="1@gpu-a", fingerprint="fake-engine-pid-42"), "t")
    assert "answer came from pid 42, the engine of replica 2" in checks.violations[-1]
    checks.check_routing(Answer(0, 0, "m", 200, replica="1@gpu-a", fingerprint="impostor-pid-9-port-23100"), "t")
    assert "not a soak engine" in checks.violations[-1]


def test_an_impostor_on_a_dead_engines_port_is_excused_only_within_the_crash_window():
    from tests.soak_checks import CRASH_WINDOW_S

    checks = Stub()
    checks.keys = {1: "key-1"}
    checks.crashed_at = {"key-1": 100.0}
    impostor = "impostor-pid-9-port-23100"
    checks.check_routing(Answer(100.0 + CRASH_WINDOW_S / 2, 101.0, "m", 200, replica="1@gpu-a", fingerprint=impostor), "t")
    assert checks.violations == []  # sent before the agent could have told anyone
    checks.check_routing(Answer(100.0 + CRASH_WINDOW_S + 0.5, 102.0, "m", 200, replica="1@gpu-a",
                                fingerprint=impostor), "t")
    assert len(checks.violations) == 1 and "not a soak engine" in checks.violations[0]


def test_answers_need_a_documented_status_in_openais_error_shape():
    assert InvariantChecks._body_check(503, b'{"error": {"message": "loading", "type": "x"}}', False) == ("", "")
    assert "without OpenAI's error shape" in InvariantChecks._body_check(502, b"Bad Gateway", False)[1]
    assert InvariantChecks._body_check(200, b'{"choices": [{}], "system_fingerprint": "fake-engine-pid-3"}',
                                       False) == ("fake-engine-pid-3", "")


def test_an_impostors_answer_is_one_routing_violation_not_also_a_shape_one():
    checks = Stub()
    checks.answers, checks.web_down = [], []
    checks.result = type("R", (), {"excused": 0})()
    fingerprint, problem = InvariantChecks._body_check(200, b'{"choices": [], "system_fingerprint": "impostor-pid-9"}', True)
    checks.answers = [Answer(0, 0.1, "m", 200, replica="1@cpu", fingerprint=fingerprint, problem=problem)]
    checks.check_answers()
    assert len(checks.violations) == 1 and checks.violations[0].startswith("[routing]"), checks.violations


def test_a_ready_row_nothing_listens_for_is_excused_while_a_web_process_is_down():
    """No web process to hear the agent's report: the row cannot have moved yet (and no
    request is routed); the grace starts again when the web process is back."""
    from tests.soak_checks import READY_GRACE_S

    checks = Stub()
    stale = {**row(3, "gone"), "port": 1}  # port 1: nothing listens there
    checks.web_down = [[100.0, 110.0]]
    checks.check_ready_identity([], {"gone": stale}, now=105.0)
    checks.check_ready_identity([], {"gone": stale}, now=109.0)
    checks.reconnected = {"gpu-a": 90.0}  # the flag of its old connection
    checks.check_ready_identity([], {"gone": stale}, now=110.5 + READY_GRACE_S + 2)
    assert checks.violations == []
    checks.reconnected = {"gpu-a": 111.0}  # reconnected: the grace runs from here
    checks.check_ready_identity([], {"gone": stale}, now=111.0)
    checks.check_ready_identity([], {"gone": stale}, now=111.0 + READY_GRACE_S / 2)
    assert checks.violations == []
    checks.check_ready_identity([], {"gone": stale}, now=111.0 + READY_GRACE_S + 0.5)
    assert len(checks.violations) == 1 and "nothing listens there" in checks.violations[0]


def test_an_unwanted_engine_is_excused_while_a_web_process_is_down_and_its_grace_runs_from_its_return():
    """The agent learns an engine is unwanted from its desired set, which a web process
    sends: with none up, nobody can tell it."""
    checks = Stub()
    orphan = engine(5, key="gone")
    checks.web_down = [[100.0, 110.0]]
    checks.reconnected = {"gpu-a": 110.0}
    checks.check_wanted([orphan], {}, now=95.0)
    checks.check_wanted([orphan], {}, now=109.0)
    checks.check_wanted([orphan], {}, now=110.0 + ORPHAN_GRACE_S - 1)
    assert checks.violations == []
    checks.check_wanted([orphan], {}, now=110.0 + ORPHAN_GRACE_S + 1)
    assert len(checks.violations) == 1 and "the row was deleted" in checks.violations[0]


def test_an_engine_of_a_lost_replica_is_excused_while_no_worker_can_plan_and_its_grace_runs_from_then():
    """Its agent is back and reports the engine ready, but only a pass settles the lost row
    (ready again, or a duplicate stopped): with the worker killed and its lease not yet run
    out, nobody can."""
    checks = Stub()
    engine_of_lost = engine(6, key="k6")
    row = {"id": 6, "engine_key": "k6", "state": "lost", "agent__name": "gpu-a", "port": 23106, "pid": 6,
           "model__name": "m", "gpu_indices": [0]}
    checks.worker_down = [[100.0, 106.0]]
    checks.check_wanted([engine_of_lost], {"k6": row}, now=99.0)
    checks.check_wanted([engine_of_lost], {"k6": row}, now=105.0)
    checks.check_wanted([engine_of_lost], {"k6": row}, now=106.0 + ORPHAN_GRACE_S - 1)
    assert checks.violations == []
    checks.check_wanted([engine_of_lost], {"k6": row}, now=106.0 + ORPHAN_GRACE_S + 1)
    assert len(checks.violations) == 1 and "its replica r6 of m is lost" in checks.violations[0]
