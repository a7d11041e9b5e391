"""Load scaling between a model's base and its ceiling: pure rules on an injected clock.

The rules are docs/architecture.md's R7, with one deliberate departure from the seed
(docs/architecture.md, "Decisions": unknown is not zero): a load that is missing, stale or
unparsable is *unknown*, which neither scales up nor down and resets the model's busy/quiet
timers — the seed read it as zero, which scales down under a broken metrics endpoint.

* Busy: requests waiting at the engines per ready replica ≥ the threshold, or (with a
  measured capacity) more requests in flight than capacity × replicas. Busy for
  ``scale_up_after_s`` adds one replica, never past the ceiling, never while one of the
  model's replicas is still placing or starting; the timer then restarts.
* Quiet: nothing waiting and a replica added by load to take back. Quiet for
  ``scale_down_after_s`` takes one back (the timer then restarts) if at that pass the
  remaining replicas would stay under 70% of their capacity: the measured one, or else the
  one *observed* — the most requests a ready replica was seen running while others waited
  (a replica with a queue is full; learned afresh each time load adds replicas).
* Crowded: nothing waiting, but the remaining replicas would be over those 70%. With a
  measured capacity that restarts the quiet timer at once (R7's 70% rule, pass by pass).
  With a learned one, only a crowded spell as long as ``scale_up_after_s`` does; a shorter
  one (a spike) leaves the timer running — learned capacities are small and coarse (a
  llama.cpp server has a few slots), and judged pass by pass one request too many in any
  pass would keep a light load from ever scaling down. Without any of this, "quiet" would
  only mean "nothing waiting", and a steady load between one and two replicas' worth would
  scale down, queue, scale up again, forever (the seed flaps so; ``tests/simulation/test_simulator.py``
  shows it no longer does). Forgiving spikes against a measured capacity too was tried: in
  the simulated day it scaled the 70B models down earlier, at moments when their drained
  replica still held requests longer than the 30 s drain grace (6 cut off).
* Anything else resets all timers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

#: How full the replicas left after a scale-down may be, of their measured capacity.
SCALE_DOWN_HEADROOM = 0.7


@dataclass(frozen=True)
class ScalingPolicy:
    """Cluster-wide scaling thresholds: requests waiting per ready replica that count as busy,
    and how long (seconds) busy or quiet must last before one step up or down."""

    scale_up_waiting: float = 1.0
    scale_up_after_s: float = 30.0
    scale_down_after_s: float = 300.0


@dataclass(frozen=True)
class Load:
    """A model's load over its ready replicas. ``running``/``waiting`` None = unknown."""

    replicas: int
    running: int | None
    waiting: int | None

    @property
    def known(self) -> bool:
        return self.running is not None and self.waiting is not None


@dataclass(frozen=True)
class ScalingState:
    """What a model remembers between passes (stored in ModelState). ``observed_per_replica``:
    the most requests one ready replica was seen running while requests waited (its
    capacity, learned without a benchmark); None until a queue was seen. ``crowded_since``:
    since when, with nothing waiting, fewer replicas would be over 70% of capacity."""

    extra: int = 0
    busy_since: datetime | None = None
    quiet_since: datetime | None = None
    observed_per_replica: int | None = None
    crowded_since: datetime | None = None


@dataclass(frozen=True)
class Step:
    """The outcome of one evaluation: the new state, and a sentence when it changed the
    replica count (``from_replicas → to_replicas``) — recorded as a scaling event."""

    state: ScalingState
    from_replicas: int = 0
    to_replicas: int = 0
    why: str = ""

    @property
    def moved(self) -> bool:
        return self.from_replicas != self.to_replicas


def _fmt(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def evaluate(base: int, ceiling: int, load: Load | None, measured_per_replica: int | None, starting: bool,
             state: ScalingState, now: datetime, policy: ScalingPolicy) -> Step:
    """One pass of the scaling rules for one model (see the module docstring).

    ``base``: replicas without load; ``ceiling``: max now (window max or model max);
    ``measured_per_replica``: benchmarked max concurrency for the profile in use, if any;
    ``starting``: a replica of the model is still placing, downloading or starting.
    """
    if base == 0 or ceiling <= base:
        return Step(ScalingState(observed_per_replica=state.observed_per_replica))
    extra = min(state.extra, ceiling - base)
    current = base + extra
    observed = state.observed_per_replica
    if load is None or not load.known:  # unknown: no step either way, timers reset
        return Step(ScalingState(extra, observed_per_replica=observed))
    replicas = max(load.replicas, 1)
    if load.waiting > 0 and load.running > 0 and load.replicas > 0:
        observed = max(observed or 0, math.ceil(load.running / load.replicas))
    waiting_per_replica = load.waiting / replicas
    in_flight = load.running + load.waiting
    over_measured = measured_per_replica is not None and in_flight > measured_per_replica * replicas
    capacity = measured_per_replica if measured_per_replica is not None else observed
    fits_in_fewer = capacity is None or (
        load.running <= SCALE_DOWN_HEADROOM * capacity * max(load.replicas - 1, 0)
    )

    def keep(extra: int, busy_since: datetime | None = None, quiet_since: datetime | None = None,
             crowded_since: datetime | None = None) -> ScalingState:
        return ScalingState(extra, busy_since, quiet_since, observed, crowded_since)

    if waiting_per_replica >= policy.scale_up_waiting or over_measured:
        if state.busy_since is None:
            return Step(keep(extra, busy_since=now))
        busy_for = (now - state.busy_since).total_seconds()
        if busy_for >= policy.scale_up_after_s and current < ceiling and not starting:
            if over_measured and waiting_per_replica < policy.scale_up_waiting:
                why = (f"{in_flight} in flight over measured {measured_per_replica} × {load.replicas} "
                       f"for {_fmt(busy_for)}")
            else:
                why = f"{waiting_per_replica:.1f} waiting per replica for {_fmt(busy_for)}"
            return Step(keep(extra + 1, busy_since=now), current, current + 1, "scale up: " + why)
        return Step(keep(extra, busy_since=state.busy_since))
    if load.waiting == 0 and extra > 0 and not fits_in_fewer:
        crowded_since = state.crowded_since or now
        if measured_per_replica is not None or (now - crowded_since).total_seconds() >= policy.scale_up_after_s:
            return Step(keep(extra, crowded_since=crowded_since))  # needed: the quiet timer restarts
        return Step(keep(extra, quiet_since=state.quiet_since, crowded_since=crowded_since))  # a spike
    if load.waiting == 0 and extra > 0:
        if state.quiet_since is None:
            return Step(keep(extra, quiet_since=now))
        quiet_for = (now - state.quiet_since).total_seconds()
        if quiet_for >= policy.scale_down_after_s:
            why = f"scale down: quiet for {_fmt(quiet_for)}"
            if capacity is not None:
                source = "measured" if measured_per_replica is not None else "seen at saturation"
                why += (f" ({load.running} in flight fit in {load.replicas - 1} × {capacity} {source}"
                        f" at {SCALE_DOWN_HEADROOM:.0%})")
            if extra == 1:
                observed = None  # back at base: learn afresh next time (the engine may change)
            return Step(keep(extra - 1, quiet_since=now), current, current - 1, why)
        return Step(keep(extra, quiet_since=state.quiet_since))
    return Step(keep(extra))
