"""The rules for the catalog's two transitions, as part of :class:`fleet.planning.planner.PlanningPass`
(docs/architecture.md, "Reconciler rules"): R10, rolling replacement of replicas started from
an outdated spec, and the drain of replicas whose model was deleted. Kept apart from
``planner.py`` for its length; pure like it (no ORM, no clock).
"""

from __future__ import annotations

from dataclasses import replace

from fleet.planning.data import ModelOutcome, ModelView, Move, MoveCause, ReplicaView
from fleet.states import COMING_UP, RELEASING, ReplicaState

S = ReplicaState


def _least_busy_oldest(r: ReplicaView) -> tuple:
    """Which outdated replica goes first: known idle before busy or unknown, then oldest."""
    return (r.in_flight if r.in_flight is not None else 1 << 30, r.id)


class TransitionRules:
    """R10 and deleted models, mixed into ``PlanningPass`` (whose working state they use:
    ``states``, ``models``, ``by_model``, ``desired``, ``plan`` and its placement methods)."""

    __slots__ = ()

    def _drain_deleted(self) -> None:
        """Replicas whose model was deleted (``model_id`` None; a replica of a model merely
        left out of this snapshot, as the simulator's partial passes do, is not one) are
        surplus of nothing: ready → draining (out of routing at once), not yet
        ready or lost → stopping; draining ones stop by R8 (:meth:`_stop_drained`) on a later
        pass. Their resources stay held until the agent reports the engine stopped
        (``HOLDS_RESOURCES``). docs/architecture.md, "Replica state machine": deletes drain."""
        states, actions = self.states, self.plan.actions
        for r in self.snapshot.replicas:
            if r.model_id is not None:
                continue
            state = states[r.id]
            if state == S.READY:
                actions.append(Move(r.id, S.DRAINING, "draining: its model was deleted", MoveCause.MODEL_DELETED))
                states[r.id] = S.DRAINING
            elif state in COMING_UP or state == S.LOST:
                actions.append(Move(r.id, S.STOPPING, "stopping: its model was deleted", MoveCause.MODEL_DELETED))
                states[r.id] = S.STOPPING

    def _roll(self, m: ModelView, outcome: ModelOutcome) -> bool:
        """R10, rolling replacement: replicas of ``m`` started from an outdated spec are
        replaced, one replacement in flight at a time. Returns True when it decided the
        model's placements this pass (the plain missing/surplus step is skipped).

        * Outdated replicas not ready yet stop at once (the missing step places current ones).
        * Outdated ready ones drain as current ones become ready, never taking the model's
          ready count below what it wants.
        * Nothing in flight (no current replica coming up, no outdated one still draining or
          stopping): with room, a **surge** — one current replica placed beside the
          outdated ones ("replacing r12: surge starting on gpu-1"); without, **in place** —
          the least busy outdated one drains and its replacement is placed once it has
          stopped ("replacing r12 in place: no room for a surge").
        * Backoff (R9) holds the next try while the current spec keeps failing; the outdated
          ones keep serving, and no outdated one is drained in place after recent failures.
        """
        if m.external or m.profile is None:
            return False
        states, actions = self.states, self.plan.actions
        desired = self.desired[m.id]
        for r in self._active(m.id):
            if r.outdated and states[r.id] in COMING_UP:
                actions.append(Move(r.id, S.STOPPING, "outdated before it was ready: stopped, to be replaced",
                                    MoveCause.OUTDATED))
                states[r.id] = S.STOPPING
        active = self._active(m.id)
        if self.policy.stopped or desired == 0:
            return False  # the plain surplus step takes them all (outdated first)
        old = sorted((r for r in active if r.outdated), key=_least_busy_oldest)
        current = [r for r in active if not r.outdated]
        current_ready = [r for r in current if states[r.id] == S.READY]
        coming = sorted((r for r in current if states[r.id] in COMING_UP), key=lambda r: r.id)
        replaced = max(0, min(len(old), len(current_ready) + len(old) - desired))
        for r in old[:replaced]:
            actions.append(Move(r.id, S.DRAINING, f"outdated: replaced, {len(current_ready)} current ready",
                                MoveCause.OUTDATED))
            states[r.id] = S.DRAINING
        old = old[replaced:]
        # Outdated ones on their way out (on a usable agent: a silent one's room comes back
        # only with it): the next replacement waits for them.
        in_place = [r for r in self.by_model[m.id]
                    if r.outdated and states[r.id] in RELEASING and not self.unusable.get(r.agent_id)]
        if not old and not (in_place and len(current) < desired):
            return False
        excess = len(current) + len(old) - (desired + 1)  # one surge may run beside them
        for r in sorted(coming, key=lambda r: -r.id)[:max(0, excess)]:
            actions.append(Move(r.id, S.STOPPING, f"surplus: {len(current) + len(old)} running, {desired} wanted",
                                MoveCause.SURPLUS))
            states[r.id] = S.STOPPING
            coming.remove(r)
        total = len(current_ready) + len(coming) + len(old)
        if in_place and (total < desired or (coming and total == desired)):
            name = f"r{in_place[0].id} in place"
        else:
            name = f"r{(old or in_place)[0].id}"
        if total < desired:  # an in-place replacement's slot, or wanted higher: place what is missing
            if not self._wait_out_backoff(m, outcome):
                self._place(m, desired - total, self._active(m.id), outcome)
            outcome.reason = f"replacing {name}: {outcome.reason}"
            return True
        if coming:
            outcome.reason = (f"replacing {name}: surge r{coming[0].id} starting" if total > desired
                              else f"replacing {name}: r{coming[0].id} starting")
            return True
        if in_place:  # its room comes back for the next surge: one replacement at a time
            outcome.reason = f"replacing {name}: waiting for r{in_place[0].id} to stop"
            return True
        if self._wait_out_backoff(m, outcome):
            outcome.reason += f"; {len(old)} outdated still serving"
            return True
        best, _ = self._best_room(m, active, {})
        if best is not None:
            _, agent_id, gpus = best
            outcome.reason = self._place_at(m, agent_id, gpus,
                                            lambda where: f"replacing {name}: surge starting on {where}")
            # The row keeps why it was placed, in words that stay true once the roll is over.
            self.plan.actions[-1] = replace(self.plan.actions[-1], reason=f"placed to replace {name} (a surge)")
            return True
        evicted = self._make_room(m, others_idle=False)
        if evicted:  # replicas kept warm on a prediction yield their room to a surge (R11)
            outcome.reason = f"replacing {name}: a surge once {evicted}"
            return True
        if m.failures:
            outcome.reason = (f"{len(old)} outdated replica(s) still serving: no room for a surge, and the current "
                              f"spec failed {len(m.failures)} time(s) lately"
                              + (f"; last error: {m.last_error}" if m.last_error else ""))
            return True
        victim = old[0]
        outcome.reason = f"replacing r{victim.id} in place: no room for a surge"
        actions.append(Move(victim.id, S.DRAINING, outcome.reason, MoveCause.OUTDATED))
        states[victim.id] = S.DRAINING
        return True
