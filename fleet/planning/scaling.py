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
* Rising (issue 18; ``ScalingPolicy.ramp``): for a model whose cold start is long — at
  least :data:`RAMP_COLD_START_FACTOR` times ``scale_up_after_s`` — waiting for a queue
  comes a cold start too late. The requests in flight are followed by two exponential
  averages (:class:`Trend`: :data:`TREND_FAST_S` and :data:`TREND_SLOW_S`), whose gap is
  the load's slope; when the load is already a real share of the replicas' capacity
  (:data:`RAMP_FLOOR`), rising, and expected one cold start plus the hold from now to pass
  :data:`RAMP_TARGET` of it, for the hold (:func:`ramp_hold_s`: :data:`RAMP_HOLD_S` or
  ``scale_up_after_s``, the longer) in a row, one replica is added ahead of the queue. The
  averages and the hold damp a spike (a burst of a minute or two is over before the hold);
  a replica added for a rise that stalls is taken back by the quiet rule like any other —
  unless the load it stalled at is over R7's headroom for one replica fewer, where the queue
  rule would keep it too — and a rising load is never quiet. Without a capacity (measured or
  seen at saturation) nothing is projected; without a measured cold start the rule does not
  apply (the planner passes none: unknown is not long).
* Anything else resets all timers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime

#: How full the replicas left after a scale-down may be, of their measured capacity.
SCALE_DOWN_HEADROOM = 0.7

#: The trend's two averages (seconds): their gap, over the difference, is the slope.
TREND_FAST_S = 60.0
TREND_SLOW_S = 300.0
#: The trend moves at most this often (seconds): every pass would be a change to store.
TREND_STEP_S = 15.0
#: A gap this long in known loads starts the trend afresh.
TREND_RESET_S = 120.0
#: Rising is judged only for a cold start this many times ``scale_up_after_s`` or longer.
RAMP_COLD_START_FACTOR = 3.0
#: Step ahead when the load expected after a cold start passes this share of the capacity
#: of the replicas there are, and only once it is at least ``RAMP_FLOOR`` of it now.
RAMP_TARGET = 0.8
RAMP_FLOOR = 0.5
#: How long a load must be rising before a step ahead, at least (seconds; else
#: ``scale_up_after_s`` if longer): a burst of a minute or two moves the fast average like a
#: rise does, and would leave a replica behind it.
RAMP_HOLD_S = 120.0


@dataclass(frozen=True)
class ScalingPolicy:
    """Cluster-wide scaling thresholds: requests waiting per ready replica that count as busy,
    and how long (seconds) busy or quiet must last before one step up or down."""

    scale_up_waiting: float = 1.0
    scale_up_after_s: float = 30.0
    scale_down_after_s: float = 300.0
    #: Step ahead of a rising load for models with a long cold start (module docstring).
    ramp: bool = True


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
class Trend:
    """The requests in flight (running + waiting) of a model, followed by two exponential
    averages with time constants :data:`TREND_FAST_S` and :data:`TREND_SLOW_S`, last moved
    ``at``; ``rising_since``: since when it has been rising towards its capacity.

    For a load growing by *b* per second both averages settle *b·τ* behind it, so
    ``(fast − slow) / (τ_slow − τ_fast)`` is the slope and ``fast + slope·τ_fast`` the level."""

    fast: float
    slow: float
    at: datetime
    rising_since: datetime | None = None

    @property
    def slope_per_s(self) -> float:
        return (self.fast - self.slow) / (TREND_SLOW_S - TREND_FAST_S)

    @property
    def level(self) -> float:
        return self.fast + self.slope_per_s * TREND_FAST_S

    def expected(self, after_s: float) -> float:
        """The load ``after_s`` seconds from the last move, if the slope holds."""
        return self.level + self.slope_per_s * after_s

    def as_json(self) -> dict:
        return {"fast": round(self.fast, 4), "slow": round(self.slow, 4), "at": self.at.isoformat(),
                "rising_since": self.rising_since.isoformat() if self.rising_since else None}

    @classmethod
    def from_json(cls, data: object) -> Trend | None:
        """The trend stored by :meth:`as_json`; None for anything else (it restarts)."""
        if not isinstance(data, dict):
            return None
        try:
            at = datetime.fromisoformat(data["at"])
            rising = data.get("rising_since")
            trend = cls(float(data["fast"]), float(data["slow"]), at,
                        datetime.fromisoformat(rising) if rising else None)
        except (KeyError, TypeError, ValueError):
            return None
        aware = at.tzinfo is not None and (trend.rising_since is None or trend.rising_since.tzinfo is not None)
        if not aware or not (math.isfinite(trend.fast) and math.isfinite(trend.slow)):
            return None
        return trend


def follow(trend: Trend | None, demand: float, now: datetime) -> Trend:
    """``trend`` moved to ``demand`` (requests in flight) at ``now``; at most every
    :data:`TREND_STEP_S` (else unchanged), afresh after a gap of :data:`TREND_RESET_S`."""
    if trend is None:
        return Trend(float(demand), float(demand), now)
    dt = (now - trend.at).total_seconds()
    if dt > TREND_RESET_S or dt < 0:
        return Trend(float(demand), float(demand), now)
    if dt < TREND_STEP_S:
        return trend
    a, b = math.exp(-dt / TREND_FAST_S), math.exp(-dt / TREND_SLOW_S)
    return Trend(a * trend.fast + (1 - a) * demand, b * trend.slow + (1 - b) * demand, now, trend.rising_since)


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
    #: The load's trend, followed only where the rising rule may apply (module docstring).
    trend: Trend | None = None


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


def ramp_hold_s(policy: ScalingPolicy) -> float:
    """How long a load must rise before the rising rule steps (seconds)."""
    return max(RAMP_HOLD_S, policy.scale_up_after_s)


def ramp_applies(cold_start_s: float | None, policy: ScalingPolicy) -> bool:
    """Whether the rising rule may step for a model whose replicas take ``cold_start_s``
    to start: the policy allows it and the start is long against the reaction time."""
    return (policy.ramp and cold_start_s is not None
            and cold_start_s >= RAMP_COLD_START_FACTOR * policy.scale_up_after_s)


def evaluate(base: int, ceiling: int, load: Load | None, measured_per_replica: int | None, starting: bool,
             state: ScalingState, now: datetime, policy: ScalingPolicy,
             cold_start_s: float | None = None) -> Step:
    """One pass of the scaling rules for one model (see the module docstring).

    ``base``: replicas without load; ``ceiling``: max now (window max or model max);
    ``measured_per_replica``: benchmarked max concurrency for the profile in use, if any;
    ``starting``: a replica of the model is still placing, downloading or starting;
    ``cold_start_s``: how long its replicas take to start (the estimate of
    ``fleet.planning.warmth``), which the rising rule projects over.
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
    trend = None
    rising = ""
    if ramp_applies(cold_start_s, policy):
        trend = follow(state.trend, in_flight, now)
        rising = _rising(trend, capacity, current, cold_start_s + ramp_hold_s(policy))
        since = (trend.rising_since or now) if rising else None
        if since != trend.rising_since:
            trend = replace(trend, rising_since=since)

    def keep(extra: int, busy_since: datetime | None = None, quiet_since: datetime | None = None,
             crowded_since: datetime | None = None) -> ScalingState:
        return ScalingState(extra, busy_since, quiet_since, observed, crowded_since, trend)

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
    if rising and trend is not None and trend.rising_since is not None:
        rising_for = (now - trend.rising_since).total_seconds()
        if rising_for >= ramp_hold_s(policy) and current < ceiling and not starting:
            trend = replace(trend, rising_since=now)
            return Step(keep(extra + 1), current, current + 1,
                        f"scale up ahead of a rising load: {rising} (for {_fmt(rising_for)})")
        return Step(keep(extra))  # rising is never quiet
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


def _rising(trend: Trend, capacity: int | None, replicas: int, horizon_s: float) -> str:
    """The rising rule's verdict in words ("38 in flight, rising 1.6/min: 52 expected in
    3 min, over 80% of 2 × 24"), or "" when the load is not rising towards the capacity of
    ``replicas`` within ``horizon_s`` seconds."""
    if capacity is None or replicas < 1:
        return ""
    slope = trend.slope_per_s
    total = capacity * replicas
    level = trend.level
    expected = trend.expected(horizon_s)
    if slope <= 0 or level < RAMP_FLOOR * total or expected <= RAMP_TARGET * total:
        return ""
    return (f"{level:.0f} in flight, rising {slope * 60:.1f}/min: {expected:.0f} expected in {_fmt(horizon_s)}, "
            f"over {RAMP_TARGET:.0%} of {replicas} × {capacity}")
