"""Making room, as part of :class:`fleet.planning.planner.PlanningPass` (docs/architecture.md,
R5 and R11): waiting for room already being freed, evicting replicas kept warm on a
prediction first (for any model) and then, for an on-demand model, idle replicas of other
on-demand models, least recently used first. Kept apart from ``planner.py`` for its length;
pure like it (no ORM, no clock).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from fleet.planning.data import ModelView, Move, MoveCause, ReplicaView, fmt_s
from fleet.planning.desired import min_replicas_now, speculative
from fleet.states import COMING_UP, COUNTS_TOWARDS_DESIRED, RELEASING, ReplicaState

S = ReplicaState


class RoomRules:
    """R5 and R11's evictions, mixed into ``PlanningPass`` (whose working state they use:
    ``states``, ``rooms``, ``claimed``, ``models``, ``by_model``, ``desired``, ``forgotten``,
    ``warm_evicted``, ``unusable``, ``plan``)."""

    __slots__ = ()

    # R5 --------------------------------------------------------------------------------------

    def _room_being_freed(self, m: ModelView) -> str | None:
        """If replicas already draining or stopping (and not awaited by another model this
        pass) will make room for ``m`` on a usable agent, claim them and name them
        ("2 replicas on gpu-1"); else None (docs/architecture.md, R5: wait rather than
        evict more)."""
        assert m.profile is not None
        states, unusable, rooms = self.states, self.unusable, self.rooms
        releasing: dict[int, list[ReplicaView]] = defaultdict(list)
        for r in self.snapshot.replicas:
            if states[r.id] in RELEASING and r.id not in self.claimed and not unusable.get(r.agent_id):
                releasing[r.agent_id].append(r)
        for agent_id in sorted(releasing, key=lambda a: rooms[a].agent.name if a in rooms else ""):
            if agent_id not in rooms:
                continue
            room = rooms[agent_id]
            trial = replace(room, free_gpus=dict(room.free_gpus))
            for r in releasing[agent_id]:
                trial.give_back(r)
            _, why = trial.fit(m.profile)
            if why is None:
                self.claimed.update(r.id for r in releasing[agent_id])
                n = len(releasing[agent_id])
                return f"{n} replica{'s' if n > 1 else ''} on {room.agent.name}"
        return None

    def _make_room(self, m: ModelView, others_idle: bool = True) -> str | None:
        """Evict replicas of other on-demand models so ``m`` fits; the reason, or None
        (docs/architecture.md, R5, R11).

        Replicas kept warm only on a prediction go first, for any model (R11): ready ones
        with nothing in flight, and ones still coming up (nothing routes to them yet),
        however recently used. Then, if ``others_idle`` (``m`` is on demand, R5), only ready
        replicas known idle (R6: never told is not idle) for
        ``min_idle_before_eviction_s`` with nothing in flight, of on-demand models kept at or
        above their min, least recently used first, on one agent. The evicted replicas drain
        (R8), or stop if not ready yet; ``m`` is placed on a later pass once they have
        stopped. A model that loses its last replica so has its demand forgotten and 0 wanted.
        """
        assert m.profile is not None
        policy, now, states, models = self.policy, self.now, self.states, self.models
        left: dict[int, int] = {mid: len([r for r in reps if states[r.id] in COUNTS_TOWARDS_DESIRED])
                                for mid, reps in self.by_model.items()}
        candidates = []
        for r in self.snapshot.replicas:
            other = models.get(r.model_id)
            if other is None or other.id == m.id or not other.on_demand or self.unusable.get(r.agent_id):
                continue
            if speculative(other, policy, now):
                if (states[r.id] == S.READY and r.in_flight == 0) or states[r.id] in COMING_UP:
                    candidates.append((0, 0.0, r.id, r, None))
                continue
            if not others_idle or states[r.id] != S.READY:
                continue
            if r.last_used_at is None or r.in_flight != 0:
                continue  # unknown idleness or busy: never evicted
            idle = (now - r.last_used_at).total_seconds()
            if idle < policy.min_idle_before_eviction_s:
                continue
            candidates.append((1, r.last_used_at.timestamp(), r.id, r, idle))
        candidates.sort(key=lambda c: c[:3])

        trial = {aid: replace(room, free_gpus=dict(room.free_gpus)) for aid, room in self.rooms.items()}
        # Room already on its way back (draining, stopping, not awaited by another model) counts
        # too: fewer evictions, and a guess evicted beside a draining replica makes room where
        # neither alone would.
        releasing: dict[int, list[int]] = defaultdict(list)
        for r in self.snapshot.replicas:
            if states[r.id] in RELEASING and r.id not in self.claimed and r.agent_id in trial \
                    and not self.unusable.get(r.agent_id):
                trial[r.agent_id].give_back(r)
                releasing[r.agent_id].append(r.id)
        chosen: dict[int, list[tuple[ReplicaView, float | None]]] = defaultdict(list)
        for _, _, _, r, idle in candidates:
            if left[r.model_id] - 1 < min_replicas_now(models[r.model_id]):
                continue
            left[r.model_id] -= 1
            trial[r.agent_id].give_back(r)
            chosen[r.agent_id].append((r, idle))
            _, why = trial[r.agent_id].fit(m.profile)
            if why is None:
                self.claimed.update(releasing[r.agent_id])
                return self._evict(m, chosen[r.agent_id])
        return None

    def _evict(self, m: ModelView, victims: list[tuple[ReplicaView, float | None]]) -> str:
        """Drain ``victims`` (replica, seconds idle; None: kept warm on a prediction, R11)
        to place ``m`` — stop those not ready yet; the joined reasons (docs/architecture.md,
        R5, R8)."""
        states, by_model = self.states, self.by_model
        names = []
        for victim, victim_idle in victims:
            victim_model = self.models[victim.model_id]
            why = "kept warm ahead, not asked for" if victim_idle is None else f"idle {fmt_s(victim_idle)}"
            text = f"evicted {victim_model.name}, {why}, to place {m.name}"
            to = S.DRAINING if states[victim.id] == S.READY else S.STOPPING
            self.plan.actions.append(Move(victim.id, to, text, MoveCause.EVICTION))
            states[victim.id] = to
            if victim_idle is None:
                self.warm_evicted.add(victim_model.id)
            remaining = [x for x in by_model[victim.model_id] if states[x.id] in COUNTS_TOWARDS_DESIRED]
            if not remaining:
                self.forgotten.add(victim_model.id)
                self.desired[victim_model.id] = 0
            names.append(text)
        return "; ".join(names) + " (placing once they stop)"
