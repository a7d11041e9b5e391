"""What shapes a replica's engine, as one hash (docs/architecture.md, R10: edits roll).

A replica stores the hash of the spec it was placed from (``Replica.spec_hash``, written by
``fleet.control.reconciler.apply_plan``); the snapshot loader compares it with its model's
current hash and marks the replica *outdated* when they differ. Plain Python over attribute
reads: no query, no Django import.
"""

from __future__ import annotations

import hashlib
import json

#: The profile fields that shape an engine: everything the agent gets in an
#: ``AssignedReplica`` from the profile, plus the resources one replica is given.
PROFILE_FIELDS = ("command", "env", "gpus_needed", "gpu_memory_mib", "cpu_cores", "memory_mib", "readiness_path",
                  "startup_timeout_s", "metrics_path", "metric_running", "metric_waiting")


def engine_spec(model, profile) -> dict:
    """The fields of ``model`` (a ``catalog.models.Model``) and ``profile`` (its
    ``Profile``, or None) that shape the engine: served name, weights URI, the profile's
    command template and env, GPUs / GPU memory (MiB) / cores / RAM (MiB) one replica needs,
    readiness and metrics paths and metric names, startup timeout (s). Not in it, because the
    engine does not see them: aliases, idle timeout, default_max_tokens, min/max, on-demand,
    schedules; nor the per-replica port, engine key and GPU indices."""
    spec = {"served_name": model.name, "weights": model.weights or ""}
    for name in PROFILE_FIELDS:
        spec[name] = getattr(profile, name) if profile is not None else None
    if spec["cpu_cores"] is not None:
        spec["cpu_cores"] = float(spec["cpu_cores"])
    spec["env"] = dict(spec["env"] or {}) if profile is not None else None
    return spec


def spec_hash(model, profile) -> str:
    """SHA-256 (64 hex digits) of :func:`engine_spec` as canonical JSON: equal specs give equal
    hashes in every process and version of Python."""
    text = json.dumps(engine_spec(model, profile), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def is_outdated(started_from: str, current: str) -> bool:
    """Whether a replica started from hash ``started_from`` runs an outdated spec: its hash is
    known ("" = a row from before hashes: treated as current, so an upgrade restarts
    nothing) and differs from the model's ``current`` one."""
    return bool(started_from) and started_from != current
