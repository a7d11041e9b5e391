"""The replica state machine: one enum, the allowed transitions written once
(docs/architecture.md, "Replica state machine").

Pure Python: the control plane's models, the planner and the agent all use it.
"""

from __future__ import annotations

import enum


class ReplicaState(str, enum.Enum):
    """Life of one engine replica.

    ``placing`` (chosen, not yet acknowledged by the agent) → ``downloading`` (fetching
    weights) → ``starting`` (engine up, not ready) → ``ready`` (routable) → ``draining``
    (not routable, in-flight requests finishing) → ``stopping`` → ``stopped``; ``failed``
    (did not become ready in time, or exited); ``lost`` (its agent went silent).
    """

    PLACING = "placing"
    DOWNLOADING = "downloading"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"
    LOST = "lost"

    def __str__(self) -> str:
        return self.value


S = ReplicaState

#: Allowed moves. Anything not listed is a bug and raises InvalidTransition.
TRANSITIONS: dict[ReplicaState, frozenset[ReplicaState]] = {
    S.PLACING: frozenset({S.DOWNLOADING, S.STARTING, S.READY, S.STOPPING, S.STOPPED, S.FAILED, S.LOST}),
    S.DOWNLOADING: frozenset({S.STARTING, S.READY, S.STOPPING, S.STOPPED, S.FAILED, S.LOST}),
    S.STARTING: frozenset({S.READY, S.STOPPING, S.STOPPED, S.FAILED, S.LOST}),
    S.READY: frozenset({S.DRAINING, S.STOPPING, S.STOPPED, S.FAILED, S.LOST, S.STARTING}),
    # Wanted again while draining: the warm replica is routable again (drain cancelled).
    S.DRAINING: frozenset({S.READY, S.STOPPING, S.STOPPED, S.FAILED, S.LOST}),
    S.STOPPING: frozenset({S.STOPPED, S.FAILED, S.LOST}),
    S.STOPPED: frozenset(),
    S.FAILED: frozenset({S.STOPPED}),
    # An agent that comes back reports the engine still running: it is routable again.
    S.LOST: frozenset({S.READY, S.STARTING, S.STOPPING, S.STOPPED, S.FAILED}),
}

#: States that hold resources on an agent (GPUs, cores, memory).
HOLDS_RESOURCES = frozenset({S.PLACING, S.DOWNLOADING, S.STARTING, S.READY, S.DRAINING, S.STOPPING})
#: States that count towards a model's desired replicas.
COUNTS_TOWARDS_DESIRED = frozenset({S.PLACING, S.DOWNLOADING, S.STARTING, S.READY})
#: Replicas not yet ready but on their way.
COMING_UP = frozenset({S.PLACING, S.DOWNLOADING, S.STARTING})
#: On their way out but still holding resources: room that frees once the agent stops them.
RELEASING = frozenset({S.DRAINING, S.STOPPING})
#: States the agent should be running (sent in ``assign``).
ASSIGNED_TO_AGENT = frozenset({S.PLACING, S.DOWNLOADING, S.STARTING, S.READY, S.DRAINING})
#: Nothing more happens to these.
TERMINAL = frozenset({S.STOPPED})
#: What an operator sees as the cluster now (``status``, the dashboard, the pass's
#: snapshot): replicas holding resources, and lost ones that may come back.
LIVE = HOLDS_RESOURCES | {S.LOST}
#: Every state but the terminal one, in the enum's order (``/metrics`` reports each).
NOT_STOPPED = tuple(s for s in ReplicaState if s not in TERMINAL)
#: Ended: kept only as history (failures count for backoff; retention prunes them).
ENDED = frozenset({S.STOPPED, S.FAILED})


def moved_when_agent_lost(state: ReplicaState | str) -> ReplicaState:
    """The state a replica in ``state`` takes when its agent is lost (docs/architecture.md, R9;
    ``fleet.planning.planner.PlanningPass._lose_silent_agents``): counting towards desired → ``lost``; draining →
    ``stopping`` (on its way out anyway); anything else stays as it is."""
    state = ReplicaState(state)
    if state in COUNTS_TOWARDS_DESIRED:
        return S.LOST
    if state == S.DRAINING:
        return S.STOPPING
    return state


class InvalidTransition(ValueError):
    """A replica was asked to move between states the machine does not connect."""


def check_transition(old: ReplicaState | str, new: ReplicaState | str) -> None:
    """Raise InvalidTransition unless ``old → new`` is allowed (same state is a no-op)."""
    old, new = ReplicaState(old), ReplicaState(new)
    if old == new:
        return
    if new not in TRANSITIONS[old]:
        raise InvalidTransition(f"replica cannot go from {old} to {new}")


def can_transition(old: ReplicaState | str, new: ReplicaState | str) -> bool:
    try:
        check_transition(old, new)
    except InvalidTransition:
        return False
    return True
