"""The fault clusters' handling of their own processes (tests/multicluster.py), which the soak
relies on: an agent brought back that does not connect in time is killed before the error,
so a harness that tries again never runs two agents of one name, token and state directory
(the older would keep engines nobody tells to stop), and every agent started is stopped at
the end. A real agent process against the scripted control plane; no database."""

from __future__ import annotations

import pytest

from tests.agent.scripted_control import ScriptedControlPlane
from tests.multicluster import AgentHandle, MultiCluster
from tests.netproxy import TcpProxy
from tests.processes import wait_until
from tests.soak_os import agent_processes

pytestmark = pytest.mark.timeout(180)


def test_an_agent_that_does_not_connect_in_time_is_killed_and_the_next_start_waits_for_its_own(tmp_path):
    control = ScriptedControlPlane()
    cluster = MultiCluster(tmp_path, {}, webs=0, workers=0)
    link = TcpProxy([control.port]).start()
    handle = AgentHandle("cpu", "t", tmp_path / "agent-cpu", "21700-21799", link)
    cluster.agents["cpu"] = handle
    try:
        link.pause()  # the control plane cannot be reached: this start cannot connect, however fast
        with pytest.raises(TimeoutError):
            cluster.start_agent("cpu", connect_timeout_s=3)
        [first] = handle.started
        assert first.proc.poll() is not None, "left running: it would connect later, beside the next one"
        assert agent_processes(tmp_path) == {}

        link.resume()
        # Its own "connected to" line counts, not the failed start's absence of one.
        second = cluster.start_agent("cpu", connect_timeout_s=120)
        assert handle.started == [first, second] and handle.proc is second
        assert agent_processes(tmp_path) == {second.pid: handle.state_dir}
        wait_until(lambda: any(control.hello(s) for s in range(1, control.sessions + 1)), timeout_s=60,
                   what="the agent's hello")
    finally:
        cluster.stop()
        control.close()
    assert agent_processes(tmp_path) == {}  # every agent started, stopped
