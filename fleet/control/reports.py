"""What agents tell the control plane, written to the database; and what they are told
(their desired set). Called by the websocket consumer through ``database_sync_to_async``."""

from __future__ import annotations

import logging
import math
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from catalog.models import MAX_TOKENS_LIMIT, Model
from llmgw import integers
from fleet import protocol
from fleet.models import Agent, Gpu, GpuSample, Replica
from fleet.control.reconciler import request_pass
from fleet.control.snapshot import is_back
from fleet.states import ASSIGNED_TO_AGENT, ReplicaState, can_transition

log = logging.getLogger(__name__)
S = ReplicaState


def authenticate(token: str) -> Agent | None:
    return Agent.authenticate(token)


def token_still_valid(agent_id: int, token_sha256: str) -> bool:
    """Whether agent ``agent_id`` still exists and still has the token whose hash is
    ``token_sha256`` (False once it was re-keyed or deleted). One indexed query."""
    return bool(token_sha256) and Agent.objects.filter(pk=agent_id, token_sha256=token_sha256).exists()


def mark_connected(agent_id: int) -> str:
    """Record a new websocket session; returns its id (see :func:`mark_disconnected`)."""
    session = uuid.uuid4().hex
    now = timezone.now()
    Agent.objects.filter(pk=agent_id).update(
        connected=True, connected_since=now, last_seen_at=now, session=session
    )
    return session


def mark_disconnected(agent_id: int, session: str) -> None:
    """Mark the agent disconnected unless a newer session has already replaced this one."""
    # The close is the last word heard from it: its replicas stay routable for the route
    # grace, which covers an agent restarting in place.
    Agent.objects.filter(pk=agent_id, session=session).update(connected=False, last_seen_at=timezone.now())
    request_pass()


def _count(value, maximum: int = integers.INT32_MAX) -> int | None:
    """A non-negative integer from an agent's message, or None for anything else (a bad
    field is skipped, never allowed to fail the whole report): ``integers.count_or_none``,
    lenient (load gauges arrive as floats)."""
    return integers.count_or_none(value, maximum, strict=False)


#: Readings outside these are a broken driver or a lying agent, stored as unknown (None).
UTILISATION_RANGE_PCT = (0.0, 100.0)
TEMPERATURE_RANGE_C = (-60.0, 200.0)
#: The ``Gpu`` columns a reading sets.
READING_FIELDS = ("memory_total_mib", "memory_used_mib", "utilisation_pct", "temperature_c")


def _figure(value, low: float, high: float) -> float | None:
    """A reported figure within ``low..high``, else None (absent, null, not a number, out of range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:  # an integer of hundreds of digits: no float holds it
        return None
    return value if math.isfinite(value) and low <= value <= high else None


def _apply_reading(gpu: Gpu, reading: dict) -> None:
    """Set ``gpu``'s reading columns from one GPU of an inventory or a heartbeat's ``gpus``:
    memory (MiB) only when reported (an unknown figure, or more used than the total, keeps
    the last known one: placement counts on it), utilisation and temperature always (None
    when unknown)."""
    total = _count(reading.get("memory_total_mib"))
    if total is not None:
        gpu.memory_total_mib = total
    used = _count(reading.get("memory_used_mib"))
    if used is not None and used <= gpu.memory_total_mib:  # more used than there is: not a reading
        gpu.memory_used_mib = used
    gpu.utilisation_pct = _figure(reading.get("utilisation_pct"), *UTILISATION_RANGE_PCT)
    gpu.temperature_c = _figure(reading.get("temperature_c"), *TEMPERATURE_RANGE_C)


def record_inventory(agent: Agent, inventory: protocol.Inventory, now: datetime | None = None) -> bool:
    """Store the agent's GPUs (with their readings, sampled: :func:`sample_gpus`), cores and
    RAM; True if its capacity changed (a GPU came or went, cores or RAM moved). Malformed
    entries are skipped."""
    if not isinstance(inventory, dict):
        return False
    changed = False
    cores, memory = _count(inventory.get("cpu_cores")) or 0, _count(inventory.get("memory_mib")) or 0
    if (agent.cpu_cores, agent.memory_mib) != (cores, memory):
        agent.cpu_cores, agent.memory_mib = cores, memory
        agent.save(update_fields=["cpu_cores", "memory_mib"])
        changed = True
    reported: dict[int, dict] = {}
    gpus = inventory.get("gpus") if isinstance(inventory.get("gpus"), list) else []
    for gpu in gpus:
        index = _count(gpu.get("index"), 1023) if isinstance(gpu, dict) else None
        if index is not None:
            reported[index] = gpu
    stored = {g.index: g for g in Gpu.objects.filter(agent=agent)}
    rows = []
    for index, gpu in reported.items():
        row = stored.get(index)
        if row is None:
            row = Gpu(agent=agent, index=index)
            changed = True
        row.uuid, row.name = str(gpu.get("uuid", ""))[:128], str(gpu.get("name", ""))[:128]
        _apply_reading(row, gpu)
        row.save()
        rows.append(row)
    removed, _ = Gpu.objects.filter(agent=agent).exclude(index__in=list(reported)).delete()
    sample_gpus(agent, rows, now)
    return changed or bool(removed)


def record_gpu_readings(agent_id: int, readings: list[protocol.GpuReading], now: datetime | None = None) -> int:
    """Store a heartbeat's ``gpus`` (checked by ``protocol.check_fields``) on the agent's
    ``Gpu`` rows and sample them (:func:`sample_gpus`); returns the samples written. A
    reading of a GPU the inventory did not list is skipped (its hello or status adds it);
    three queries, whatever the number of GPUs."""
    by_index: dict[int, dict] = {}
    for reading in readings if isinstance(readings, list) else []:
        index = _count(reading.get("index"), 1023) if isinstance(reading, dict) else None
        if index is not None:
            by_index[index] = reading
    if not by_index:
        return 0
    rows = list(Gpu.objects.filter(agent_id=agent_id, index__in=list(by_index)).select_related("agent"))
    for row in rows:
        _apply_reading(row, by_index[row.index])
    if not rows:
        return 0
    Gpu.objects.bulk_update(rows, list(READING_FIELDS))
    return sample_gpus(rows[0].agent, rows, now)


def sample_gpus(agent: Agent, gpus: list[Gpu], now: datetime | None = None) -> int:
    """Write one ``GpuSample`` per GPU of ``gpus`` (the agent's rows as just stored), unless
    the agent's GPUs were sampled less than ``LLMGW_GPU_SAMPLE_EVERY_S`` ago; returns how
    many were written. The admin's charts read them (pruned with usage records)."""
    if not gpus:
        return 0
    now = now or timezone.now()
    since = now - timedelta(seconds=settings.LLMGW_GPU_SAMPLE_EVERY_S)
    if GpuSample.objects.filter(agent=agent, at__gt=since).exists():
        return 0
    GpuSample.objects.bulk_create([
        GpuSample(agent=agent, agent_name=agent.name, index=g.index, at=now, memory_used_mib=g.memory_used_mib,
                  memory_total_mib=g.memory_total_mib, utilisation_pct=g.utilisation_pct,
                  temperature_c=g.temperature_c)
        for g in gpus
    ])
    return len(gpus)


def record_hello(agent_id: int, message: protocol.Hello) -> None:
    """First message of a session: who the agent is, what it has, what it already runs."""
    agent = Agent.objects.get(pk=agent_id)
    agent.version = str(message.get("version", ""))[:64]
    agent.address = str(message.get("address", ""))[:255]
    agent.last_seen_at = timezone.now()
    agent.save(update_fields=["version", "address", "last_seen_at"])
    record_inventory(agent, message.get("inventory") or {})
    reported = message.get("replicas") or []
    record_replicas(agent_id, reported)
    forget_unreported(agent_id, reported)
    request_pass()


def forget_unreported(agent_id: int, reported: list[protocol.ReplicaReport]) -> int:
    """A hello lists every engine the agent runs (adopted ones included). Replicas it was
    running before and does not mention are gone: stopped, so the next pass replaces them
    instead of routing to a dead port. Returns how many."""
    ids = set()
    for report in reported:
        try:
            ids.add(int(report["replica_id"]))
        except (KeyError, TypeError, ValueError):
            continue
    gone = 0
    running = [S.DOWNLOADING.value, S.STARTING.value, S.READY.value, S.DRAINING.value, S.STOPPING.value,
               S.LOST.value]
    for replica in Replica.objects.filter(agent_id=agent_id, state__in=running).exclude(pk__in=ids):
        if replica.transition(S.STOPPED, reason="its agent reconnected without this engine running"):
            gone += 1
    return gone


def heartbeat_loads(message: protocol.Heartbeat) -> dict[int, tuple[int | None, int | None]]:
    """Replica id → (running, waiting) from a heartbeat's ``loads`` (checked by
    ``protocol.check_fields``); a count that is not a non-negative integer is unknown (None),
    an entry without a usable replica id is skipped. An old agent's bare heartbeat gives {}.
    The web process's ``HeartbeatStamps`` writes them (``fleet.live.watch``), stamped on
    arrival: docs/architecture.md, "Crossing processes": heartbeats."""
    out: dict[int, tuple[int | None, int | None]] = {}
    loads = message.get("loads")
    for load in loads if isinstance(loads, list) else []:
        if not isinstance(load, list) or len(load) != 3:
            continue
        replica_id = _count(load[0], 2**62)
        if replica_id is not None:
            out[replica_id] = (_count(load[1]), _count(load[2]))
    return out


def record_status(agent_id: int, message: protocol.Status) -> None:
    agent = Agent.objects.get(pk=agent_id)
    if message.get("inventory") and record_inventory(agent, message["inventory"]):
        request_pass()
    if record_replicas(agent_id, message.get("replicas") or []):
        request_pass()


def _target_state(current: ReplicaState, reported: str) -> ReplicaState | None:
    """The state a report moves a replica to, or None to leave it."""
    try:
        rep = ReplicaState(reported)
    except ValueError:
        return None
    if current in (S.STOPPED, S.FAILED):
        return None
    if rep == S.STOPPED:
        if current in (S.STOPPING, S.DRAINING, S.LOST):
            return S.STOPPED
        return S.FAILED  # it was meant to run: the engine went away
    if rep == S.FAILED:
        return S.FAILED
    if current in (S.DRAINING, S.STOPPING):
        return None  # on its way out; the engine's own progress does not matter
    if current == S.LOST:
        return None  # its agent is back: the planner decides whether it stays (fleet.planning.planner)
    if rep in (S.DOWNLOADING, S.STARTING, S.READY) and can_transition(current, rep):
        return rep
    return None


def record_replicas(agent_id: int, reports: list[protocol.ReplicaReport]) -> bool:
    """Apply per-replica reports; True when a change needs a reconcile pass (a replica
    failed or stopped, freeing resources or needing a successor)."""
    needs_pass = False
    by_id = {}
    for report in reports if isinstance(reports, list) else []:
        replica_id = _count(report.get("replica_id"), 2**62) if isinstance(report, dict) else None
        if replica_id is not None:
            by_id[replica_id] = report
    if not by_id:
        return False
    detected: dict[int, int] = {}  # model id → weights_context_length its agent read
    with transaction.atomic():
        # In id order, as the reconciler applies its moves: rows locked in one order never deadlock.
        for replica in Replica.objects.filter(pk__in=by_id, agent_id=agent_id).order_by("id"):
            report = by_id[replica.pk]
            length = integers.count_or_none(report.get("weights_context_length"), MAX_TOKENS_LIMIT)
            if length and replica.model_id is not None:
                detected[replica.model_id] = length
            fields = {}
            for name, top in (("pid", 2**31 - 1), ("port", 65535)):
                value = _count(report.get(name), top)
                if value is not None and getattr(replica, name) != value:
                    fields[name] = value
            if "running" in report or "waiting" in report:
                # Unknown stays unknown (None); the stamp makes stale reports unknown too.
                fields["load_running"] = _count(report.get("running"))
                fields["load_waiting"] = _count(report.get("waiting"))
                fields["load_reported_at"] = timezone.now()
            if "progress" in report:
                progress = _fraction(report.get("progress"))
                if progress != replica.download_progress:
                    fields["download_progress"] = progress
            error = str(report.get("error") or "")[-4000:]
            target = _target_state(ReplicaState(replica.state), str(report.get("state", "")))
            if replica.state == S.LOST.value and report.get("state") == S.READY.value and not is_back(replica):
                # Lost, yet its engine serves: the next pass keeps it or stops it as a duplicate.
                fields["ready_at"] = timezone.now()
                needs_pass = True
            if target == S.FAILED and error:
                fields["error"] = error
            elif target == S.STOPPED and error:
                # The agent's words for a stop it made on its own (an engine it found running
                # after its restart that it was not assigned): kept beside the planner's reason.
                fields["reason"] = (f"{replica.reason}; {error}" if replica.reason else error)[-4000:]
            elif target == S.FAILED and not error:
                fields["error"] = "engine stopped unexpectedly"
            if target is not None and target != replica.state:
                if replica.transition(target, **fields):
                    log.info("replica %s is %s (agent report)", replica.pk, target)
                    needs_pass = needs_pass or target in (S.FAILED, S.STOPPED)
            elif fields:
                Replica.objects.filter(pk=replica.pk).update(**fields)
    if detected:
        # Reports repeat it: read first, so an unchanged value costs no write (nor SQLite's write lock).
        stored = dict(Model.objects.filter(pk__in=detected).values_list("pk", "weights_context_length"))
        for model_id, length in detected.items():
            if model_id in stored and stored[model_id] != length:
                store_weights_context_length(model_id, length)
    return needs_pass


def store_weights_context_length(model_id: int, length: int) -> bool:
    """Record the context length (tokens) an agent read from model ``model_id``'s weights;
    True if it changed. A conditional queryset update: nothing is written when it is the
    same, ``updated_at`` is not touched (it is detected, not an edit), and it is not part of
    the spec hash (``fleet.control.specs``), so no replica rolls for it."""
    return bool(Model.objects.filter(pk=model_id).exclude(weights_context_length=length)
                .update(weights_context_length=length))


def _fraction(value) -> float | None:
    """A reported download progress as a fraction in 0..1, or None (unknown, or done)."""
    try:
        return None if value is None else min(1.0, max(0.0, float(value)))
    except (TypeError, ValueError):
        return None


def desired_set(agent_id: int) -> protocol.Assign:
    """The full set of replicas ``agent_id`` must run, with the generation it reflects.
    Lost replicas stay in it: an agent that comes back keeps their engines running until
    the planner has decided which of the duplicates go. So do draining replicas of a deleted
    model (``model`` None: the name they were placed under, no weights), so the agent does
    not kill them before the drain (docs/architecture.md, "Replica state machine")."""
    generation = Agent.objects.values_list("generation", flat=True).get(pk=agent_id)
    replicas: list[protocol.AssignedReplica] = []
    assigned = [s.value for s in ASSIGNED_TO_AGENT] + [S.LOST.value]
    qs = (
        Replica.objects.filter(agent_id=agent_id, state__in=assigned)
        .select_related("model", "profile")
        .order_by("id")
    )
    for r in qs:
        p = r.profile
        replicas.append(
            {
                "replica_id": r.pk,
                "served_name": r.model.name if r.model is not None else r.model_name,
                "weights": r.model.weights if r.model is not None else "",
                "command": p.command,
                "env": dict(p.env or {}),
                "gpu_indices": list(r.gpu_indices or []),
                "cpu_cores": r.cpu_cores or p.cpu_cores,
                "readiness_path": p.readiness_path,
                "startup_timeout_s": p.startup_timeout_s,
                "metrics_path": p.metrics_path,
                "metric_running": p.metric_running,
                "metric_waiting": p.metric_waiting,
                "api_key": r.engine_key,
            }
        )
    return {"type": "assign", "v": protocol.PROTOCOL_VERSION, "generation": generation, "replicas": replicas}
