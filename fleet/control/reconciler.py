"""The reconciler's shell: load a snapshot, take the pass lock, ``plan()``, apply, record.

Only this module (and the report ingestion in ``fleet.control.reports``) writes replica states on
the control plane's side. Passes are serialised cluster-wide by ``PassLock``, whose holder
extends it while its pass runs, so the lock can be short (``LLMGW_PASS_LOCK_TTL``, 10 s): a
worker killed mid-pass holds up the next pass for that long at most.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from datetime import datetime

from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.utils import timezone
from django_q.tasks import async_task

from catalog.models import Model
from fleet.control.planes import holder_id
from fleet.control.snapshot import load_snapshot
from fleet.control.specs import spec_hash
from fleet.groups import nudge_agents
from fleet.models import Agent, ModelState, PassLock, Replica, ScalingEvent
from fleet.planning import planner
from fleet.planning.warmth import ArrivalProfile, ColdStart
from fleet.states import ReplicaState

log = logging.getLogger(__name__)

MAX_PASSES_PER_RUN = 20


def apply_plan(result: planner.Plan, now: datetime, wanted_seen: dict[int, datetime | None] | None = None,
               cold_starts: dict[int, ColdStart | None] | None = None) -> set[int]:
    """Write a plan's actions and outcomes; returns the agents whose desired set moved. A
    placed row records its model's name and the hash of the spec it starts from
    (``fleet.control.specs.spec_hash``, docs/architecture.md, R10), read in the same
    transaction that creates it. ``cold_starts`` (model id → its measured cold start, None:
    none yet) is stored with each outcome, for the surfaces that cannot compute it (R11)."""
    touched: set[int] = set()
    models = {m.id: m for m in Model.objects.select_related("profile").filter(
        id__in=[p.model_id for p in result.places]
    )}
    # Places, then moves in replica id order: report ingestion locks rows in that order too,
    # so the two never deadlock on PostgreSQL.
    ordered = result.places + sorted(result.moves, key=lambda move: move.replica_id)
    for action in ordered:
        if isinstance(action, planner.Place):
            model = models[action.model_id]
            Replica.objects.create(
                model=model, model_name=model.name, spec_hash=spec_hash(model, model.profile),
                profile=model.profile, agent_id=action.agent_id,
                gpu_indices=list(action.gpu_indices), cpu_cores=action.cpu_cores,
                memory_mib=action.memory_mib, state=ReplicaState.PLACING.value,
                reason=action.reason,
            )
            touched.add(action.agent_id)
            log.info("placing %s: %s", model.name, action.reason)
        else:
            replica = Replica.objects.filter(pk=action.replica_id).first()
            if replica is None:
                continue
            reason = action.reason
            if replica.state == ReplicaState.DRAINING.value:
                reason = f"{replica.reason}; then {action.reason}"  # keep why it was drained
            if replica.transition(action.to, reason=reason):
                touched.add(replica.agent_id)
                log.info("replica %s → %s: %s", replica.pk, action.to, action.reason)
    for model_id, outcome in result.models.items():
        fields = {
            "desired": outcome.desired,
            "reason": outcome.reason,
            "unservable": outcome.unservable,
            "extra_replicas": outcome.scaling.extra,
            "busy_since": outcome.scaling.busy_since,
            "quiet_since": outcome.scaling.quiet_since,
            "observed_per_replica": outcome.scaling.observed_per_replica,
            "crowded_since": outcome.scaling.crowded_since,
            "trend": outcome.scaling.trend.as_json() if outcome.scaling.trend is not None else None,
            "warm_ahead": outcome.warm_ahead,
            "speculative": outcome.speculative,
        }
        if outcome.warm_evicted:
            fields["warm_evicted_at"] = now
        if cold_starts is not None and model_id in cold_starts:
            start = cold_starts[model_id]
            fields["cold_start_s"] = start.estimate_s if start is not None else None
            fields["cold_start_samples"] = start.samples if start is not None else 0
        if outcome.scaled is not None:
            before, after, why = outcome.scaled
            ScalingEvent.objects.create(model_id=model_id, at=now, from_replicas=before, to_replicas=after, reason=why)
            log.info("scaling model %s: %d → %d: %s", model_id, before, after, why)
        state, _ = ModelState.objects.get_or_create(model_id=model_id)
        if wanted_seen is not None and state.wanted_at != wanted_seen.get(model_id):
            # Wanted again since this pass read the snapshot: its verdict ("unservable",
            # "idle") is about the old demand. Keep the new request's fresh start; the pass
            # it requested decides.
            fields["unservable"] = False
            fields.pop("reason")
            outcome.forget_demand = False
        changed = [k for k, v in fields.items() if getattr(state, k) != v]
        for k in changed:
            setattr(state, k, fields[k])
        if outcome.forget_demand and state.wanted_at is not None:
            state.wanted_at = None
            changed.append("wanted_at")
        # A first verdict is stamped even when it changes nothing: ``reason_at`` set is what
        # "looked at by a pass" means (``ModelState.objects.looked_at``).
        if changed or state.reason_at is None:
            state.reason_at = now
            state.save(update_fields=changed + ["reason_at"])
    for note in result.notes:
        log.warning("%s", note)
    Agent.bump_generation(touched)
    return touched


def run_pass(now: datetime | None = None) -> planner.Plan:
    """One pass, assuming the caller holds the pass lock. The on-demand models' arrival
    profiles the snapshot brought up to ``now`` are stored with the plan (R11)."""
    now = now or timezone.now()
    arrivals: dict[int, ArrivalProfile] = {}
    snapshot = load_snapshot(now, arrivals)
    result = planner.plan(snapshot, now)
    with transaction.atomic():
        touched = apply_plan(result, now, {m.id: m.wanted_at for m in snapshot.models},
                             {m.id: m.cold_start for m in snapshot.models})
        for model_id, profile in arrivals.items():
            ModelState.objects.filter(model_id=model_id).update(arrivals=profile.as_json())
    if touched:
        transaction.on_commit(lambda: nudge_agents(touched))
    return result


def reconcile(holder: str | None = None) -> int:
    """Run passes while holding the lock, until no pass was requested during the last one.
    Returns how many passes ran (0 when another holder has the lock: it will see our
    request and run again)."""
    holder = holder or holder_id()
    passes = 0
    while passes < MAX_PASSES_PER_RUN:
        now = timezone.now()
        seen = PassLock.try_acquire(holder, now, settings.LLMGW_PASS_LOCK_TTL_S)
        if seen is None:
            return passes
        try:
            started = time.time()
            with _lock_kept(holder, settings.LLMGW_PASS_LOCK_TTL_S):
                run_pass(now)
            # Machine-readable, for checking that passes never overlap (tests/system/test_faults.py).
            log.debug("pass by %s ran from %.6f to %.6f", holder, started, time.time())
        except Exception:
            log.exception("reconcile pass failed")
            PassLock.objects.filter(pk=1, holder=holder).update(holder="", expires_at=None)
            raise
        passes += 1
        if PassLock.release_if_unchanged(holder, seen, timezone.now()):
            return passes
    PassLock.objects.filter(pk=1, holder=holder).update(holder="", expires_at=None)
    return passes


@contextlib.contextmanager
def _lock_kept(holder: str, ttl_s: float) -> Iterator[None]:
    """While the block runs, extend ``holder``'s pass lock every third of ``ttl_s`` from a
    thread of its own (a pass is one blocking call). The thread does nothing for a pass
    shorter than that, and is not waited for: a late extension by a holder that has let go
    changes nothing (``PassLock.extend`` is conditional on the holder)."""
    done = threading.Event()

    def keep() -> None:
        try:
            while not done.wait(ttl_s / 3):
                PassLock.extend(holder, timezone.now(), ttl_s)
        except DatabaseError:
            log.warning("could not extend the pass lock; it expires %.0f s after the last extension", ttl_s)
        finally:
            connections.close_all()

    keeper = threading.Thread(target=keep, name="llmgw-pass-lock", daemon=True)
    keeper.start()
    try:
        yield
    finally:
        done.set()


def request_pass() -> None:
    """Ask for a pass as soon as possible (after the current transaction commits)."""
    PassLock.request_pass()
    transaction.on_commit(lambda: async_task("fleet.tasks.reconcile_now", q_options={"ack_failure": True}))
