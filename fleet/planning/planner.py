"""The reconciler's pure core: ``plan(snapshot, now)`` → actions and explanations.

No ORM, no I/O, no clock of its own: everything it knows comes in the snapshot and ``now``
(docs/architecture.md, R1). The shell in ``fleet.control.reconciler`` loads the snapshot from
the database, applies the actions and stores the explanations. :class:`PlanningPass` runs the
reconciler rules, one method per rule; the functions under "Rules" are the pieces of them that
other code (the simulator, the operator surfaces) reads too. The data it reads and returns
lives in :mod:`fleet.planning.data`; its names are imported here too, so callers write
``planner.Snapshot``, ``planner.Place``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from fleet.planning.desired import (
    base_replicas, ceiling_now, cold_start_of, desired_replicas, idle_timeout_s, min_replicas_now, scaling_state,
    speculative, wanted_now, warm_ahead, warm_evicted,
)
from fleet.planning.scaling import Load, ScalingPolicy, ScalingState, Step, evaluate
from fleet.planning.data import fmt_s as _fmt_s
from fleet.planning.data import (
    AgentView, GpuView, ModelOutcome, ModelView, Move, MoveCause, Place, Plan, Policy, ProfileView, ReplicaView,
    Snapshot,
)
from fleet.planning.eviction import RoomRules
from fleet.planning.rolling import TransitionRules
from fleet.planning.rooms import Candidate, Room, RoomIndex, rank_rooms
from fleet.states import COMING_UP, COUNTS_TOWARDS_DESIRED, HOLDS_RESOURCES, ReplicaState

__all__ = [
    "AgentView", "GpuView", "Load", "ModelOutcome", "ModelView", "Move", "MoveCause", "Place", "Plan", "PlanningPass",
    "Policy", "ProfileView", "ReplicaView", "ScalingPolicy", "ScalingState", "Snapshot", "plan",
    # fleet.planning.desired, read through the planner by the simulator and the surfaces
    "base_replicas", "ceiling_now", "cold_start_of", "desired_replicas", "idle_timeout_s", "min_replicas_now",
    "scaling_state", "speculative", "wanted_now", "warm_ahead", "warm_evicted",
]

S = ReplicaState


# --- Rules ---------------------------------------------------------------------------------


def backoff_wait_s(failures: int, base_s: float, cap_s: float) -> float:
    """The wait after the ``failures``-th consecutive failure: ``base · 2^(n-1)`` seconds,
    capped at ``cap_s`` (0 for none; docs/architecture.md, R9). The gateway's watcher tells
    held requests the next try from the same rule (``fleet.live.watch``)."""
    return min(base_s * 2 ** (failures - 1), cap_s) if failures > 0 else 0.0


def backoff_remaining_s(model: ModelView, policy: Policy, now: datetime) -> float:
    """Seconds before a model with recently failed replicas may be placed again:
    :func:`backoff_wait_s` after its last failure (docs/architecture.md, R9)."""
    if not model.failures:
        return 0.0
    wait = backoff_wait_s(len(model.failures), policy.backoff_base_s, policy.backoff_cap_s)
    elapsed = (now - model.failures[-1]).total_seconds()
    return max(0.0, wait - elapsed)


def _age_s(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else (now - then).total_seconds()


def silent_for_s(agent: AgentView, policy: Policy, now: datetime) -> float | None:
    """Seconds an agent has been silent that count against it: since its last message, or
    since the control plane could listen again if that is later. None: never heard from
    (and no listening window to count from). docs/architecture.md, R9."""
    heard = agent.last_seen_at
    if policy.listening_since is not None and (heard is None or heard < policy.listening_since):
        heard = policy.listening_since
    return _age_s(now, heard)


def _group_reasons(reasons: list[str], limit: int = 6) -> str:
    """Join per-agent reasons, grouping identical causes ("12 agents: not connected")."""
    by_cause: dict[str, list[str]] = defaultdict(list)
    for reason in reasons:
        name, _, cause = reason.partition(": ")
        by_cause[cause or name].append(name)
    parts = []
    for cause, names in by_cause.items():
        if len(names) == 1:
            parts.append(f"{names[0]}: {cause}")
        else:
            shown = ", ".join(names[:3]) + ("…" if len(names) > 3 else "")
            parts.append(f"{len(names)} agents ({shown}): {cause}")
    text = "; ".join(parts[:limit])
    if len(parts) > limit:
        text += f"; and {len(parts) - limit} more causes"
    return text


# --- The pass --------------------------------------------------------------------------------


def plan(snapshot: Snapshot, now: datetime) -> Plan:
    """One reconcile pass: which replicas to place, drain, stop or mark lost, and why.

    Deterministic for a given snapshot and ``now`` (docs/architecture.md, R1); the rules and
    the order they run in are :class:`PlanningPass`'s.
    """
    return PlanningPass(snapshot, now).run()


class PlanningPass(TransitionRules, RoomRules):
    """One pass of the reconciler rules over one snapshot at one instant (docs/architecture.md,
    "Reconciler rules"). Build it with ``(snapshot, now)``, call :meth:`run` once.

    Which methods carry which rule:

    * R1 pure planner, thin shell: :meth:`run` (the shell is ``fleet.control.reconciler``).
    * R2 passes run at once for a wanted on-demand model: the shell's (``fleet.control.demand.want``
      requests a pass); a pass has nothing to wait for.
    * R3 placement: :meth:`_filter_agents`, :meth:`_count_free_room`, :meth:`_place`
      (with :meth:`_best_room`), :meth:`_explain_no_room`.
    * R4 a failed placement is forgotten: :meth:`_forget_failed_placement`.
    * R5 making room: :meth:`_make_room`, after :meth:`_room_being_freed` (both in
      ``fleet.planning.eviction``).
    * R6 use keeps demand alive, never-told is not idle: :meth:`_end_idle_demand` (and
      :meth:`_make_room`'s candidates).
    * R7 load scaling: :meth:`_scale_by_load`.
    * R8 scale-down and eviction drain: :meth:`_stop_drained`, :meth:`_cancel_drains`,
      :meth:`_take_away_surplus`.
    * R9 failures and lost agents: :meth:`_lose_silent_agents`, :meth:`_find_returning`,
      :meth:`_fail_not_taken_up`, :meth:`_settle_returning`, :meth:`_wait_out_backoff`,
      :meth:`_explain_crash_loop`.
    * R11 warm before demand: :meth:`_warm_ahead` (with :func:`warm_ahead`), :func:`speculative`
      and :func:`warm_evicted` in :meth:`_place`, :meth:`_make_room`, :meth:`_planning_order`,
      :meth:`_explain_warm_ahead`; the ramp is R7's (``fleet.planning.scaling``).
    * R10 rolling replacement: :meth:`_roll`; deleted models drain: :meth:`_drain_deleted`
      (both in ``fleet.planning.rolling``).
    * Beyond the list: :meth:`_count_desired` (min, max, schedule windows, demand, stopped
      cluster, external models), :meth:`_planning_order`, :meth:`_plan_model` (one model's
      steps), :meth:`_count_outcomes`.

    The working state below is all a pass keeps (slots: nothing else can be set). ``states``
    is each replica's state as the pass has moved it so far; the snapshot's own views never
    change.
    """

    __slots__ = ("snapshot", "now", "policy", "plan", "agents", "states", "silent", "stalled", "unusable",
                 "returning", "rooms", "room_index", "by_model", "steps", "models", "desired", "forgotten", "claimed",
                 "warm_evicted")

    #: The input; after :meth:`_scale_by_load` its models carry this pass's load-scaling extra.
    snapshot: Snapshot
    now: datetime
    policy: Policy
    #: The plan being built: actions in the order they are decided, outcomes per model.
    plan: Plan
    agents: dict[int, AgentView]
    #: Replica id → state after this pass's moves so far.
    states: dict[int, ReplicaState]
    #: Agents silent longer than ``agent_lost_after_s`` (or never heard from).
    silent: set[int]
    #: More than half the agents with work went silent together: the control plane stalled.
    stalled: bool
    #: Agent id → why it takes no new replica ("gpu-1: cordoned"), None when it may.
    unusable: dict[int, str | None]
    #: Lost replicas whose agent is heard from again.
    returning: set[int]
    #: Agent id → resources free on it, as the pass takes and gives them back.
    rooms: dict[int, Room]
    #: The usable rooms ranked for a placement's choice (R3), kept up to date by the rooms.
    room_index: RoomIndex
    #: Model id → all its replicas in the snapshot.
    by_model: dict[int, list[ReplicaView]]
    #: Model id → this pass's load-scaling step.
    steps: dict[int, Step]
    #: Model id → model (with this pass's extra replicas).
    models: dict[int, ModelView]
    #: Model id → replicas wanted; an eviction that takes a model's last replica sets it to 0.
    desired: dict[int, int]
    #: Models whose demand an eviction ended (their ``wanted_at`` is cleared).
    forgotten: set[int]
    #: Draining or stopping replicas some model already waits for, so no other waits for them.
    claimed: set[int]
    #: Models whose replica kept warm on a prediction this pass evicted (R11).
    warm_evicted: set[int]

    def __init__(self, snapshot: Snapshot, now: datetime) -> None:
        self.snapshot = snapshot
        self.now = now
        self.policy = snapshot.policy
        self.plan = Plan()
        self.agents = {a.id: a for a in snapshot.agents}
        self.states = {r.id: r.state for r in snapshot.replicas}
        self.silent = set()
        self.stalled = False
        self.unusable = {}
        self.returning = set()
        self.rooms = {}
        self.by_model = defaultdict(list)
        for r in snapshot.replicas:
            self.by_model[r.model_id].append(r)
        self.steps = {}
        self.models = {}
        self.desired = {}
        self.forgotten = set()
        self.claimed = set()
        self.warm_evicted = set()

    def run(self) -> Plan:
        """The pass, whole (docs/architecture.md, R1): a pure function of the snapshot and
        ``now``, no I/O; the shell applies the plan and stores the explanations.

        Order (it fixes the order of the actions): warm-ahead terms at this instant (R11);
        agents that went silent lose their
        replicas; agents are filtered and their free room counted; placements never taken
        up fail; drained replicas stop; load scaling moves each model's extra; replicas of
        deleted models drain or stop; then each model in :meth:`_planning_order`; then the
        counts and crash-loop explanations.
        """
        self._warm_ahead()
        self._lose_silent_agents()
        self._filter_agents()
        self._find_returning()
        self._count_free_room()
        self._fail_not_taken_up()
        self._stop_drained()
        self._scale_by_load()
        self._drain_deleted()
        self._count_desired()
        for m in sorted(self.snapshot.models, key=self._planning_order):
            self._plan_model(m)
        self._count_outcomes()
        return self.plan

    # R11 -------------------------------------------------------------------------------------

    def _warm_ahead(self) -> None:
        """Each model with this instant's warm-ahead terms (:func:`warm_ahead`: a window's
        floor brought forward, a predicted request): every later rule reads them."""
        policy, now = self.policy, self.now
        models = tuple(warm_ahead(m, policy, now) for m in self.snapshot.models)
        self.snapshot = replace(self.snapshot, models=models)
        self.models = {m.id: m for m in models}

    # R9 --------------------------------------------------------------------------------------

    def _lose_silent_agents(self) -> None:
        """Agents silent for ``agent_lost_after_s`` lose their replicas: those counting
        towards desired → lost (out of routing at once, re-placed elsewhere), draining ones →
        stopping; stopping ones are left for the agent (docs/architecture.md, R9). Silence
        counts from ``policy.listening_since`` at the earliest. When more than half of at
        least three agents with work went silent together, this control plane stalled:
        nothing is marked lost and a note says so (docs/architecture.md, decisions: lost
        agents vs a stalled control plane)."""
        snapshot, policy, now = self.snapshot, self.policy, self.now
        silence = {a.id: silent_for_s(a, policy, now) for a in snapshot.agents}
        stale = {
            a.id
            for a in snapshot.agents
            if silence[a.id] is None or silence[a.id] > policy.agent_lost_after_s
        }
        with_replicas = {r.agent_id for r in snapshot.replicas if r.state in HOLDS_RESOURCES}
        stale_with_work = stale & with_replicas
        recently_alive = {
            a.id for a in snapshot.agents if a.last_seen_at is not None and a.id in with_replicas
        }
        self.silent = stale
        self.stalled = len(recently_alive) >= 3 and len(stale_with_work) * 2 > len(recently_alive)
        if self.stalled:
            self.plan.notes.append(
                f"{len(stale_with_work)} of {len(recently_alive)} agents went silent at once: "
                "assuming the control plane stalled; marking none lost"
            )
            return
        actions, states = self.plan.actions, self.states
        for r in snapshot.replicas:
            if r.agent_id in stale and r.state in HOLDS_RESOURCES:
                age = silence[r.agent_id]
                heard = "never heard from" if age is None else f"silent for {_fmt_s(age)}"
                if r.state in COUNTS_TOWARDS_DESIRED:
                    actions.append(Move(r.id, S.LOST, f"agent {self.agents[r.agent_id].name} {heard}",
                                        MoveCause.AGENT_SILENT))
                    states[r.id] = S.LOST
                elif r.state == S.DRAINING:  # on its way out anyway: never to run again
                    actions.append(Move(r.id, S.STOPPING, f"agent {self.agents[r.agent_id].name} {heard}",
                                        MoveCause.AGENT_SILENT))
                    states[r.id] = S.STOPPING
                # stopping: the agent stops it when back, or reconnects without it (fleet.control.reports)

    def _find_returning(self) -> None:
        """Lost replicas whose agent is heard from again: their engines may still run there,
        so they keep their resources until :meth:`_settle_returning` decides
        (docs/architecture.md, R9: duplicates are reconciled away on return)."""
        states, agents, silent = self.states, self.agents, self.silent
        self.returning = {
            r.id for r in self.snapshot.replicas
            if states[r.id] == S.LOST and r.agent_id in agents and r.agent_id not in silent
        }

    def _fail_not_taken_up(self) -> None:
        """A replica placed on a usable agent that has not taken it up (still placing) within
        ``placing_timeout_s`` fails, and so is replaced with backoff instead of blocking the
        model forever; its resources come back (docs/architecture.md, R9)."""
        policy, now, states, rooms = self.policy, self.now, self.states, self.rooms
        for r in self.snapshot.replicas:
            if states[r.id] != S.PLACING or r.state_changed_at is None:
                continue
            waited = (now - r.state_changed_at).total_seconds()
            if waited >= policy.placing_timeout_s and not self.unusable.get(r.agent_id):
                self.plan.actions.append(Move(r.id, S.FAILED, f"agent {self.agents[r.agent_id].name} did not take "
                                                              f"it up within {_fmt_s(policy.placing_timeout_s)}",
                                              MoveCause.NOT_TAKEN_UP))
                states[r.id] = S.FAILED
                if r.agent_id in rooms:
                    rooms[r.agent_id].give_back(r)

    def _settle_returning(self, m: ModelView) -> None:
        """Lost replicas of ``m`` whose agent came back (docs/architecture.md, R9: "when it
        returns, duplicates are reconciled away"). Ready replicas elsewhere are kept and the
        returning ones stop first; while the others are not ready yet, a returning replica
        reported ready is taken back instead, and the others become the surplus."""
        replicas, returning, states = self.by_model[m.id], self.returning, self.states
        back = sorted((r for r in replicas if r.id in returning), key=lambda r: r.id)
        if not back:
            return
        desired = self.desired[m.id]
        ready_elsewhere = sum(1 for r in replicas if r.id not in returning and states[r.id] == S.READY)
        room = max(0, desired - ready_elsewhere)
        for r in back:
            name = self.agents[r.agent_id].name
            if r.back and room > 0:
                room -= 1
                self.plan.actions.append(Move(r.id, S.READY, f"agent {name} came back with the engine ready",
                                              MoveCause.AGENT_BACK))
                states[r.id] = S.READY
            elif room == 0:
                self.plan.actions.append(Move(
                    r.id, S.STOPPING,
                    f"duplicate: agent {name} came back, {ready_elsewhere} ready elsewhere ({desired} wanted)",
                    MoveCause.DUPLICATE,
                ))
                states[r.id] = S.STOPPING
            # else: its engine is not ready (yet) and it may still be needed: wait for its report.

    def _wait_out_backoff(self, m: ModelView, outcome: ModelOutcome) -> bool:
        """True (and the crash loop explained) while ``m``'s recent failures still hold off
        its next placement: ``backoff_base_s · 2^(n-1)`` after the n-th failure in a row,
        capped (docs/architecture.md, R9)."""
        wait = backoff_remaining_s(m, self.policy, self.now)
        if wait <= 0:
            return False
        outcome.reason = (
            f"crash loop: {len(m.failures)} failure(s) in a row, next try in {_fmt_s(wait)}"
            + (f"; last error: {m.last_error}" if m.last_error else "")
        )
        return True

    def _explain_crash_loop(self, m: ModelView, outcome: ModelOutcome) -> None:
        """Between two failures the next attempt is coming up: a model with failures, none
        ready and some wanted is still in a crash loop, and says so (docs/architecture.md,
        R9)."""
        if m.failures and not outcome.ready and outcome.desired and not outcome.reason.startswith("crash loop"):
            outcome.reason = (f"crash loop: {len(m.failures)} failure(s) in a row, trying again ({outcome.reason})"
                              + (f"; last error: {m.last_error}" if m.last_error else ""))

    # R3, R4 ----------------------------------------------------------------------------------

    def _filter_agents(self) -> None:
        """Which agents may take new replicas: not silent (unless the control plane stalled),
        connected, not cordoned; each other one with its reason (docs/architecture.md, R3)."""
        silent, stalled = self.silent, self.stalled
        for a in self.snapshot.agents:
            if a.id in silent and not stalled:
                self.unusable[a.id] = f"{a.name}: not heard from"
            elif not a.connected:
                self.unusable[a.id] = f"{a.name}: not connected"
            elif a.cordoned:
                self.unusable[a.id] = f"{a.name}: cordoned"
            else:
                self.unusable[a.id] = None

    def _count_free_room(self) -> None:
        """Free GPUs, cores and memory per agent after every replica that still holds some,
        returning lost ones included (docs/architecture.md, R3)."""
        rooms, states, returning = self.rooms, self.states, self.returning
        for a in self.snapshot.agents:
            rooms[a.id] = Room(a, {g.index: g.memory_total_mib for g in a.gpus}, a.cpu_cores, a.memory_mib)
        for r in self.snapshot.replicas:
            if (states[r.id] in HOLDS_RESOURCES or r.id in returning) and r.agent_id in rooms:
                room = rooms[r.agent_id]
                for idx in r.gpu_indices:
                    room.free_gpus.pop(idx, None)
                room.free_cores -= r.cpu_cores
                room.free_memory_mib -= r.memory_mib
        self.room_index = RoomIndex(rooms, self.unusable)

    def _place(self, m: ModelView, missing: int, active: list[ReplicaView], outcome: ModelOutcome) -> None:
        """Place up to ``missing`` replicas of ``m`` (which has a profile), one at a time on the
        best candidate (docs/architecture.md, R3). When none fits: wait for room already being
        freed, else make room (on-demand models, R5), else explain and give up (R3, R4)."""
        assert m.profile is not None
        placed_here: dict[int, int] = defaultdict(int)
        placed = 0
        for _ in range(missing):
            guess = speculative(m, self.policy, self.now)
            if guess and warm_evicted(m):
                self._not_kept_warm(m, outcome, "its replica was evicted for a wanted model in this run")
                break
            best, reasons = self._best_room(m, active, placed_here)
            if best is None and guess:
                # A prediction takes only room nobody wants (R11): no wait, no eviction, and
                # nobody is told it is unservable — nobody asked.
                self._not_kept_warm(m, outcome, f"no free room ({_group_reasons(reasons, 3)})")
                break
            if best is None:
                waiting_for = self._room_being_freed(m)
                if waiting_for:
                    # Replicas already draining or stopping will free enough: wait for them
                    # rather than evict more, and do not tell held requests it is hopeless.
                    outcome.reason = f"waiting for {waiting_for} to stop, then placing {m.name}"
                    break
                # Room kept warm on a prediction yields to any model (R11); an on-demand
                # model may also take idle replicas of other on-demand models (R5).
                evicted = self._make_room(m, others_idle=m.on_demand)
                if evicted:
                    outcome.reason = evicted
                else:
                    self._explain_no_room(m, reasons, outcome)
                    self._forget_failed_placement(m, outcome)
                break
            _, agent_id, gpus = best
            placed_here[agent_id] += 1
            placed += 1
            n = len(active) + placed
            why = outcome.warm_ahead
            outcome.reason = self._place_at(
                m, agent_id, gpus,
                lambda where: f"placed on {where}: {n} of {self.desired[m.id]} wanted" + (f" ({why})" if why else ""))

    def _not_kept_warm(self, m: ModelView, outcome: ModelOutcome, why: str) -> None:
        """A guess placed nothing: it wants what it has (nothing shows it "loading", nothing
        waits for it) and says why, with the habit it would have kept warm (R11)."""
        assert m.predicted is not None
        outcome.reason = f"not kept warm ahead ({m.predicted.words}): {why}"
        outcome.warm_ahead = ""
        outcome.speculative = False
        self.desired[m.id] = outcome.desired = len(self._active(m.id))

    def _place_at(self, m: ModelView, agent_id: int, gpus: tuple[int, ...], reason_for: Callable[[str], str]) -> str:
        """Place one replica of ``m`` on ``agent_id`` (GPUs ``gpus`` from :meth:`Room.fit`),
        taking its room; ``reason_for`` turns where ("gpu-1 GPU 0") into the reason, returned."""
        assert m.profile is not None
        room = self.rooms[agent_id]
        room.take(gpus, m.profile)
        where = room.agent.name + (f" GPU {','.join(map(str, gpus))}" if gpus else "")
        why = reason_for(where)
        self.plan.actions.append(
            Place(m.id, agent_id, gpus,
                  0.0 if m.profile.gpus_needed else m.profile.cpu_cores,
                  0 if m.profile.gpus_needed else m.profile.memory_mib, why)
        )
        return why

    def _best_room(
        self, m: ModelView, active: list[ReplicaView], placed_here: dict[int, int],
    ) -> tuple[Candidate | None, list[str]]:
        """The agent that takes one replica of ``m`` — fewest of its replicas there (spread
        across machines), then least room left (pack), then name — as ``(key, agent id, GPU
        indices)``; or None and why each agent cannot (docs/architecture.md, R3). The index
        finds it without looking at every agent; the reasons, wanted only when nothing
        fits, look at every one (``rooms.rank_rooms``)."""
        assert m.profile is not None
        per_agent: dict[int, int] = defaultdict(int)
        for r in active:
            per_agent[r.agent_id] += 1
        for agent_id, n in placed_here.items():
            per_agent[agent_id] += n
        best = self.room_index.best(m.profile, per_agent)
        if best is not None:
            return best, []
        return None, rank_rooms(self.rooms, self.unusable, m.profile, per_agent)[1]

    def _explain_no_room(self, m: ModelView, reasons: list[str], outcome: ModelOutcome) -> None:
        """Nothing fits ``m``: say what it needs and why each agent cannot take it, grouped
        by cause; the model is unservable (the gateway answers 503 with the reason)
        (docs/architecture.md, R3)."""
        assert m.profile is not None
        detail = _group_reasons(reasons) if reasons else "no agents registered"
        outcome.reason = f"no agent has {m.profile.describe()}; {detail}"
        outcome.unservable = True

    def _forget_failed_placement(self, m: ModelView, outcome: ModelOutcome) -> None:
        """Nobody is served by wanting an unplaceable on-demand model on: its demand is
        cleared, so the next request wants it afresh and that pass decides anew
        (docs/architecture.md, R4)."""
        outcome.forget_demand = m.on_demand

    def _explain_warm_ahead(self, m: ModelView, outcome: ModelOutcome) -> None:
        """Say what warm-before-demand did for ``m`` at this pass (R11): a window's floor
        brought forward, or a replica kept warm on a prediction (``outcome.speculative``)."""
        if self.policy.stopped or m.external:
            return
        if m.ahead is not None and (m.window_min if m.window_min is not None else m.min_replicas) < m.ahead.min_replicas:
            outcome.warm_ahead = m.ahead.words
        elif speculative(m, self.policy, self.now):
            outcome.speculative = True
            assert m.predicted is not None
            outcome.warm_ahead = f"kept warm: {m.predicted.words}"

    # R6 --------------------------------------------------------------------------------------

    def _end_idle_demand(self, m: ModelView, outcome: ModelOutcome) -> None:
        """An on-demand model with no floor, not wanted within its idle timeout (counted
        from its last request or use: ``wanted_at`` moves forward by use), has its demand
        forgotten and is scaled to zero (docs/architecture.md, R6). One kept warm on a
        prediction that no longer holds, never asked for, is scaled to zero too (R11)."""
        if self.policy.stopped or not m.on_demand:
            return
        if m.wanted_at is None:
            if m.min_replicas == 0 and base_replicas(m, self.policy, self.now) == 0 and self._active(m.id):
                outcome.reason = "not asked for, and no request expected now: scaled to zero"
            return
        if base_replicas(m, self.policy, self.now) == 0:
            outcome.forget_demand = True
            idle = (self.now - m.wanted_at).total_seconds()
            timeout = idle_timeout_s(m, self.policy)
            outcome.reason = f"idle for {_fmt_s(idle)} (timeout {_fmt_s(timeout)}): scaled to zero"

    # R7 --------------------------------------------------------------------------------------

    def _scale_by_load(self) -> None:
        """One load-scaling step per model between its base and its ceiling (window max or
        max), never while one of its replicas is coming up (docs/architecture.md, R7; the
        rules are ``fleet.planning.scaling.evaluate``'s). Runs before :meth:`_count_desired`,
        which reads the extra replicas it moves."""
        policy, now, states, by_model = self.policy, self.now, self.states, self.by_model
        scaled_models = []
        for m in self.snapshot.models:
            # A guess is one replica, never scaled by load (R11); once used it is wanted and scales.
            guess = speculative(m, policy, now)
            base = base_replicas(m, policy, now) if not policy.stopped and not guess else 0
            starting = any(states[r.id] in COMING_UP for r in by_model[m.id])
            # The ramp projects over a measured cold start only: unknown is not long (R7, R11).
            measured = m.cold_start.estimate_s if m.cold_start is not None and m.cold_start.measured else None
            step = evaluate(base, ceiling_now(m), m.load, m.measured_per_replica, starting, scaling_state(m),
                            now, policy.scaling, measured)
            self.steps[m.id] = step
            extra = step.state.extra
            scaled_models.append(m if extra == m.extra_replicas else replace(m, extra_replicas=extra))
        self.snapshot = replace(self.snapshot, models=tuple(scaled_models))
        self.models = {m.id: m for m in self.snapshot.models}

    # R8 --------------------------------------------------------------------------------------

    def _stop_drained(self) -> None:
        """Draining replicas stop once nothing is known to be in flight, or when the drain
        grace is over (docs/architecture.md, R8)."""
        policy, now, states, actions = self.policy, self.now, self.states, self.plan.actions
        for r in self.snapshot.replicas:
            if states[r.id] != S.DRAINING:
                continue
            draining_for = _age_s(now, r.state_changed_at) or 0.0
            if r.in_flight == 0:
                actions.append(Move(r.id, S.STOPPING, "drained: no requests in flight", MoveCause.DRAINED))
                states[r.id] = S.STOPPING
            elif draining_for >= policy.drain_grace_s:
                flight = "unknown" if r.in_flight is None else str(r.in_flight)
                actions.append(
                    Move(r.id, S.STOPPING, f"drain grace of {_fmt_s(policy.drain_grace_s)} over ({flight} in flight)",
                         MoveCause.DRAIN_GRACE_OVER)
                )
                states[r.id] = S.STOPPING

    def _cancel_drains(self, m: ModelView, missing: int) -> int:
        """A replica of ``m`` still draining on a usable agent is warm: serving again beats a
        cold start (unless it is outdated, R10). Up to ``missing`` of them, newest first, are
        ready again; returns how many (docs/architecture.md, R8). Not one another model
        waits for (``claimed``: that would take back the room it was drained for), and never
        for a model kept warm on a prediction alone (its drain is an eviction, R11)."""
        states, unusable = self.states, self.unusable
        if speculative(m, self.policy, self.now):
            return 0  # a guess's drain is an eviction (R11): it stays evicted
        warm = (r for r in self.by_model[m.id]
                if states[r.id] == S.DRAINING and not r.outdated and not unusable.get(r.agent_id)
                and r.id not in self.claimed)
        draining = sorted(warm, key=lambda r: -r.id)[:missing]
        for r in draining:
            self.plan.actions.append(Move(r.id, S.READY, "wanted again: drain cancelled", MoveCause.WANTED_AGAIN))
            states[r.id] = S.READY
        return len(draining)

    def _take_away_surplus(self, m: ModelView, active: list[ReplicaView], count: int,
                           outcome: ModelOutcome) -> None:
        """``count`` of ``m``'s active replicas go, chosen by :func:`_surplus`: ready ones
        drain (stop routing, stop after in flight ends), others stop; the cause is the
        stopped cluster, idleness or plain surplus (docs/architecture.md, R8, R7)."""
        cause = (MoveCause.CLUSTER_STOPPED if self.policy.stopped
                 else MoveCause.IDLE if outcome.forget_demand or (m.on_demand and self.desired[m.id] == 0)
                 else MoveCause.SURPLUS)
        states = self.states
        for r in _surplus(active, count):
            why = outcome.reason or f"surplus: {len(active)} running, {self.desired[m.id]} wanted"
            to = S.DRAINING if states[r.id] == S.READY else S.STOPPING
            self.plan.actions.append(Move(r.id, to, why, cause))
            states[r.id] = to  # a stopping one holds its resources until the agent reports it stopped

    # Beyond the numbered rules ---------------------------------------------------------------

    def _count_desired(self) -> None:
        """Replicas wanted per model: 0 when the cluster is stopped or the model external,
        else its base (schedule window's min or its own min; one for an on-demand model
        wanted within its idle timeout) plus the load-scaling extra, capped at its ceiling
        (:func:`desired_replicas`)."""
        policy, now = self.policy, self.now
        self.desired = {m.id: desired_replicas(m, policy, now) for m in self.snapshot.models}

    def _planning_order(self, m: ModelView) -> tuple:
        """Sort key: models with a floor first, then on-demand ones by when they were wanted
        (longest waiting first), then those kept warm only on a prediction (R11: room goes
        to demand first), then by name — who gets scarce room first."""
        return (m.on_demand, speculative(m, self.policy, self.now), m.wanted_at or self.now, m.name)

    def _active(self, model_id: int) -> list[ReplicaView]:
        """The model's replicas that count towards desired, in their states so far."""
        states = self.states
        return [r for r in self.by_model[model_id] if states[r.id] in COUNTS_TOWARDS_DESIRED]

    def _plan_model(self, m: ModelView) -> None:
        """One model's share of the pass: its outcome (desired, scaling step, reason), then
        the rules in turn — external and stopped models explained, idle demand ended (R6),
        returning replicas settled (R9), drains cancelled (R8), outdated replicas replaced
        (R10, which then decides the placements), then missing replicas are placed (R3,
        after the crash-loop backoff, R9), or surplus ones go (R8)."""
        step = self.steps[m.id]
        desired = self.desired[m.id]
        outcome = ModelOutcome(desired=desired, scaling=step.state,
                               scaled=(step.from_replicas, step.to_replicas, step.why) if step.moved else None)
        self.plan.models[m.id] = outcome
        self._explain_warm_ahead(m, outcome)
        if m.external:
            outcome.reason = "external: served at its base URL, nothing to place"
            return
        stopped = self.policy.stopped
        if stopped:
            outcome.reason = "cluster stopped"
        self._end_idle_demand(m, outcome)
        if self.returning:
            self._settle_returning(m)
        active = self._active(m.id)
        missing = desired - len(active)
        if missing > 0 and not stopped:
            cancelled = self._cancel_drains(m, missing)
            if cancelled:
                missing -= cancelled
                active = self._active(m.id)
        if self._roll(m, outcome):
            return
        active = self._active(m.id)
        missing = desired - len(active)
        if missing > 0 and m.profile is None:
            outcome.reason = "no engine profile: cannot place"
            outcome.unservable = True
        elif missing > 0:
            if not self._wait_out_backoff(m, outcome):
                self._place(m, missing, active, outcome)
        elif missing < 0:
            self._take_away_surplus(m, active, -missing, outcome)
        elif not outcome.reason and desired > 0:
            outcome.reason = f"{desired} wanted, all placed"
        if not outcome.reason and desired == 0:
            outcome.reason = "not wanted: 0 replicas" if not m.on_demand else "on demand: cold until asked for"
        if outcome.warm_ahead and outcome.warm_ahead not in outcome.reason:
            outcome.reason = f"{outcome.reason} ({outcome.warm_ahead})"

    def _count_outcomes(self) -> None:
        """Each model's active and ready counts after the pass (placements counted as
        active), demand forgotten by evictions, and crash-loop explanations (R9)."""
        states = self.states
        placed: dict[int, int] = defaultdict(int)
        for p in self.plan.places:
            placed[p.model_id] += 1
        for m in self.snapshot.models:
            outcome = self.plan.models[m.id]
            if m.id in self.forgotten:
                outcome.forget_demand = True
                outcome.desired = self.desired[m.id]
            outcome.warm_evicted = m.id in self.warm_evicted
            reps = self.by_model[m.id]
            outcome.active = sum(1 for r in reps if states[r.id] in COUNTS_TOWARDS_DESIRED) + placed[m.id]
            outcome.ready = sum(1 for r in reps if states[r.id] == S.READY)
            self._explain_crash_loop(m, outcome)


def _surplus(active: list[ReplicaView], count: int) -> list[ReplicaView]:
    """Which replicas to take away: outdated before current (R10), not-yet-ready before
    ready, idle before busy, newest first (docs/architecture.md, R8). Reads each replica's
    state in the snapshot."""

    def key(r: ReplicaView) -> tuple:
        coming = r.state in COMING_UP
        flight = r.in_flight if r.in_flight is not None else 1 << 30
        return (not r.outdated, not coming, flight, -r.id)

    return sorted(active, key=key)[:count]
