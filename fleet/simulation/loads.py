"""The report path in the simulator: what the reconciler knows of each replica's load, and
how old it is (docs/architecture.md, R7 and "Crossing processes": heartbeats, usage reports).

The real cluster never hands the planner an engine's load directly. An agent reads each
ready engine's metrics every ``load_poll_s`` (and once as it becomes ready), sends a status
when the numbers changed and a heartbeat every ``heartbeat_s`` otherwise; the web process
stamps the load on arrival (``load_reported_at``) and the snapshot calls a load older than
``LLMGW_LOAD_STALE`` unknown. For engines without metrics the gateway's in-flight counts
stand in, flushed every ``LLMGW_USAGE_FLUSH_INTERVAL`` and trusted for
``LLMGW_USAGE_REPORT_FRESH``. :class:`LoadReports` plays that path on the simulated clock, so
a bug in it (a steady load going stale) shows in a simulation as it would in a cluster.

``SimConfig.load_reports`` picks the agents' behaviour:

* ``"heartbeat"`` (today's agents): every heartbeat carries the loads; the intake rewrites
  an unchanged load only once its stamp is ``load_stale_s / 3`` old (``fleet.live.watch``).
* ``"on_change"`` (agents before issue 14): loads only in a status when they change, so a
  steady load goes stale and is unknown — never scaled up, never down.
* ``"instant"``: no report path; the planner reads the engines as they are (the
  simulator's model before it had one, kept for comparisons).

Simplifications, each one a phase, not an age: every agent polls and heartbeats on one
grid (polls at ``k × load_poll_s``, heartbeats half a period later, so a heartbeat's numbers
are that old); the gateway flushes half an interval off the grid (0.5 s, 1.5 s, … by
default), so a pass on the 3 s grid sees counts 0.5 s old; a status does not move the
agent's heartbeat timer. Only the model's load goes through the
path: the in-flight count and last use of each replica (idle timeouts, drains) are still
read as they are.
"""

from __future__ import annotations

import heapq
from typing import Any

from fleet.simulation.runtime import SimModel, SimReplica

#: The engine's Simulator (it imports this module, so not named here).
Simulator = Any

#: The kinds of report events in the simulator's control queue (after its own 0..2).
POLL, HEARTBEAT, FLUSH = 3, 4, 5
LOAD_REPORTS = ("heartbeat", "on_change", "instant")


class LoadReports:
    """The loads the reconciler would see, kept per replica id: the agent's last metrics
    read, what it last sent, what the database holds (value and stamp, in simulated
    seconds) and the gateway's last in-flight report."""

    def __init__(self, sim: Simulator) -> None:
        cfg = sim.config
        if cfg.load_reports not in LOAD_REPORTS:
            raise ValueError(f"load_reports must be one of {', '.join(LOAD_REPORTS)}, not {cfg.load_reports!r}")
        self.sim = sim
        self.mode = cfg.load_reports
        self.read: dict[int, tuple[int, int]] = {}
        self.sent: dict[int, tuple[int, int]] = {}
        self.stored: dict[int, tuple[int, int, float]] = {}
        self.flushed: dict[int, tuple[int, float]] = {}
        self.refresh_s = cfg.load_stale_s / 3

    def start(self) -> None:
        """Queue the first poll, heartbeat and flush (none with ``"instant"``)."""
        if self.mode == "instant":
            return
        cfg = self.sim.config
        self._at(0.0, POLL)
        if self.mode == "heartbeat":
            self._at(cfg.heartbeat_s / 2, HEARTBEAT)
        self._at(cfg.usage_flush_interval_s / 2, FLUSH)

    def _at(self, t: float, kind: int) -> None:
        sim = self.sim
        heapq.heappush(sim.control, (t, next(sim._seq), kind, None))

    def on_event(self, kind: int, t: float) -> None:
        """One report event at ``t`` (simulated seconds); queues the next of its kind."""
        cfg = self.sim.config
        metered = [m for m in self.sim.models if m.ready and m.spec.engine_metrics]
        if kind == POLL:
            for m in metered:
                for r in m.ready:
                    self._poll(t, r)
            self._at(t + cfg.load_poll_s, POLL)
        elif kind == HEARTBEAT:
            for m in metered:
                for r in m.ready:
                    value = self.read.get(r.id)
                    stored = self.stored.get(r.id)
                    if value is None or (stored is not None and stored[:2] == value and t - stored[2] < self.refresh_s):
                        continue
                    self.stored[r.id] = (*value, t)
            self._at(t + cfg.heartbeat_s, HEARTBEAT)
        else:
            for m in self.sim.models:
                if m.ready and not m.spec.engine_metrics:
                    for r in m.ready:
                        self.flushed[r.id] = (r.in_flight, t)
            self._at(t + cfg.usage_flush_interval_s, FLUSH)

    def ready(self, t: float, r: SimReplica) -> None:
        """A replica became ready: its agent reads the engine's metrics at once (and reports
        them in a status, since they changed from unknown)."""
        if self.mode != "instant" and r.model.spec.engine_metrics:
            self._poll(t, r)

    def _poll(self, t: float, r: SimReplica) -> None:
        value = (r.running, len(r.queue))
        self.read[r.id] = value
        if value != self.sent.get(r.id):  # a status goes out: the value changed
            self.sent[r.id] = value
            self.stored[r.id] = (*value, t)

    def gone(self, r: SimReplica) -> None:
        """Forget a stopped replica."""
        for table in (self.read, self.sent, self.stored, self.flushed):
            table.pop(r.id, None)

    def load(self, m: SimModel, t: float) -> tuple[int, int | None, int | None] | None:
        """``fleet.control.snapshot._loads`` for ``m`` at ``t``: (ready replicas, running,
        waiting), each count None when a replica's report is missing or stale; None without
        a ready replica."""
        ready = m.ready
        if not ready:
            return None
        if self.mode == "instant":
            if m.spec.engine_metrics:
                return len(ready), sum(r.running for r in ready), sum(len(r.queue) for r in ready)
            return len(ready), sum(r.in_flight for r in ready), 0
        cfg = self.sim.config
        running = waiting = 0
        if m.spec.engine_metrics:
            for r in ready:
                stored = self.stored.get(r.id)
                if stored is None or t - stored[2] > cfg.load_stale_s:
                    return len(ready), None, None
                running += stored[0]
                waiting += stored[1]
            return len(ready), running, waiting
        for r in ready:
            flushed = self.flushed.get(r.id)
            if flushed is None or t - flushed[1] > cfg.usage_report_fresh_s:
                return len(ready), None, 0
            running += flushed[0]
        return len(ready), running, 0
