"""Load scaling rules on an injected clock (fleet.planning.scaling), and through plan()."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from fleet.planning.planner import AgentView, ModelView, Policy, ProfileView, ReplicaView, Snapshot, plan
from fleet.planning.scaling import Load, ScalingPolicy, ScalingState, evaluate
from fleet.states import ReplicaState as S

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
POLICY = ScalingPolicy(scale_up_waiting=2.0, scale_up_after_s=30, scale_down_after_s=300)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def run(loads: list[tuple[float, Load | None]], base=1, ceiling=3, measured=None, starting=lambda t: False,
        state=ScalingState()):
    """Feed (time, load) samples through evaluate(); return the steps taken and the state."""
    taken = []
    for t, load in loads:
        step = evaluate(base, ceiling, load, measured, starting(t), state, at(t), POLICY)
        state = step.state
        if step.moved:
            taken.append((t, step.from_replicas, step.to_replicas, step.why))
    return taken, state


def busy(replicas=1, waiting_per_replica=2):
    return Load(replicas, running=4 * replicas, waiting=waiting_per_replica * replicas)


def quiet(replicas=2, running=0):
    return Load(replicas, running=running, waiting=0)


def test_waiting_held_for_scale_up_after_adds_one_replica():
    taken, state = run([(0, busy()), (10, busy()), (29, busy()), (30, busy())])
    assert [(t, a, b) for t, a, b, _ in taken] == [(30, 1, 2)]
    assert "2.0 waiting per replica for 30 s" in taken[0][3]
    assert state.extra == 1 and state.busy_since == at(30)


def test_a_spike_shorter_than_scale_up_after_adds_nothing():
    taken, state = run([(0, busy()), (20, busy()), (25, quiet(1)), (40, busy()), (60, busy())])
    assert taken == [] and state.extra == 0


def test_below_the_threshold_is_not_busy():
    taken, _ = run([(t, busy(waiting_per_replica=1)) for t in range(0, 120, 10)])
    assert taken == []


def test_no_second_step_while_a_replica_is_still_starting():
    starting = lambda t: 30 < t < 100  # the replica added at 30 s takes 70 s to start
    samples = [(t, busy()) for t in range(0, 130, 10)]
    taken, state = run(samples, starting=starting)
    assert [t for t, *_ in taken] == [30, 100]  # the second step waits for the first to start
    assert state.extra == 2


def test_never_past_the_ceiling():
    taken, state = run([(t, busy()) for t in range(0, 400, 10)], ceiling=2)
    assert [(a, b) for _, a, b, _ in taken] == [(1, 2)] and state.extra == 1


def test_a_quiet_spell_takes_one_added_replica_back():
    taken, state = run([(0, quiet()), (299, quiet()), (300, quiet())], state=ScalingState(extra=1))
    assert [(t, a, b) for t, a, b, _ in taken] == [(300, 2, 1)]
    assert "quiet for 5 min" in taken[0][3] and state.extra == 0


def test_never_below_base():
    taken, state = run([(t, quiet(1)) for t in range(0, 1000, 50)], state=ScalingState(extra=0))
    assert taken == [] and state.extra == 0


def test_unknown_load_neither_scales_up_nor_down_and_resets_timers():
    samples = [(0, busy()), (20, Load(1, None, 3)), (35, busy()), (50, busy())]
    taken, state = run(samples)
    assert taken == []  # the busy timer restarted at 35 s
    taken, state = run([(0, quiet()), (200, Load(2, 0, None)), (310, quiet())], state=ScalingState(extra=1))
    assert taken == [] and state.extra == 1 and state.quiet_since == at(310)
    taken, state = run([(0, None), (1000, None)], state=ScalingState(extra=1))
    assert taken == [] and state == ScalingState(extra=1)


def test_measured_capacity_makes_a_model_busy_with_empty_queues():
    over = Load(2, running=9, waiting=0)  # measured 4 per replica: 9 > 8
    taken, _ = run([(0, over), (30, over)], measured=4)
    assert [(a, b) for _, a, b, _ in taken] == [(1, 2)]
    assert "9 in flight over measured 4 × 2" in taken[0][3]
    taken, _ = run([(0, Load(2, 8, 0)), (30, Load(2, 8, 0))], measured=4)
    assert taken == []  # exactly at capacity is not over it


def test_seventy_percent_headroom_blocks_a_scale_down():
    # 3 replicas measured at 4 each; 6 running would leave 2 replicas at 6/8 = 75% > 70%.
    taken, state = run([(0, quiet(3, running=6)), (400, quiet(3, running=6))], measured=4,
                       state=ScalingState(extra=2))
    assert taken == [] and state.extra == 2
    # 5 running fits in 2 × 4 × 70% = 5.6: the replica is taken back.
    taken, _ = run([(0, quiet(3, running=5)), (300, quiet(3, running=5))], measured=4, state=ScalingState(extra=2))
    assert [(a, b) for _, a, b, _ in taken] == [(3, 2)]


def test_without_a_benchmark_a_queue_teaches_the_capacity_and_it_blocks_a_scale_down_that_would_queue_again():
    # One replica runs 4 with 3 waiting: a replica holds 4. After a step up, 6 running on two
    # replicas leave nothing waiting, but would not fit in one at 70% of 4.
    taken, state = run([(0, Load(1, 4, 3)), (30, Load(1, 4, 3)), (60, quiet(2, running=6)),
                        (400, quiet(2, running=6))])
    assert [(a, b) for _, a, b, _ in taken] == [(1, 2)] and state.extra == 1
    assert state.observed_per_replica == 4
    # Later the load falls to 2 running: fits in 1 × 4 × 70% = 2.8 → quiet for 5 min → one back.
    taken, state = run([(0, quiet(2, running=2)), (300, quiet(2, running=2))], state=state)
    assert [(a, b) for _, a, b, _ in taken] == [(2, 1)]
    assert "2 in flight fit in 1 × 4 seen at saturation at 70%" in taken[0][3]


def test_a_light_load_on_replicas_of_one_slot_still_scales_down():
    # Capacity 1: with two replicas, any pass running 1 would crowd a single one (1 > 0.7).
    # Spikes shorter than scale-up-after leave the quiet timer running.
    samples = [(t, quiet(2, running=1 if t % 25 == 10 else 0)) for t in range(0, 305, 5)]
    taken, state = run(samples, state=ScalingState(extra=1, observed_per_replica=1))
    assert [(t, a, b) for t, a, b, _ in taken] == [(300, 2, 1)]
    assert state.observed_per_replica is None  # back at base: learned afresh next time


def test_a_crowded_spell_as_long_as_scale_up_after_restarts_the_quiet_timer():
    state = ScalingState(extra=1, observed_per_replica=1)
    samples = [(0, quiet(2, 0)), (100, quiet(2, 1)), (120, quiet(2, 1)), (129, quiet(2, 1)), (130, quiet(2, 1)),
               (140, quiet(2, 0)), (400, quiet(2, 0)), (439, quiet(2, 0)), (440, quiet(2, 0))]
    taken, state = run(samples, state=state)
    assert [(t, a, b) for t, a, b, _ in taken] == [(440, 2, 1)]  # quiet since 140 s, not 0 s
    # A scale-down is never taken at a crowded pass, even when the quiet timer has run out.
    taken, _ = run([(0, quiet(2, 0)), (300, quiet(2, 1))], state=ScalingState(extra=1, observed_per_replica=1))
    assert taken == []


def test_with_a_measured_capacity_any_crowded_pass_restarts_the_quiet_timer():
    # Measured 4: 4 running would crowd one replica (> 2.8). The 70% rule (docs/architecture.md, R7), pass by pass.
    samples = [(0, quiet(2, 0)), (100, quiet(2, 4)), (110, quiet(2, 0)), (300, quiet(2, 0)), (409, quiet(2, 0)),
               (410, quiet(2, 0))]
    taken, _ = run(samples, measured=4, state=ScalingState(extra=1))
    assert [(t, a, b) for t, a, b, _ in taken] == [(410, 2, 1)]  # quiet since 110 s


def test_the_learned_capacity_is_the_most_seen_and_survives_unknown_load_and_idle_spells():
    taken, state = run([(0, Load(2, 3, 2)), (10, Load(2, 8, 1)), (20, Load(2, 5, 4)), (30, None), (40, quiet(2, 0)),
                        (50, Load(1, 0, 2))])  # nothing running while waiting (loading) teaches nothing
    assert state.observed_per_replica == 4
    assert evaluate(0, 3, quiet(), None, False, state, at(60), POLICY).state.observed_per_replica == 4


def test_a_benchmark_wins_over_the_learned_capacity():
    # Learned 2 per replica, measured 8: 5 running fits in 1 × 8 × 70% = 5.6.
    taken, _ = run([(0, quiet(2, running=5)), (300, quiet(2, running=5))], measured=8,
                   state=ScalingState(extra=1, observed_per_replica=2))
    assert [(a, b) for _, a, b, _ in taken] == [(2, 1)] and "measured" in taken[0][3]


def test_stopped_or_zero_base_forgets_load_scaling():
    step = evaluate(0, 3, busy(), None, False, ScalingState(extra=2, busy_since=T0), at(100), POLICY)
    assert step.state == ScalingState()


def test_plan_places_the_replica_a_scale_up_adds():
    agents = (AgentView(1, "a", last_seen_at=at(99), cpu_cores=8, memory_mib=8192),)
    profile = ProfileView(1, cpu_cores=1, memory_mib=256)
    m = ModelView(1, "m", profile, min_replicas=1, max_replicas=3, busy_since=at(0), load=busy())
    replicas = (ReplicaView(1, 1, 1, S.READY, (), 1, 256, in_flight=4),)
    result = plan(Snapshot(Policy(scaling=POLICY), agents, (m,), replicas), at(100))
    assert len(result.places) == 1
    assert result.models[1].scaled[:2] == (1, 2) and result.models[1].desired == 2
    assert result.models[1].scaling.extra == 1


# --- Rising loads (issue 18) -------------------------------------------------------------------

COLD = 150.0  # a cold start long enough for the rising rule (≥ 3 × scale_up_after_s)


def ramp(loads, base=2, ceiling=6, measured=24, starting=lambda t: False, cold_start_s=COLD, policy=POLICY,
         state=ScalingState()):
    """Feed (time, in flight) samples (nothing waiting) through evaluate() with a cold start."""
    taken = []
    for t, in_flight in loads:
        load = Load(base + state.extra, running=in_flight, waiting=0)
        step = evaluate(base, ceiling, load, measured, starting(t), state, at(t), policy, cold_start_s)
        state = step.state
        if step.moved:
            taken.append((t, step.from_replicas, step.to_replicas, step.why))
    return taken, state


def rising(from_s=0, to_s=900, start=10.0, per_min=2.0, every=3):
    return [(t, round(start + per_min * t / 60)) for t in range(from_s, to_s, every)]


def test_a_load_rising_towards_capacity_adds_a_replica_before_any_request_waits():
    taken, state = ramp(rising())
    assert taken, "no step ahead of the rise"
    t, before, after, why = taken[0]
    assert (before, after) == (2, 3)
    assert why.startswith("scale up ahead of a rising load:")
    slope = float(re.search(r"rising (\d+\.\d)/min", why).group(1))
    assert slope == pytest.approx(2.0, abs=0.5)  # the two averages lag, but they find the slope
    # Two replicas of 24 hold 48; the step comes while the load is still well under that.
    assert 10 + 2.0 * t / 60 < 0.8 * 48
    assert state.extra >= 1


def test_the_rising_load_must_hold_for_scale_up_after_and_a_spike_adds_nothing():
    spike = [(t, 10) for t in range(0, 600, 3)] + [(600 + t, 45) for t in range(0, 24, 3)] + \
        [(624 + t, 10) for t in range(0, 900, 3)]
    taken, state = ramp(spike)
    assert taken == [] and state.extra == 0


def test_no_step_ahead_while_a_replica_is_still_starting_and_none_past_the_ceiling():
    taken, _ = ramp(rising(per_min=4.0, to_s=1200), starting=lambda t: True)
    assert taken == []
    taken, _ = ramp(rising(per_min=4.0, to_s=1200), ceiling=2)
    assert taken == []


def test_a_short_cold_start_leaves_rising_loads_to_the_queue_rule():
    taken, state = ramp(rising(), cold_start_s=60)  # < 3 × 30 s
    assert taken == [] and state.trend is None


def test_without_a_capacity_nothing_is_projected_and_switched_off_nothing_is_followed():
    taken, state = ramp(rising(), measured=None)
    assert taken == [] and state.trend is not None  # followed, but nothing to project against
    off = ScalingPolicy(scale_up_waiting=2.0, scale_up_after_s=30, scale_down_after_s=300, ramp=False)
    taken, state = ramp(rising(), policy=off)
    assert taken == [] and state.trend is None


def test_a_rising_load_is_never_quiet_and_a_stalled_rise_is_taken_back_by_the_quiet_rule():
    # Rise, then flat at 20 in flight: the step ahead was not needed after all.
    samples = rising(to_s=480, per_min=4.0) + [(480 + t, 20) for t in range(0, 1800, 3)]
    taken, state = ramp(samples)
    ups = [s for s in taken if s[2] > s[1]]
    downs = [s for s in taken if s[2] < s[1]]
    assert ups and downs and downs[0][0] - ups[-1][0] >= 300
    assert state.extra == 0


def test_the_trend_moves_at_most_every_step_and_starts_afresh_after_a_gap():
    from fleet.planning.scaling import TREND_STEP_S, follow

    first = follow(None, 10, at(0))
    assert follow(first, 50, at(TREND_STEP_S - 1)) is first
    moved = follow(first, 50, at(TREND_STEP_S))
    assert moved.fast > moved.slow > 10 and moved.slope_per_s > 0
    fresh = follow(moved, 7, at(1000))
    assert (fresh.fast, fresh.slow) == (7, 7)


def test_a_trend_survives_its_json_and_a_damaged_one_starts_afresh():
    from fleet.planning.scaling import Trend

    trend = Trend(12.5, 10.25, at(30), at(15))
    assert Trend.from_json(trend.as_json()) == trend
    for bad in (None, {}, {"fast": "x", "slow": 1, "at": at(0).isoformat()}, {"fast": 1, "slow": 1, "at": "noon"},
                {"fast": 1, "slow": 1, "at": "2026-11-30T09:00:00"}, {"fast": float("nan"), "slow": 1,
                                                                         "at": at(0).isoformat()},
                {"fast": 1, "slow": 1, "at": at(0).isoformat(), "rising_since": "2026-11-30T09:00:00"}):
        assert Trend.from_json(bad) is None


def test_a_burst_of_a_minute_and_a_half_is_over_before_the_hold_and_adds_nothing():
    burst = [(t, 10) for t in range(0, 600, 3)] + [(600 + t, 40) for t in range(0, 90, 3)] + \
        [(690 + t, 10) for t in range(0, 900, 3)]
    taken, state = ramp(burst)
    assert taken == [] and state.extra == 0
