"""What the planner reads and what it returns, as plain frozen data: the ``Snapshot`` of the
cluster a pass starts from (policy, agents, models, replicas) and the ``Plan`` it ends with
(actions: ``Place`` and ``Move``; an outcome per model). No ORM, no clock
(docs/architecture.md, R1); ``fleet.control.snapshot`` fills these from the database and the
simulator from its own state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

from fleet.planning.scaling import Load, ScalingPolicy, ScalingState, Trend
from fleet.planning.warmth import Ahead, ColdStart, Prediction, UpcomingWindow
from fleet.states import ReplicaState

S = ReplicaState


def fmt_s(seconds: float) -> str:
    """A duration for the planner's sentences: "2.5 h", "12 min", "40 s"."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


# --- Snapshot ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """Cluster-wide rules for one pass; durations in seconds."""

    stopped: bool = False
    default_idle_timeout_s: float = 600.0
    min_idle_before_eviction_s: float = 60.0
    drain_grace_s: float = 30.0
    agent_lost_after_s: float = 20.0
    backoff_base_s: float = 5.0
    backoff_cap_s: float = 300.0
    #: A replica its agent has not taken up (still placing) this long is failed and replaced.
    placing_timeout_s: float = 120.0
    scaling: ScalingPolicy = ScalingPolicy()
    #: Since when the control plane could record heartbeats without a gap (None: always).
    #: An agent's silence is counted from the later of its last message and this instant,
    #: so a control plane (or database) that stalled does not blame the agents for it.
    listening_since: datetime | None = None
    #: Warm before demand (docs/architecture.md, R11): the cluster's time zone (hours of the
    #: week are local), the cold start assumed for a model never started, and the three
    #: rules, each of which an operator may switch off (the ramp is ``scaling.ramp``).
    time_zone: str = "UTC"
    default_cold_start_s: float = 120.0
    prewarm_windows: bool = True
    predictive_warmth: bool = True


@dataclass(frozen=True)
class GpuView:
    """One GPU of an agent: its index on the machine and its total memory (MiB)."""

    index: int
    memory_total_mib: int


@dataclass(frozen=True)
class AgentView:
    """An agent as the pass sees it. ``last_seen_at`` is when its last message arrived."""

    id: int
    name: str
    connected: bool = True
    cordoned: bool = False
    last_seen_at: datetime | None = None
    gpus: tuple[GpuView, ...] = ()
    cpu_cores: float = 0.0
    memory_mib: int = 0


@dataclass(frozen=True)
class ProfileView:
    """Resources one replica needs: ``gpus_needed`` GPUs of ``gpu_memory_mib`` each, or
    (``gpus_needed == 0``) ``cpu_cores`` and ``memory_mib`` of the machine."""

    id: int
    gpus_needed: int = 0
    gpu_memory_mib: int = 0
    cpu_cores: float = 0.0
    memory_mib: int = 0

    def describe(self) -> str:
        """What it needs, for people: "2 free GPUs of 40 GiB", "1 free CPU cores and 1024 MiB RAM"."""
        if self.gpus_needed:
            gib = self.gpu_memory_mib / 1024
            return f"{self.gpus_needed} free GPU{'s' if self.gpus_needed > 1 else ''} of {gib:g} GiB"
        return f"{self.cpu_cores:g} free CPU cores and {self.memory_mib} MiB RAM"


@dataclass(frozen=True)
class ModelView:
    """A catalog model plus the fleet's memory of it.

    ``wanted_at``: last time a request asked for it (moved forward by use); ``window_min``
    / ``window_max``: the schedule window in force now, if any; ``extra_replicas``: what load
    scaling added; ``failures``: when its recent replicas failed, oldest first.
    """

    id: int
    name: str
    profile: ProfileView | None
    min_replicas: int = 0
    max_replicas: int = 1
    on_demand: bool = False
    idle_timeout_s: float | None = None
    external: bool = False
    wanted_at: datetime | None = None
    window_min: int | None = None
    window_max: int | None = None
    extra_replicas: int = 0
    busy_since: datetime | None = None
    quiet_since: datetime | None = None
    #: Capacity per replica learned from load, and since when fewer replicas would be too
    #: full (``fleet.planning.scaling.ScalingState``).
    observed_per_replica: int | None = None
    crowded_since: datetime | None = None
    #: Load over its ready replicas (None: unknown) and measured capacity per replica.
    load: Load | None = None
    measured_per_replica: int | None = None
    failures: tuple[datetime, ...] = ()
    last_error: str = ""
    #: The hash of what shapes its engine now (``fleet.control.specs.spec_hash``).
    spec_hash: str = ""
    #: The load's trend between passes (``fleet.planning.scaling.Trend``), if followed.
    trend: Trend | None = None
    #: Warm before demand (R11, ``fleet.planning.warmth``): its measured cold start (None:
    #: never started), the next schedule window to start, and — for an on-demand model —
    #: the run of likely hours its arrival profile predicts around now (``warmth.predict``,
    #: which the shell calls with the model's lead and idle timeout). ``ahead`` is what
    #: :func:`fleet.planning.planner.warm_ahead` makes of the window at the pass's instant:
    #: the shell leaves it None.
    cold_start: ColdStart | None = None
    next_window: UpcomingWindow | None = None
    predicted: Prediction | None = None
    ahead: Ahead | None = None
    #: When a replica kept warm on a prediction was last evicted for a wanted model: the
    #: room is contested, so the rest of that predicted run places none again (R11).
    warm_evicted_at: datetime | None = None


@dataclass(frozen=True)
class ReplicaView:
    """A replica. ``model_id`` None: its model was deleted (it drains and stops);
    ``last_used_at`` None = never told; ``in_flight`` None = unknown; ``back``: it is lost,
    but its agent has since reported the engine ready again; ``outdated``: started from a
    spec its model no longer has (docs/architecture.md, R10)."""

    id: int
    model_id: int | None
    agent_id: int
    state: ReplicaState
    gpu_indices: tuple[int, ...] = ()
    cpu_cores: float = 0.0
    memory_mib: int = 0
    state_changed_at: datetime | None = None
    last_used_at: datetime | None = None
    in_flight: int | None = None
    back: bool = False
    outdated: bool = False


@dataclass(frozen=True)
class Snapshot:
    """Everything one pass knows: the cluster's policy, its agents, models and replicas (all
    replicas the control plane still tracks, in any state)."""

    policy: Policy
    agents: tuple[AgentView, ...]
    models: tuple[ModelView, ...]
    replicas: tuple[ReplicaView, ...]


# --- Result --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """Create a replica of ``model_id`` on ``agent_id`` holding these resources."""

    model_id: int
    agent_id: int
    gpu_indices: tuple[int, ...]
    cpu_cores: float
    memory_mib: int
    reason: str


class MoveCause(str, Enum):
    """Why a replica is moved, for programs (the simulator's counts, metrics); ``Move.reason``
    says the same for people, with the figures."""

    AGENT_SILENT = "agent_silent"      # its agent went quiet: lost, or stopped if draining
    NOT_TAKEN_UP = "not_taken_up"      # placed, but the agent never started it
    DRAINED = "drained"                # draining and nothing in flight any more
    DRAIN_GRACE_OVER = "drain_grace_over"
    WANTED_AGAIN = "wanted_again"      # a draining replica serves again
    IDLE = "idle"                      # on-demand model unused for its idle timeout
    CLUSTER_STOPPED = "cluster_stopped"
    SURPLUS = "surplus"                # more running than wanted (load, schedule, catalog)
    EVICTION = "eviction"              # making room for another model
    AGENT_BACK = "agent_back"          # a lost replica's agent returned with it ready
    DUPLICATE = "duplicate"            # came back, but enough run elsewhere
    OUTDATED = "outdated"              # started from a spec its model no longer has (R10)
    MODEL_DELETED = "model_deleted"    # its model was deleted from the catalog


@dataclass(frozen=True)
class Move:
    """Move replica ``replica_id`` to state ``to`` (drain, stop, mark lost), for ``cause``;
    ``reason`` is the sentence shown to operators."""

    replica_id: int
    to: ReplicaState
    reason: str
    cause: MoveCause


@dataclass
class ModelOutcome:
    """What the pass concluded for one model, for the admin, ``explain`` and the gateway."""

    desired: int = 0
    active: int = 0
    ready: int = 0
    reason: str = ""
    #: Could not place what it needs; ``reason`` says why (the gateway answers 503 with it).
    unservable: bool = False
    #: Its on-demand demand is over (idle, or evicted to make room): clear ``wanted_at``.
    forget_demand: bool = False
    #: Load-scaling memory to store, and the step taken this pass (from, to, why) if any.
    scaling: ScalingState = field(default_factory=ScalingState)
    scaled: tuple[int, int, str] | None = None
    #: Warm before demand (R11): what raised ``desired`` ahead of demand, in words ("pre-warm:
    #: window … starts in 3 min; …", "kept warm: usually asked for on weekdays 09–10; warm
    #: until 10:15"); "" when nothing did. ``speculative``: its only replica is kept on a
    #: prediction (placed on free room alone, evicted first).
    warm_ahead: str = ""
    speculative: bool = False
    #: A replica of it kept warm on a prediction was evicted this pass (store the instant).
    warm_evicted: bool = False


@dataclass
class Plan:
    """A pass's result: ``actions`` in the order the pass decided them (the shell applies
    them so), an outcome per model id, and cluster-wide ``notes`` (a stalled control plane)."""

    actions: list[Place | Move] = field(default_factory=list)
    models: dict[int, ModelOutcome] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def places(self) -> list[Place]:
        """The placements among the actions, in order."""
        return [a for a in self.actions if isinstance(a, Place)]

    @property
    def moves(self) -> list[Move]:
        """The state moves among the actions, in order."""
        return [a for a in self.actions if isinstance(a, Move)]
