"""Warm before demand in the simulator (issue 18): each on-demand model's arrival profile,
learned from the history before the trace and from the trace as it arrives, and the
prediction made from it (``fleet.planning.warmth``), recomputed only when it may have
moved — an hour boundary of its look-ahead or look-back, or a changed profile — at
control events of kind ``WARMTH``. A mixin of :class:`~fleet.simulation.engine.Simulator`."""

from __future__ import annotations

import heapq
import math
from datetime import UTC, datetime

import numpy as np

from fleet.planning import warmth
from fleet.simulation.runtime import SimModel
from fleet.simulation.traces import Trace


#: A model's predicted warm span may have moved (control events of this kind carry a model).
WARMTH = 9
INF = float("inf")


class Warming:
    """The simulator's arrival profiles and predictions (module docstring)."""

    def _learn_history(self, history: Trace | None) -> None:
        """Arrival profiles of the on-demand models from ``history`` (its requests before the
        trace's start: the weeks a running cluster has seen; later ones are left out), then
        a prediction event for every on-demand model, at 0 s."""
        if history is not None and len(history):
            by_name = {m.spec.name: m for m in self.models if m.spec.on_demand}
            names = len(history.names)
            at = history.t_s + history.start.timestamp()
            before = at < self.start_ts  # a history overlapping the trace counts only before it
            hours = np.floor(at[before] / 3600).astype(np.int64)
            keys = np.unique(hours * names + history.model[before].astype(np.int64))  # one per (hour, model)
            asked: dict[int, list[datetime]] = {}
            for key in keys.tolist():
                name = history.names[key % names]
                if name in by_name:
                    asked.setdefault(by_name[name].index, []).append(datetime.fromtimestamp((key // names) * 3600, UTC))
            for index, when in asked.items():
                self.models[index].arrivals = warmth.learn(warmth.ArrivalProfile(), when, self.start, self.zone)
        for m in self.models:
            if m.spec.on_demand:
                heapq.heappush(self.control, (0.0, next(self._seq), WARMTH, m))

    def _asked(self, m: SimModel, t: float) -> None:
        """A request for on-demand ``m`` arrived at ``t``: its profile sees the hour
        (``fleet.control.reconciler`` observes it at every pass; here once an hour is enough)."""
        hour = math.floor((self.start_ts + t) / 3600)
        if hour != m.asked_hour:
            m.asked_hour = hour
            at = self.at(t)
            before = m.arrivals
            m.arrivals = warmth.observe(before, at, at, self.zone)
            if m.arrivals.seen != before.seen or m.arrivals.asked != before.asked:
                m.predicted_until_s = -INF  # hours closed: predict afresh at the next look
                heapq.heappush(self.control, (t, next(self._seq), WARMTH, m))

    def _predict(self, m: SimModel, t: float) -> None:
        """Recompute ``m``'s prediction if it may have moved (an hour boundary of its
        look-ahead or look-back passed, or its profile changed) and schedule the next look;
        a changed one puts the model in the next pass."""
        if t < m.predicted_until_s:
            return
        now = self.at(t)
        lead = warmth.lead_s(m.cold_start)
        idle = m.spec.idle_timeout_s or self.policy.default_idle_timeout_s
        profile = warmth.observe(m.arrivals, now, None, self.zone)
        m.arrivals = profile
        predicted = warmth.predict(profile, now, self.zone, lead, idle)
        if predicted != m.predicted:
            m.predicted = predicted
            self.hot.add(m)
        base = self.start_ts + t
        ahead = (math.floor((base + lead) / 3600) + 1) * 3600 - lead
        behind = (math.floor((base - idle) / 3600) + 1) * 3600 + idle
        until = min(ahead, behind) - self.start_ts
        if predicted is not None:
            for edge in (predicted.warm_from, predicted.until):
                at = (edge - self.start).total_seconds()
                if at > t:
                    until = min(until, at)
        m.predicted_until_s = until
        heapq.heappush(self.control, (until, next(self._seq), WARMTH, m))
