"""DRF serializers for the fleet: agents and their GPUs, replicas, and the shapes of the
cluster operations' answers (status, stop/start, explain, agent and model actions)."""

from __future__ import annotations

from rest_framework import serializers

from catalog.models import RoutingPolicy
from fleet.control.specs import spec_hash
from fleet.models import Agent, Gpu, Replica
from fleet.ops import cluster as read
from llmgw.rest import RefuseUnknownFields


class GpuSerializer(serializers.ModelSerializer):
    class Meta:
        model = Gpu
        fields = ["index", "uuid", "name", "memory_total_mib", "memory_used_mib"]


class AgentSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    """An agent as operators see it. ``connected`` is true only while it is heard from
    (the stored flag alone can be stale); its token is never shown after creation."""

    connected = serializers.SerializerMethodField()
    gpus = GpuSerializer(many=True, read_only=True)

    class Meta:
        model = Agent
        fields = ["id", "name", "connected", "cordoned", "address", "version", "connected_since", "last_seen_at",
                  "cpu_cores", "memory_mib", "gpus", "created_at"]
        read_only_fields = [f for f in fields if f != "name"]

    def get_connected(self, obj: Agent) -> bool:
        """The read model's *alive* (``fleet.ops.cluster``), one clock for a whole list."""
        if not hasattr(self, "_moment"):
            self._moment = read.moment()
        return self._moment.agent_alive(obj)


class AgentCreatedSerializer(AgentSerializer):
    """A new agent with its token: shown this once, stored only as a hash."""

    token = serializers.CharField(read_only=True)

    class Meta(AgentSerializer.Meta):
        fields = AgentSerializer.Meta.fields + ["token"]


class AgentActionSerializer(serializers.Serializer):
    agent = serializers.CharField()
    cordoned = serializers.BooleanField()
    changed = serializers.BooleanField(help_text="False when the agent already was in that state.")
    replicas_moved = serializers.IntegerField(help_text="Replicas drained or stopped (drain only).")


class ReplicaSerializer(serializers.ModelSerializer):
    """A replica over REST. ``model`` is null once its model was deleted (the row drains and
    stops; ``model_name`` still names it); ``outdated``: started from a spec its model no
    longer has (docs/architecture.md, R10)."""

    model_name = serializers.CharField(source="shown_model_name", read_only=True)
    agent_name = serializers.CharField(source="agent.name", read_only=True)
    outdated = serializers.SerializerMethodField()

    class Meta:
        model = Replica
        fields = ["id", "model", "model_name", "agent", "agent_name", "state", "state_changed_at", "gpu_indices",
                  "cpu_cores", "memory_mib", "port", "reason", "error", "ready_at", "last_used_at", "in_flight",
                  "load_running", "load_waiting", "load_reported_at", "download_progress", "created_at", "outdated"]
        read_only_fields = fields

    def get_outdated(self, replica: Replica) -> bool:
        """Whether it runs an outdated spec (``fleet.ops.cluster.replica_outdated``)."""
        if replica.model_id is None:
            return False
        return read.replica_outdated(replica, {replica.model_id: spec_hash(replica.model, replica.model.profile)})


class ModelActionSerializer(serializers.Serializer):
    model = serializers.CharField()
    detail = serializers.CharField()
    replicas_moved = serializers.IntegerField(required=False)


# --- Documentation-only shapes of plain-data answers ---------------------------------------


class ControlPlaneStatusSerializer(serializers.Serializer):
    host = serializers.CharField()
    role = serializers.CharField()
    pid = serializers.IntegerField()
    last_seen_at = serializers.DateTimeField()
    leader = serializers.BooleanField(help_text="The worker holding the leader lease (runs the passes).")
    standby = serializers.BooleanField(help_text="A worker that takes over if the leader goes.")


class AgentStatusSerializer(serializers.Serializer):
    name = serializers.CharField()
    connected = serializers.BooleanField()
    health = serializers.ChoiceField(choices=["alive", "disconnected", "lost", "never connected"],
                                     help_text="As `llmgw agents list` says it.")
    heartbeat_age_s = serializers.FloatField(allow_null=True, help_text="Seconds since its last message; null: never.")
    version = serializers.CharField()
    cordoned = serializers.BooleanField()
    address = serializers.CharField()
    last_seen_at = serializers.DateTimeField(allow_null=True)
    connected_since = serializers.DateTimeField(
        allow_null=True, help_text="When its current websocket connected: a recent time after a restart or a cut.")
    gpus_total = serializers.IntegerField()
    gpus_used = serializers.IntegerField()
    cpu_cores = serializers.IntegerField()
    memory_mib = serializers.IntegerField()


class ModelStatusSerializer(serializers.Serializer):
    name = serializers.CharField()
    desired = serializers.IntegerField()
    ready = serializers.IntegerField()
    on_demand = serializers.BooleanField()
    external = serializers.BooleanField()
    routing_policy = serializers.CharField(help_text="How requests choose among its replicas: one of "
                                           + ", ".join(RoutingPolicy.values) + " (none apply to an external model).")
    reason = serializers.CharField(required=False, help_text="Present when ready ≠ desired or unservable.")


class ReplicaStatusSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    model = serializers.CharField()
    agent = serializers.CharField()
    state = serializers.CharField()
    port = serializers.IntegerField(allow_null=True)
    gpus = serializers.ListField(child=serializers.IntegerField())


class ClusterStatusSerializer(serializers.Serializer):
    """``fleet.ops.operations.cluster_status()``: the same as ``llmgw status --json``."""

    serving = serializers.BooleanField()
    stopped = serializers.BooleanField()
    stopped_at = serializers.DateTimeField(allow_null=True)
    stopped_by = serializers.CharField(allow_null=True)
    leader = serializers.CharField(allow_null=True, help_text="Host of the worker holding the leader lease.")
    leader_process = serializers.CharField(allow_null=True, help_text="host:pid of that worker.")
    control_planes = ControlPlaneStatusSerializer(many=True)
    agents = AgentStatusSerializer(many=True)
    models = ModelStatusSerializer(many=True)
    replicas = ReplicaStatusSerializer(many=True)


class ClusterActionSerializer(serializers.Serializer):
    stopped = serializers.BooleanField()
    changed = serializers.BooleanField(help_text="False when the cluster already was in that state.")


class ExplainReplicaSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    agent = serializers.CharField()
    state = serializers.CharField()
    port = serializers.IntegerField(allow_null=True)
    reason = serializers.CharField()
    error = serializers.CharField()


class ExplainScalingEventSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    to = serializers.IntegerField()
    why = serializers.CharField()

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.IntegerField()  # a keyword in Python: added by name
        return fields


class ExplainLimitsSerializer(serializers.Serializer):
    """A model's token limits in force and the endpoints it serves (``catalog.models.limits_info``)."""

    context_length = serializers.IntegerField(allow_null=True, help_text="Tokens; null: unknown.")
    max_output_tokens = serializers.IntegerField(allow_null=True, help_text="Tokens; null: up to the context.")
    served_endpoints = serializers.ListField(child=serializers.CharField(), help_text="Under /v1/, sorted.")
    text = serializers.CharField(help_text="The limits in words.")


class ExplainRoutingSerializer(serializers.Serializer):
    """How the gateway chooses among a model's replicas (``fleet.ops.explain.routing_info``)."""

    # A CharField: a second enum of the same choices would be a second schema name for them.
    policy = serializers.CharField(help_text="The model's routing_policy: one of "
                                   + ", ".join(RoutingPolicy.values) + ".")
    applies = serializers.BooleanField(help_text="False for an external model: its requests go to its base URL.")
    text = serializers.CharField(help_text="The rule in words, with the load bound's figures. /metrics counts "
                                 "each choice: llmgw_routing_decisions_total{model,policy,outcome}.")


class ExplainAgentColdStartSerializer(serializers.Serializer):
    agent = serializers.CharField()
    estimate_s = serializers.FloatField(help_text="p90 of this agent's recent starts of the model, seconds.")
    samples = serializers.IntegerField()
    text = serializers.CharField()


class ExplainColdStartSerializer(serializers.Serializer):
    """The model's measured cold start (``fleet.ops.explain.cold_start_info``)."""

    estimate_s = serializers.FloatField(help_text="Placement to ready, seconds: the 90th percentile of its last 20 "
                                        "starts on its profile, or the cluster's default_cold_start_s.")
    samples = serializers.IntegerField(help_text="Starts measured; 0: the default stands in.")
    measured = serializers.BooleanField()
    text = serializers.CharField()
    lead_s = serializers.FloatField(help_text="How far ahead pre-warm places: the estimate plus a margin.")
    by_agent = ExplainAgentColdStartSerializer(many=True, help_text="Agents whose own estimate differs by 25% or "
                                               "more (from 3 starts or more).")


class ExplainPrewarmSerializer(serializers.Serializer):
    enabled = serializers.BooleanField(help_text="The cluster's prewarm_windows.")
    next_window = serializers.CharField(allow_null=True)
    starts_at = serializers.DateTimeField(allow_null=True)
    placed_from = serializers.DateTimeField(allow_null=True, help_text="When its replicas are placed: the start "
                                            "minus the lead. Null when pre-warm is off.")


class ExplainPredictionSerializer(serializers.Serializer):
    enabled = serializers.BooleanField(help_text="The cluster's predictive_warmth.")
    applies = serializers.BooleanField(help_text="On-demand models only.")
    usually_asked = serializers.CharField(allow_null=True, help_text="Its likely hours of the week (local), in words.")
    weeks_observed = serializers.FloatField(help_text="The most weeks (decayed) any of its hours was observed.")
    now = serializers.CharField(allow_null=True, help_text="The likely run that keeps it warm now, with until when.")


class ExplainTrendSerializer(serializers.Serializer):
    in_flight = serializers.FloatField()
    per_min = serializers.FloatField(help_text="The load's slope, requests in flight per minute.")
    at = serializers.DateTimeField()
    rising_since = serializers.DateTimeField(allow_null=True)


class ExplainRampSerializer(serializers.Serializer):
    enabled = serializers.BooleanField(help_text="The cluster's ramp_scaling.")
    applies = serializers.BooleanField(help_text="Its cold start is long enough for the rule.")
    text = serializers.CharField()
    trend = ExplainTrendSerializer(allow_null=True)


class ExplainWarmthSerializer(serializers.Serializer):
    """Warm before demand (``fleet.ops.explain.warmth_info``; docs/architecture.md, R11)."""

    cold_start = ExplainColdStartSerializer()
    now = serializers.CharField(help_text="What the last pass kept warm ahead of demand and why; empty: nothing.")
    speculative = serializers.BooleanField(help_text="Its one replica is kept on a prediction alone: placed on free "
                                           "room, evicted first for a wanted model.")
    prewarm = ExplainPrewarmSerializer()
    prediction = ExplainPredictionSerializer()
    ramp = ExplainRampSerializer()


class ExplainSerializer(serializers.Serializer):
    """``llmgw explain MODEL --json``: why a model has the replicas it has."""

    model = serializers.CharField()
    on_demand = serializers.BooleanField()
    external = serializers.BooleanField()
    engine_protected = serializers.BooleanField(
        allow_null=True, help_text="Its profile starts engines with their replica's key ({api_key}), so only the "
        "gateway can use them; false: anyone who reaches an engine's port can. Null: external or no profile.")
    min_replicas = serializers.IntegerField()
    max_replicas = serializers.IntegerField()
    desired = serializers.IntegerField()
    ready = serializers.IntegerField()
    wanted_at = serializers.DateTimeField(allow_null=True)
    last_used_at = serializers.DateTimeField(allow_null=True)
    idle_for_s = serializers.FloatField(allow_null=True)
    unservable = serializers.BooleanField()
    reason = serializers.CharField()
    schedule = serializers.ListField(child=serializers.CharField(), help_text="Its schedule windows, in words.")
    window_now = serializers.CharField(allow_null=True, help_text="The window in force now, if any.")
    load_extra_replicas = serializers.IntegerField(help_text="Replicas load scaling has added.")
    measured_per_replica = serializers.IntegerField(allow_null=True, help_text="Benchmarked concurrency per replica.")
    observed_per_replica = serializers.IntegerField(
        allow_null=True, help_text="Most requests a replica ran while others queued (learned capacity).")
    queued_at_gateway = serializers.IntegerField(
        help_text="Requests waiting in the gateways' admission queues (the model at capacity), counted as load.")
    scaling_events = ExplainScalingEventSerializer(many=True, help_text="The last five, newest first.")
    last_failure = serializers.CharField(
        allow_null=True, help_text="The newest failed replica's error in one line: the agent's words and the log line "
        "that says what went wrong (the port taken, the exception, an error-level line). Null when none failed, or "
        "once a replica became ready after it.")
    last_failure_at = serializers.DateTimeField(allow_null=True, help_text="When it failed (to the second).")
    last_failure_replica = serializers.IntegerField(allow_null=True, help_text="The failed replica's id.")
    last_failure_log = serializers.CharField(
        allow_null=True, help_text="Its whole error: the agent's words and the engine's last log lines.")
    replicas = ExplainReplicaSerializer(many=True)
    limits = ExplainLimitsSerializer()
    routing = ExplainRoutingSerializer()
    warmth = ExplainWarmthSerializer(allow_null=True, help_text="Null for an external model.")
