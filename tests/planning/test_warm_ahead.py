"""R11 in the planner: windows brought forward, replicas kept warm on a prediction — placed
last, on free room only, never evicting, evicted first, not placed again in a run once
evicted — and explained. No database; the clock is the ``now`` each test passes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from fleet.planning.planner import (
    AgentView, GpuView, ModelView, MoveCause, Place, Policy, ProfileView, ReplicaView, Snapshot, desired_replicas,
    plan, speculative, warm_ahead,
)
from fleet.planning.warmth import ColdStart, Prediction, UpcomingWindow
from fleet.states import ReplicaState as S

NOW = datetime(2026, 11, 30, 7, 57, tzinfo=timezone.utc)
GPU = ProfileView(id=1, gpus_needed=1, gpu_memory_mib=40960)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def later(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def agent(id: int = 1, gpus: int = 2) -> AgentView:
    return AgentView(id=id, name=f"gpu-{id}", last_seen_at=ago(1), gpus=tuple(GpuView(i, 81920) for i in range(gpus)))


def model(id: int, name: str, **kw) -> ModelView:
    return ModelView(id=id, name=name, profile=GPU, **kw)


def rep(id, model_id, state=S.READY, gpus=(0,), agent_id=1, **kw) -> ReplicaView:
    return ReplicaView(id=id, model_id=model_id, agent_id=agent_id, state=state, gpu_indices=tuple(gpus), **kw)


def snap(agents, models, replicas=(), **policy) -> Snapshot:
    return Snapshot(Policy(**policy), tuple(agents), tuple(models), tuple(replicas))


WINDOW = UpcomingWindow(later(180), 2, None, "mon-fri 08:00–19:00 (min 2)")  # opens at 08:00
PREDICTED = Prediction(warm_from=ago(60), run_end=later(3600), until=later(3600 + 600),
                       words="usually asked for on weekdays 08–09; warm until 09:10")


# --- Schedule pre-warm ----------------------------------------------------------------------


def test_a_window_is_placed_its_lead_ahead_of_its_start_with_the_measured_cold_start():
    m = model(1, "big", min_replicas=1, max_replicas=3, next_window=WINDOW, cold_start=ColdStart(150.0, 8))
    result = plan(snap([agent()], [m], [rep(10, 1)]), NOW)  # lead 187.5 s: from 07:56:52.5
    assert [a.model_id for a in result.places] == [1]
    outcome = result.models[1]
    assert outcome.desired == 2
    assert outcome.warm_ahead.startswith("pre-warm: window mon-fri 08:00–19:00 (min 2) starts in 180 s")
    assert "about 150 s (p90 of 8 starts)" in outcome.warm_ahead and outcome.warm_ahead in outcome.reason
    # The replica's own reason keeps it, once the window has opened and the outcome moved on.
    assert result.places[0].reason.endswith(f"({outcome.warm_ahead})")


def test_before_its_lead_the_window_waits_and_the_default_cold_start_applies_unmeasured():
    m = model(1, "big", min_replicas=1, max_replicas=3, next_window=WINDOW, cold_start=ColdStart(100.0, 8))
    assert desired_replicas(warm_ahead(m, Policy(), NOW), Policy(), NOW) == 1  # lead 125 s < 180 s
    unmeasured = model(1, "big", min_replicas=1, max_replicas=3, next_window=WINDOW)
    assert desired_replicas(warm_ahead(unmeasured, Policy(default_cold_start_s=150), NOW), Policy(), NOW) == 2
    assert desired_replicas(warm_ahead(unmeasured, Policy(default_cold_start_s=100), NOW), Policy(), NOW) == 1


def test_pre_warm_off_or_a_stopped_cluster_brings_nothing_forward():
    m = model(1, "big", min_replicas=1, max_replicas=3, next_window=WINDOW, cold_start=ColdStart(150.0, 8))
    assert plan(snap([agent()], [m], [rep(10, 1)], prewarm_windows=False), NOW).places == []
    stopped = plan(snap([agent()], [m], [rep(10, 1)], stopped=True), NOW)
    assert stopped.places == [] and stopped.models[1].warm_ahead == ""


# --- Predictive warmth ----------------------------------------------------------------------


def test_a_predicted_on_demand_model_is_kept_warm_and_says_why():
    m = model(1, "od", on_demand=True, idle_timeout_s=600, predicted=PREDICTED)
    result = plan(snap([agent()], [m]), NOW)
    assert [a.model_id for a in result.places] == [1]
    outcome = result.models[1]
    assert outcome.speculative and outcome.warm_ahead == "kept warm: " + PREDICTED.words
    assert not outcome.unservable and not outcome.forget_demand


def test_prediction_off_or_outside_its_span_keeps_nothing():
    m = model(1, "od", on_demand=True, predicted=PREDICTED)
    assert plan(snap([agent()], [m], predictive_warmth=False), NOW).places == []
    early = model(1, "od", on_demand=True, predicted=Prediction(later(60), later(3600), later(4200), "later"))
    assert plan(snap([agent()], [early]), NOW).places == []


def test_a_prediction_takes_only_free_room_after_every_wanted_model_and_never_evicts():
    # One free GPU; a wanted on-demand model and a predicted one: the wanted one gets it.
    wanted = model(1, "wanted", on_demand=True, wanted_at=ago(5))
    guess = model(2, "guess", on_demand=True, predicted=PREDICTED)
    idle = model(3, "idle", on_demand=True, wanted_at=ago(30))
    replicas = [rep(10, 3, gpus=(0,), last_used_at=ago(3000), in_flight=0)]
    result = plan(snap([agent()], [guess, wanted, idle], replicas, min_idle_before_eviction_s=60), NOW)
    assert [a.model_id for a in result.places] == [1]
    outcome = result.models[2]
    assert outcome.reason == (f"not kept warm ahead ({PREDICTED.words}): no free room (gpu-1: 0 free)")
    assert not outcome.unservable and result.moves == []  # idle was not evicted for a guess
    # It wants what it has: nothing shows it loading or waits for it, and it keeps nothing warm.
    assert (outcome.desired, outcome.speculative, outcome.warm_ahead) == (0, False, "")


def test_a_replica_kept_warm_on_a_prediction_is_evicted_first_for_any_model():
    guess = model(1, "guess", on_demand=True, predicted=PREDICTED)
    idle = model(2, "idle", on_demand=True, wanted_at=ago(100))
    pinned = model(3, "pinned", min_replicas=1, max_replicas=1)  # not on demand: R5 never evicts for it
    replicas = [rep(10, 1, gpus=(0,), in_flight=0, last_used_at=None),
                rep(11, 2, gpus=(1,), in_flight=0, last_used_at=ago(3000))]
    result = plan(snap([agent()], [guess, idle, pinned], replicas, min_idle_before_eviction_s=60), NOW)
    assert [(m.replica_id, m.to, m.cause) for m in result.moves] == [(10, S.DRAINING, MoveCause.EVICTION)]
    assert "evicted guess, kept warm ahead, not asked for, to place pinned" in result.moves[0].reason
    assert result.models[1].warm_evicted


def test_a_guess_still_starting_is_stopped_for_a_wanted_model():
    guess = model(1, "guess", on_demand=True, predicted=PREDICTED)
    wanted = model(2, "wanted", on_demand=True, wanted_at=ago(1))
    replicas = [rep(10, 1, state=S.STARTING, gpus=(0,), in_flight=None)]
    result = plan(snap([agent(gpus=1)], [guess, wanted], replicas), NOW)
    assert [(m.replica_id, m.to) for m in result.moves] == [(10, S.STOPPING)]


def test_once_evicted_a_prediction_places_nothing_again_until_its_next_run():
    guess = model(1, "guess", on_demand=True, predicted=PREDICTED, warm_evicted_at=ago(10))
    result = plan(snap([agent()], [guess]), NOW)
    assert result.places == [] and result.models[1].desired == 0
    assert result.models[1].reason.endswith("its replica was evicted for a wanted model in this run")
    before_run = model(1, "guess", on_demand=True, predicted=PREDICTED, warm_evicted_at=ago(3600))
    assert [a.model_id for a in plan(snap([agent()], [before_run]), NOW).places] == [1]


def test_a_used_guess_is_wanted_and_no_longer_speculative():
    m = model(1, "od", on_demand=True, idle_timeout_s=600, wanted_at=ago(5), predicted=PREDICTED)
    assert not speculative(warm_ahead(m, Policy(), NOW), Policy(), NOW)
    result = plan(snap([agent()], [m], [rep(10, 1, in_flight=0, last_used_at=ago(5))]), NOW)
    assert not result.models[1].speculative and result.models[1].warm_ahead == ""


def test_when_the_prediction_ends_an_unasked_replica_is_scaled_to_zero_as_idle():
    m = model(1, "od", on_demand=True, idle_timeout_s=600)  # the prediction no longer holds
    result = plan(snap([agent()], [m], [rep(10, 1, in_flight=0)]), NOW)
    assert [(x.replica_id, x.to, x.cause) for x in result.moves] == [(10, S.DRAINING, MoveCause.IDLE)]
    assert result.models[1].reason == "not asked for, and no request expected now: scaled to zero"
    assert not any(isinstance(a, Place) for a in result.actions)


# --- what the adversary found (issue 18's review) ---------------------------------------------


def test_an_evicted_guess_is_not_taken_back_while_the_model_it_made_room_for_waits():
    # Pass N evicted the guess (draining, in flight unknown); W waits for it. The guess is
    # planned after W: it must not cancel that drain, or W and it would trade it forever.
    guess = model(1, "guess", on_demand=True, predicted=PREDICTED, warm_evicted_at=ago(3))
    wanted = model(2, "wanted", on_demand=True, wanted_at=ago(5))
    replicas = [rep(10, 1, state=S.DRAINING, gpus=(0,), in_flight=None, state_changed_at=ago(3))]
    result = plan(snap([agent(gpus=1)], [guess, wanted], replicas), NOW)
    assert [(x.replica_id, x.to) for x in result.moves] == []
    assert result.models[2].reason.startswith("waiting for 1 replica on gpu-1 to stop")
    # Even a guess never evicted in this run does not cancel its own drain.
    fresh = model(1, "guess", on_demand=True, predicted=PREDICTED)
    assert plan(snap([agent(gpus=1)], [fresh], replicas), NOW).moves == []


def test_a_rolling_replacement_evicts_a_guess_for_its_surge_instead_of_replacing_in_place():
    pinned = model(1, "pinned", min_replicas=1, max_replicas=1, spec_hash="new")
    guess = model(2, "guess", on_demand=True, predicted=PREDICTED)
    replicas = [rep(10, 1, gpus=(0,), outdated=True, in_flight=0),
                rep(11, 2, gpus=(1,), in_flight=0)]
    result = plan(snap([agent()], [pinned, guess], replicas), NOW)
    assert [(x.replica_id, x.to, x.cause) for x in result.moves] == [(11, S.DRAINING, MoveCause.EVICTION)]
    assert "a surge once evicted guess, kept warm ahead" in result.models[1].reason


def test_a_guess_beside_a_draining_replica_makes_room_together_not_unservable():
    big = ProfileView(id=2, gpus_needed=2, gpu_memory_mib=40960)
    wanted = ModelView(id=1, name="wanted", profile=big, on_demand=True, wanted_at=ago(1))
    guess = model(2, "guess", on_demand=True, predicted=PREDICTED)
    gone = model(3, "gone", on_demand=True)
    replicas = [rep(10, 3, state=S.DRAINING, gpus=(0,), in_flight=1, state_changed_at=ago(5)),
                rep(11, 2, gpus=(1,), in_flight=0)]
    result = plan(snap([agent()], [wanted, guess, gone], replicas), NOW)
    outcome = result.models[1]
    assert not outcome.unservable and not outcome.forget_demand
    assert [(x.replica_id, x.to) for x in result.moves] == [(11, S.DRAINING)]


def test_a_guess_is_one_replica_whatever_load_scaling_had_added():
    guess = model(1, "guess", on_demand=True, max_replicas=3, predicted=PREDICTED, extra_replicas=2)
    result = plan(snap([agent(gpus=4)], [guess]), NOW)
    assert len(result.places) == 1 and result.models[1].desired == 1
    assert result.models[1].scaling.extra == 0
    one_up = model(1, "guess", on_demand=True, max_replicas=3, predicted=PREDICTED, extra_replicas=1)
    result = plan(snap([agent(gpus=4)], [one_up], [rep(10, 1, in_flight=0), rep(11, 1, gpus=(1,), in_flight=0)]),
                  NOW)
    assert [(x.replica_id, x.to) for x in result.moves] == [(11, S.DRAINING)]  # no drain then cancel


def test_the_ramp_waits_for_a_measured_cold_start():
    from fleet.planning.planner import Load
    from fleet.planning.scaling import Trend

    rising = Trend(fast=40.0, slow=30.0, at=ago(20), rising_since=ago(150))
    base = dict(min_replicas=2, max_replicas=4, load=Load(2, running=40, waiting=0), measured_per_replica=24,
                trend=rising)
    unknown = model(1, "m", **base)
    assert plan(snap([agent(gpus=4)], [unknown], [rep(10, 1), rep(11, 1, gpus=(1,))]), NOW).places == []
    measured = model(1, "m", cold_start=ColdStart(150.0, 5), **base)
    result = plan(snap([agent(gpus=4)], [measured], [rep(10, 1), rep(11, 1, gpus=(1,))]), NOW)
    assert len(result.places) == 1 and result.models[1].scaled[2].startswith("scale up ahead of a rising load")
