"""The simulator's runtime state of one replica and one catalog model: what they hold, the
fleet's memory of the model (``ModelState`` in memory) and the counters a report is built
from. Plain classes with slots, shared by the event loop (:mod:`.engine`) and its mixins
(:mod:`.shortcuts`, :mod:`.warming`)."""

from __future__ import annotations

import itertools
from array import array
from collections import deque
from datetime import UTC, datetime

from fleet.planning import planner, warmth
from fleet.planning.routing import RecentRoutes
from fleet.simulation.catalog import ModelSpec
from fleet.simulation.prefixes import PrefixCache
from fleet.states import ReplicaState

S = ReplicaState
INF = float("inf")
#: A timer that never comes due.
FOREVER = datetime.max.replace(tzinfo=UTC)


class SimReplica:
    """A simulated replica."""

    __slots__ = ("id", "model", "agent_id", "gpus", "cpu_cores", "memory_mib", "state", "changed_dt",
                 "placed_at", "last_used", "in_flight", "running", "queue", "alive", "view", "view_key",
                 "cache")

    def __init__(self, rid: int, model: SimModel, action: planner.Place, t: float, now: datetime) -> None:
        self.id = rid
        self.model = model
        self.agent_id = action.agent_id
        self.gpus = tuple(action.gpu_indices)
        self.cpu_cores = action.cpu_cores
        self.memory_mib = action.memory_mib
        self.state = S.PLACING
        self.changed_dt = now
        self.placed_at = t
        self.last_used: float | None = None  # never told
        self.in_flight = 0  # running + waiting at this engine
        self.running = 0
        self.queue: deque = deque()  # (arrival_s, ttft_service_s, duration_s)
        self.alive = True
        self.view: planner.ReplicaView | None = None
        self.view_key: tuple | None = None
        self.cache = PrefixCache(model.cache_slots)


class SimModel:
    """A catalog model's runtime state, the fleet's memory of it, and its counters."""

    def __init__(self, index: int, spec: ModelSpec) -> None:
        self.index = index
        self.id = index + 1
        self.spec = spec
        lat = spec.latency
        self.slots = lat.slots
        self.ttft_base_s = lat.ttft_base_ms / 1000.0
        self.prefill_s = lat.prefill_ms_per_token / 1000.0
        self.tpot_s = lat.tpot_ms / 1000.0
        self.slo_s = lat.slo_ttft_ms / 1000.0
        self.profile = (planner.ProfileView(self.id, spec.gpus_needed, spec.gpu_memory_mib)
                        if spec.gpus_needed else
                        planner.ProfileView(self.id, 0, 0, spec.cpu_cores, spec.memory_mib))
        self.reps: list[SimReplica] = []  # holding resources
        self.ready: list[SimReplica] = []
        self.coming_up = 0
        self.active = 0  # placing, starting or ready
        self.held: deque = deque()  # (arrival_s, ttft_service_s, duration_s, prefix or None)
        self.policy = spec.routing_policy
        self.cache_slots = spec.prefix_cache_slots
        self.recent = RecentRoutes()
        #: The gateway's per-model turn counter (``fleet.live.route``): ties among equally
        #: loaded replicas rotate. Counted for requests with a prefix only: the fast path of
        #: those without one keeps ties to the first (module docstring of :mod:`.prefixes`).
        self.turns = itertools.count()
        # Fleet memory (ModelState).
        self.wanted_s: float | None = None
        self.wanted_dt: datetime | None = None
        self.extra = 0
        self.busy_since: datetime | None = None
        self.quiet_since: datetime | None = None
        self.observed: int | None = None
        self.crowded_since: datetime | None = None
        self.trend = None
        self.unservable = False
        self.window_min: int | None = None
        self.window_max: int | None = None
        #: Warm before demand (R11): the next window to start, the arrival profile, the
        #: epoch hour of the last request it has seen, and the prediction in force with the
        #: simulated second until which it holds.
        self.next_window: warmth.UpcomingWindow | None = None
        self.arrivals = warmth.ArrivalProfile()
        self.asked_hour: int | None = None
        self.predicted: warmth.Prediction | None = None
        self.predicted_until_s = -INF
        self.warm_evicted_dt: datetime | None = None
        #: Its replicas' cold start as the planner knows it: the spec's, as measured on the
        #: days before the trace (a cluster that has been running; cf. ``warm_start``).
        self.cold_start = warmth.ColdStart(spec.cold_start_s, warmth.RECENT_STARTS)
        self.view: planner.ModelView | None = None
        self.view_key: tuple | None = None
        #: The view and counts a pass last found quiet, and until when that holds.
        self.quiet_view: planner.ModelView | None = None
        self.quiet_counts = (0, 0)
        self.quiet_until = FOREVER
        # Counters.
        self.requests = 0
        self.served = 0
        self.held_count = 0
        self.hold_s: list[float] = []
        self.rejected_unservable = 0
        self.rejected_timeout = 0
        self.cut_off = 0
        self.ttft = array("d")
        self.slo_met = 0
        self.gpu_s = 0.0
        self.replica_s = 0.0
        self.placements = 0
        self.evictions = 0
        self.idle_stops = 0
        self.scale_downs = 0
        self.steps: list[tuple[float, int, int, str]] = []
        self.oscillations = 0
        self.max_active = 0
        #: Requests routed with a prefix, those that found it cached, the prefill skipped.
        self.prefix_routed = 0
        self.prefix_hits = 0
        self.prefill_tokens_saved = 0
        self.timeline: list[tuple[float, int]] = [(0.0, 0)]
