"""What runs: agents and their GPUs, replicas, each model's demand and the reconcile lock."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models, transaction
from django.db.models import F
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from catalog.models import Model, Profile
from llmgw import tokens
from llmgw.process_name import this_process
from fleet import groups
from fleet.states import COMING_UP, LIVE, NOT_STOPPED, ReplicaState, check_transition


def engine_url(address: str, port: int | None) -> str:
    """``http://ADDRESS:PORT`` of an engine on an agent's advertised ``address`` (loopback
    when it has none); an IPv6 address is put in brackets."""
    host = address or "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def heard_cutoff(now: datetime, listening_since: datetime | None = None,
                 lost_after_s: float | None = None) -> datetime | None:
    """The oldest last message that still counts as heard from at ``now``, or None when
    every agent counts as heard (nobody could listen for ``lost_after_s`` yet).

    The planner's lost-agent rule (``fleet.planning.planner.silent_for_s``;
    docs/architecture.md, R9): an agent is lost once silent for more than ``lost_after_s`` seconds
    (default ``LLMGW_AGENT_LOST_AFTER_S``), its silence counted from the later of its last
    message and ``listening_since`` (``fleet.control.planes.listening_since``)."""
    from django.conf import settings

    if lost_after_s is None:
        lost_after_s = settings.LLMGW_AGENT_LOST_AFTER_S
    cutoff = now - timedelta(seconds=lost_after_s)
    if listening_since is not None and listening_since >= cutoff:
        return None
    return cutoff


class AgentQuerySet(models.QuerySet):
    """Agents by the rules every surface shares (``fleet.ops.cluster``)."""

    def connected(self) -> "AgentQuerySet":
        """Agents holding a websocket, as the stored flag says (it can be stale: a web
        process killed without closing its sockets leaves it set)."""
        return self.filter(connected=True)

    def heard_from(self, now: datetime, listening_since: datetime | None = None) -> "AgentQuerySet":
        """Agents not lost at ``now`` (:func:`heard_cutoff`): their replicas keep their
        states, connected or not (a restarting agent's engines keep serving)."""
        cutoff = heard_cutoff(now, listening_since)
        return self.all() if cutoff is None else self.filter(last_seen_at__gte=cutoff)

    def lost(self, now: datetime, listening_since: datetime | None = None) -> "AgentQuerySet":
        """Agents silent past the lost grace at ``now``: the next pass marks their replicas lost."""
        cutoff = heard_cutoff(now, listening_since)
        if cutoff is None:
            return self.none()
        return self.filter(models.Q(last_seen_at__lt=cutoff) | models.Q(last_seen_at__isnull=True))

    def alive(self, now: datetime, listening_since: datetime | None = None) -> "AgentQuerySet":
        """Connected and heard from (:meth:`heard_from`): what the planner may place on
        (uncordoned), and what ``status``, the dashboard, the REST API and ``/metrics`` call
        alive."""
        return self.connected().heard_from(now, listening_since)


class Agent(models.Model):
    """One machine's agent. Its token is stored as SHA-256; ``generation`` moves whenever
    its desired replica set changes, which is what the web processes' watcher looks at."""

    name = models.CharField(max_length=128, unique=True)
    token_prefix = models.CharField(max_length=64, db_index=True, blank=True, default="")
    token_sha256 = models.CharField(max_length=64, blank=True, default="")
    connected = models.BooleanField(default=False)
    connected_since = models.DateTimeField(null=True, blank=True)
    #: Which websocket connection is current, so a late disconnect of an old one is ignored.
    session = models.CharField(max_length=64, blank=True, default="")
    last_seen_at = models.DateTimeField(null=True, blank=True)
    version = models.CharField(max_length=64, blank=True, default="")
    address = models.CharField(max_length=255, blank=True, default="")
    cpu_cores = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveIntegerField(default=0)
    cordoned = models.BooleanField(default=False, help_text="Cordoned: nothing new is placed.")
    generation = models.PositiveBigIntegerField(default=0, db_index=True)
    #: Moves when an operator asks the agent to restart (``llmgw restart``); the watcher of
    #: the web process holding its websocket sends ``restart_agent``.
    restart_generation = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = AgentQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        permissions = [
            ("cordon_agent", "Can cordon and uncordon agents"),
            ("drain_agent", "Can drain agents (cordon, move their replicas away)"),
        ]

    def __str__(self) -> str:
        return self.name

    def is_heard_from(self, now: datetime, listening_since: datetime | None = None) -> bool:
        """This agent as :meth:`AgentQuerySet.heard_from` sees it (no query)."""
        cutoff = heard_cutoff(now, listening_since)
        return cutoff is None or (self.last_seen_at is not None and self.last_seen_at >= cutoff)

    def is_alive(self, now: datetime, listening_since: datetime | None = None) -> bool:
        """This agent as :meth:`AgentQuerySet.alive` sees it (no query)."""
        return self.connected and self.is_heard_from(now, listening_since)

    def set_token(self, token: str) -> None:
        self.token_prefix = tokens.token_prefix(token)
        self.token_sha256 = tokens.token_hash(token)

    @classmethod
    def create_with_token(cls, name: str) -> tuple["Agent", str]:
        """Create (or re-key, see :meth:`rekey`) the agent ``name``; returns it and its new
        clear token, which is shown once and never stored."""
        agent, _ = cls.objects.get_or_create(name=name)
        return agent, agent.rekey()

    def rekey(self) -> str:
        """Give this agent a new token and return it (clear, to show once). The old token
        stops working at once: refused on connect, and the websocket it holds is closed
        after the commit (``fleet.groups.revoke_sessions``; docs/architecture.md, "Security":
        revocation is immediate)."""
        token = tokens.new_token("agent")
        self.set_token(token)
        self.save(update_fields=["token_prefix", "token_sha256"])
        _revoke_after_commit(self.pk)
        return token

    @classmethod
    def authenticate(cls, token: str) -> "Agent | None":
        """The agent holding ``token``, or None."""
        if not token:
            return None
        return tokens.find_by_token(cls.objects.filter(token_prefix=tokens.token_prefix(token)), token, "token_sha256")

    @classmethod
    def bump_generation(cls, agent_ids) -> None:
        """Tell the watchers these agents' desired sets changed."""
        ids = list(set(agent_ids))
        if ids:
            cls.objects.filter(id__in=ids).update(generation=F("generation") + 1)


def _revoke_after_commit(agent_id: int) -> None:
    transaction.on_commit(lambda: groups.revoke_sessions(agent_id))


@receiver(post_delete, sender=Agent, dispatch_uid="fleet-agent-deleted-revoke")
def _agent_deleted(sender, instance: Agent, **kwargs) -> None:
    """A deleted agent's websocket is closed too (its token is gone with the row)."""
    _revoke_after_commit(instance.pk)


class Gpu(models.Model):
    """One GPU as its agent last reported it (pynvml)."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveIntegerField()
    uuid = models.CharField(max_length=128, blank=True, default="")
    name = models.CharField(max_length=128, blank=True, default="")
    memory_total_mib = models.PositiveIntegerField(default=0)
    memory_used_mib = models.PositiveIntegerField(default=0)
    #: The last reading's compute utilisation (0-100) and temperature; None when the agent
    #: did not report them (simulated GPUs, an older agent, a driver that refused).
    utilisation_pct = models.FloatField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["agent__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["agent", "index"], name="gpu_unique_per_agent")
        ]

    def __str__(self) -> str:
        return f"{self.agent.name}:gpu{self.index}"


class GpuSample(models.Model):
    """One GPU's reading at one moment, kept for the admin's charts with the same retention
    as usage records (``ClusterSettings.history_retention_days``; ``llmgw.retention``).
    Written from agents' reports at most once per ``LLMGW_GPU_SAMPLE_EVERY_S`` per agent.
    ``agent_name`` survives the agent's deletion so old charts keep their labels."""

    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.SET_NULL, related_name="gpu_samples")
    agent_name = models.CharField(max_length=128)
    index = models.PositiveIntegerField()
    at = models.DateTimeField(default=timezone.now, db_index=True)
    memory_used_mib = models.PositiveIntegerField(default=0)
    memory_total_mib = models.PositiveIntegerField(default=0)
    utilisation_pct = models.FloatField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["at", "agent_name", "index"]
        indexes = [models.Index(fields=["agent_name", "index", "at"], name="gpusample_agent_gpu_at")]

    def __str__(self) -> str:
        return f"{self.agent_name}:gpu{self.index} @ {self.at:%Y-%m-%d %H:%M:%S}"


class ReplicaQuerySet(models.QuerySet):
    """Replicas by the named state sets of ``fleet.states``."""

    def in_states(self, states) -> "ReplicaQuerySet":
        """Replicas whose stored state is one of ``states`` (ReplicaState members)."""
        return self.filter(state__in=[ReplicaState(s).value for s in states])

    def live(self) -> "ReplicaQuerySet":
        """What an operator sees as the cluster: holding resources, or lost."""
        return self.in_states(LIVE)

    def not_stopped(self) -> "ReplicaQuerySet":
        return self.in_states(NOT_STOPPED)

    def ready(self) -> "ReplicaQuerySet":
        """Stored state ``ready``. A surface counting ready replicas also needs their agent
        heard from (``fleet.ops.cluster.ready_by_model``): on a lost agent, ready is lost."""
        return self.in_states([ReplicaState.READY])


class ModelStateQuerySet(models.QuerySet):
    def looked_at(self) -> "ModelStateQuerySet":
        """Models a reconcile pass has recorded its verdict on (``reason_at`` set; a row
        made by a request wanting the model is not one)."""
        return self.filter(reason_at__isnull=False)


class Replica(models.Model):
    """One engine process serving one model on one agent. State changes go through
    :meth:`transition`, which asserts the state machine (``fleet.states``)."""

    State = models.TextChoices("State", [(s.name, s.value) for s in ReplicaState])

    #: Null once its model was deleted: the row stays (draining, then stopping) while its
    #: engine may run, so its resources stay counted (docs/architecture.md, "Replica state
    #: machine": deletes drain). ``model_name`` keeps what to call it.
    model = models.ForeignKey(Model, null=True, blank=True, on_delete=models.SET_NULL, related_name="replicas")
    #: The model's name when it was placed (its engine's served name), kept after a delete.
    model_name = models.CharField(max_length=128, blank=True, default="")
    #: ``fleet.control.specs.spec_hash`` of what it was started from; "" = unknown (a row from
    #: before hashes), treated as current (docs/architecture.md, R10).
    spec_hash = models.CharField(max_length=64, blank=True, default="")
    #: None once its profile was deleted, which only a stopped replica allows
    #: (``catalog.models.Profile.in_use_checks``): history does not pin a profile.
    profile = models.ForeignKey(Profile, null=True, blank=True, on_delete=models.SET_NULL, related_name="replicas")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="replicas")
    gpu_indices = models.JSONField(default=list, blank=True)
    cpu_cores = models.FloatField(default=0)
    memory_mib = models.PositiveIntegerField(default=0)
    state = models.CharField(
        max_length=16, choices=State.choices, default=ReplicaState.PLACING.value, db_index=True
    )
    state_changed_at = models.DateTimeField(default=timezone.now)
    reason = models.TextField(blank=True, default="", help_text="Why it was placed or stopped.")
    error = models.TextField(blank=True, default="")
    pid = models.PositiveIntegerField(null=True, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    #: Placement → first ready, seconds: its cold start, measured once (docs/architecture.md,
    #: R11); None until it is ready (and for a replica that never was).
    cold_start_s = models.FloatField(null=True, blank=True)
    #: When the gateway last sent it a request; None = never told (not the same as idle).
    last_used_at = models.DateTimeField(null=True, blank=True)
    #: Fresh in-flight total from the gateways' reports; None = unknown.
    in_flight = models.PositiveIntegerField(null=True, blank=True)
    #: Engine load from its metrics; None = unknown.
    load_running = models.PositiveIntegerField(null=True, blank=True)
    load_waiting = models.PositiveIntegerField(null=True, blank=True)
    load_reported_at = models.DateTimeField(null=True, blank=True)
    #: While downloading: the fraction (0..1) of its weights the agent has; None otherwise.
    download_progress = models.FloatField(null=True, blank=True)
    #: The secret its engine is started with (``{api_key}``); only the gateway and the
    #: replica's agent ever see it. Never shown in the admin or the REST API.
    engine_key = models.CharField(max_length=64, default=tokens.new_engine_key, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ReplicaQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"r{self.pk} {self.shown_model_name} on {self.agent_id and self.agent.name}"

    def save(self, *args, **kwargs) -> None:
        """A new row records its model's name (``model_name``), which it keeps if the model
        is deleted; ``apply_plan`` sets it itself."""
        if self._state.adding and not self.model_name and self.model is not None:
            self.model_name = self.model.name
        super().save(*args, **kwargs)

    @property
    def shown_model_name(self) -> str:
        """Its model's name, or for a deleted model the name it was placed under, marked
        "(deleted)" (loads ``model`` unless selected)."""
        if self.model is not None:  # no query when model_id is None
            return self.model.name
        return f"{self.model_name or '?'} (deleted)"

    @property
    def url(self) -> str:
        return engine_url(self.agent.address, self.port)

    def transition(self, new: ReplicaState | str, **fields) -> bool:
        """Move to ``new`` if still in the state this object was loaded with (a conditional
        UPDATE, so two processes cannot both move it). Raises InvalidTransition for a move
        the state machine forbids; returns False if another process moved it first."""
        new = ReplicaState(new)
        old = ReplicaState(self.state)
        check_transition(old, new)
        now = timezone.now()
        values = dict(fields)
        if new != old:
            values["state"] = new.value
            values["state_changed_at"] = now
            if new == ReplicaState.READY:
                values["ready_at"] = now
                if old in COMING_UP and self.cold_start_s is None and self.created_at is not None:
                    # Its first ready: placement to ready is its cold start (R11). Not after a
                    # lost agent's return or a readiness blip: those are not starts.
                    values["cold_start_s"] = round(max(0.0, (now - self.created_at).total_seconds()), 3)
        if not values:
            return True
        updated = Replica.objects.filter(pk=self.pk, state=old.value).update(**values)
        if updated:
            for key, value in values.items():
                setattr(self, key, value)
        return bool(updated)


class ModelState(models.Model):
    """The fleet's memory of one model between passes (docs/architecture.md, "Decisions":
    scaling memory lives in ``ModelState``): when it was last wanted, the last placement result
    and scaling timers."""

    model = models.OneToOneField(Model, on_delete=models.CASCADE, related_name="fleet_state")
    wanted_at = models.DateTimeField(null=True, blank=True)
    desired = models.PositiveIntegerField(default=0)
    reason = models.TextField(blank=True, default="")
    reason_at = models.DateTimeField(null=True, blank=True)
    #: The last pass could not place what the model needs; ``reason`` says why.
    unservable = models.BooleanField(default=False)
    extra_replicas = models.PositiveIntegerField(default=0)
    busy_since = models.DateTimeField(null=True, blank=True)
    quiet_since = models.DateTimeField(null=True, blank=True)
    #: Requests one ready replica ran while others waited, at most (``fleet.planning.scaling``).
    observed_per_replica = models.PositiveIntegerField(null=True, blank=True)
    #: Since when, with nothing waiting, fewer replicas would be too full (``fleet.planning.scaling``).
    crowded_since = models.DateTimeField(null=True, blank=True)
    #: The requests in flight followed over time (``fleet.planning.scaling.Trend.as_json``).
    trend = models.JSONField(null=True, blank=True)
    #: Warm before demand (docs/architecture.md, R11): the hour-of-week profile of when it is
    #: asked for (``fleet.planning.warmth.ArrivalProfile.as_json``); what the last pass kept
    #: warm ahead of demand and why ("" for nothing); whether its one replica is kept on a
    #: prediction alone; when such a replica was last evicted for a wanted model.
    arrivals = models.JSONField(null=True, blank=True)
    #: Its cold-start estimate at the last pass: seconds, and how many starts it is the p90
    #: of (0: none measured, so ``cold_start_s`` is None and the cluster default applies).
    cold_start_s = models.FloatField(null=True, blank=True)
    cold_start_samples = models.PositiveIntegerField(default=0)
    warm_ahead = models.TextField(blank=True, default="")
    speculative = models.BooleanField(default=False)
    warm_evicted_at = models.DateTimeField(null=True, blank=True)

    objects = ModelStateQuerySet.as_manager()

    @property
    def looked_at(self) -> bool:
        """A pass recorded its verdict (:meth:`ModelStateQuerySet.looked_at`)."""
        return self.reason_at is not None

    def __str__(self) -> str:
        return f"state of {self.model_id}"


class PassLock(models.Model):
    """One row (pk 1) that serialises reconcile passes cluster-wide.

    Taken with a conditional UPDATE when free or expired (works on SQLite and PostgreSQL
    alike; docs/architecture.md, "Decisions": the pass lock is a row). ``requested`` counts
    pass requests: the holder releases only if no request arrived during its pass, otherwise it
    runs again, so a request is never lost to a skipped pass.
    """

    holder = models.CharField(max_length=255, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    requested = models.PositiveBigIntegerField(default=0)
    last_pass_at = models.DateTimeField(null=True, blank=True)
    last_pass_holder = models.CharField(max_length=255, blank=True, default="")

    @classmethod
    def ensure(cls) -> None:
        cls.objects.get_or_create(pk=1)

    @classmethod
    def request_pass(cls) -> None:
        cls.ensure()
        cls.objects.filter(pk=1).update(requested=F("requested") + 1)

    @classmethod
    def try_acquire(cls, holder: str, now: datetime, ttl_s: float) -> int | None:
        """Take the lock for ``holder``; returns the request counter seen, or None if
        another holder has it."""
        cls.ensure()
        with transaction.atomic():
            taken = (
                cls.objects.filter(pk=1)
                .filter(models.Q(holder="") | models.Q(expires_at__lt=now) | models.Q(holder=holder))
                .update(holder=holder, expires_at=now + timedelta(seconds=ttl_s))
            )
            if not taken:
                return None
            return cls.objects.values_list("requested", flat=True).get(pk=1)

    @classmethod
    def extend(cls, holder: str, now: datetime, ttl_s: float) -> bool:
        """Push the expiry of a lock ``holder`` still holds to ``now + ttl_s`` (a long pass
        keeps its lock; a dead holder's lock expires ``ttl_s`` after its last extension).
        False when ``holder`` no longer holds it."""
        return bool(cls.objects.filter(pk=1, holder=holder).update(expires_at=now + timedelta(seconds=ttl_s)))

    @classmethod
    def release_if_unchanged(cls, holder: str, seen: int, now: datetime) -> bool:
        """Release unless a pass was requested since ``seen``; True when released."""
        released = cls.objects.filter(pk=1, holder=holder, requested=seen).update(
            holder="", expires_at=None, last_pass_at=now, last_pass_holder=holder
        )
        return bool(released)


class LeaderLease(models.Model):
    """One row (pk 1): which worker leads, that is runs the passes on the cadence
    (docs/architecture.md, "Decisions": the leader is a lease).

    ``holder`` is the leading ``llmgw worker`` process (``host:pid``, as its
    ``ControlPlane`` row); it renews every ``LLMGW_LEADER_RENEW`` until ``expires_at``
    (``LLMGW_LEADER_LEASE`` ahead). Taken and renewed with conditional UPDATEs, as the pass
    lock: a standby takes it only once it is free or expired, so a dead leader is replaced
    within one lease. ``since`` is when the current holder took it.
    """

    holder = models.CharField(max_length=255, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    since = models.DateTimeField(null=True, blank=True)

    @classmethod
    def ensure(cls) -> None:
        cls.objects.get_or_create(pk=1)

    @classmethod
    def take_or_renew(cls, holder: str, now: datetime, lease_s: float) -> bool:
        """Renew the lease if ``holder`` has it, else take it if it is free or expired at
        ``now``; True when ``holder`` leads until ``now + lease_s``."""
        cls.ensure()
        expires = now + timedelta(seconds=lease_s)
        if cls.objects.filter(pk=1, holder=holder).update(expires_at=expires):
            return True
        taken = cls.objects.filter(pk=1).filter(
            models.Q(holder="") | models.Q(expires_at__isnull=True) | models.Q(expires_at__lt=now)
        ).update(holder=holder, expires_at=expires, since=now)
        return bool(taken)

    @classmethod
    def release(cls, holder: str) -> bool:
        """Give the lease up (a worker stopping): a standby takes it at its next renewal
        instead of waiting for it to expire. False if ``holder`` did not have it."""
        return bool(cls.objects.filter(pk=1, holder=holder).update(holder="", expires_at=None, since=None))

    @classmethod
    def leader(cls, now: datetime) -> str:
        """The holder of a lease live at ``now`` (``host:pid``), or '' when nobody leads."""
        row = cls.objects.filter(pk=1, expires_at__gte=now).exclude(holder="").values_list("holder", flat=True)
        return row.first() or ""


class UsageReport(models.Model):
    """One web process's latest word on one replica: requests in flight and last use.

    The reconciler sums fresh reports; a replica without a fresh report has an *unknown*
    in-flight count, never 0 (docs/architecture.md, "Crossing processes": usage reports;
    "Decisions": unknown is not zero).
    """

    process = models.CharField(max_length=255)
    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="usage_reports")
    in_flight = models.PositiveIntegerField(default=0)
    last_used_at = models.DateTimeField(null=True, blank=True)
    reported_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["process", "replica"], name="usage_one_per_process")
        ]


class QueueReportQuerySet(models.QuerySet):
    def fresh(self, now: datetime) -> "QueueReportQuerySet":
        """Reports made within ``LLMGW_LOAD_STALE`` of ``now``. A live process re-stamps a
        non-zero queue every third of that, so an older row is a process gone or stalled,
        whose queue went with it (its requests failed or reached engines): it counts no more."""
        return self.filter(reported_at__gte=now - timedelta(seconds=settings.LLMGW_LOAD_STALE_S))

    def waiting_by_model(self) -> dict[int, int]:
        """Model id → requests waiting, summed over the web processes (one query)."""
        return dict(self.values("model_id").annotate(total=models.Sum("waiting")).values_list("model_id", "total"))


class QueueReport(models.Model):
    """One web process's latest word on one model's admission queue: requests waiting in
    the gateway because the model's routed replicas are at capacity, which its engines never
    saw. The reconciler adds the fresh ones to the model's engine load (``waiting``), so load
    scaling steps up (``fleet.control.snapshot``).

    Written by the process's watcher when a depth changes, and re-stamped every
    ``LLMGW_LOAD_STALE / 3`` while it is not zero (``fleet.live.watch.QueueDepths``); a queue
    back at 0 deletes its row."""

    process = models.CharField(max_length=255)
    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="queue_reports")
    waiting = models.PositiveIntegerField(default=0)
    reported_at = models.DateTimeField()

    objects = QueueReportQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["process", "model"], name="queue_one_per_process")
        ]

    def __str__(self) -> str:
        return f"{self.waiting} waiting for {self.model_id} at {self.process}"


class ControlPlane(models.Model):
    """A control-plane process (web or worker) that registered itself, so ``status`` and
    ``restart`` know every host. The leader is the worker holding ``LeaderLease``; the
    other workers heard from lately are its standbys."""

    class Role(models.TextChoices):
        WEB = "web", "web"
        WORKER = "worker", "worker"

    host = models.CharField(max_length=255)
    role = models.CharField(max_length=16, choices=Role.choices)
    pid = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["host", "role"]
        constraints = [models.UniqueConstraint(fields=["host", "role", "pid"], name="control_plane_unique")]

    def __str__(self) -> str:
        return f"{self.role} on {self.host} (pid {self.pid})"

    @classmethod
    def heartbeat(cls, role: str) -> None:
        """Register or refresh this process (called every few seconds by web and worker)."""
        now = timezone.now()
        host, pid = this_process()
        updated = cls.objects.filter(host=host, role=role, pid=pid).update(last_seen_at=now)
        if not updated:
            cls.objects.get_or_create(host=host, role=role, pid=pid,
                                      defaults={"started_at": now, "last_seen_at": now})

    @classmethod
    def forget(cls, role: str) -> None:
        """Remove this process's row (it is stopping cleanly: ``status`` stops listing it)."""
        host, pid = this_process()
        cls.objects.filter(host=host, role=role, pid=pid).delete()


class ScalingEvent(models.Model):
    """One load-scaling step: a model went from one replica count to another, and why."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="scaling_events")
    at = models.DateTimeField(default=timezone.now, db_index=True)
    from_replicas = models.PositiveIntegerField()
    to_replicas = models.PositiveIntegerField()
    reason = models.TextField()

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.model}: {self.from_replicas} → {self.to_replicas} ({self.reason})"


class OperatorAction(models.Model):
    """One act of an operator on the running cluster, from any surface (the CLI, the
    dashboard, the REST API): stop, start, cordon, uncordon, drain, evict, agents'
    restart. ``actor``: who ("alice (dashboard)", "root (CLI)"); ``target``: what it was
    done to (an agent's or model's name, "cluster"); ``detail``: its effect in words.
    Written by ``fleet.ops.operations``; read by ``llmgw changes`` and the dashboard's
    "Changes" page; pruned with usage records (``llmgw.retention``)."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.CharField(max_length=150, blank=True, default="")
    action = models.CharField(max_length=32)
    target = models.CharField(max_length=150, blank=True, default="")
    detail = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor or 'someone'}: {self.action} {self.target}".rstrip()


class ApiToken(models.Model):
    """A staff member's token for the REST API: stored as SHA-256, found by its visible
    prefix (docs/architecture.md, "Security": tokens); the clear token is shown once.

    A token expires ``LLMGW_API_TOKEN_TTL`` after it was issued (0: never); the expiry is
    computed from ``created_at`` on every use, so shortening the setting takes effect at
    once, for tokens issued before too. Deleting the row (the admin's REST API tokens page)
    revokes it at once: every request looks the token up."""

    #: ``last_used_at`` is written at most this often per token (seconds), not per request.
    LAST_USED_RESOLUTION_S = 60

    user = models.ForeignKey("auth.User", on_delete=models.CASCADE, related_name="llmgw_api_tokens")
    prefix = models.CharField(max_length=64, db_index=True)
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "REST API token"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.user} ({self.prefix}…)"

    @classmethod
    def issue(cls, user) -> str:
        """A new token for ``user``; returns the clear token (never stored)."""
        clear = tokens.new_token("api")
        cls.objects.create(user=user, prefix=tokens.token_prefix(clear), sha256=tokens.token_hash(clear))
        return clear

    @property
    def expires_at(self) -> datetime | None:
        """When the token stops working (``created_at`` + ``LLMGW_API_TOKEN_TTL``), or None
        when tokens do not expire (TTL 0)."""
        ttl_s = float(getattr(settings, "LLMGW_API_TOKEN_TTL_S", 0) or 0)
        if ttl_s <= 0 or self.created_at is None:
            return None
        return self.created_at + timedelta(seconds=ttl_s)

    def expired(self, now: datetime | None = None) -> bool:
        expires_at = self.expires_at
        return expires_at is not None and expires_at <= (now or timezone.now())

    def touch(self, now: datetime | None = None) -> None:
        """Record a use, writing at most once per ``LAST_USED_RESOLUTION_S`` (a conditional
        UPDATE: concurrent requests do not pile up writes)."""
        now = now or timezone.now()
        if self.last_used_at and (now - self.last_used_at).total_seconds() < self.LAST_USED_RESOLUTION_S:
            return
        cutoff = now - timedelta(seconds=self.LAST_USED_RESOLUTION_S)
        ApiToken.objects.filter(pk=self.pk).filter(
            models.Q(last_used_at__isnull=True) | models.Q(last_used_at__lt=cutoff)).update(last_used_at=now)
        self.last_used_at = now


def _live_replicas_of(profile: Profile) -> list[Replica]:
    """Replicas started from ``profile`` whose engine may still run (``LIVE``): deleting the
    profile is refused while there are any (``catalog.models.Profile.in_use_checks``)."""
    return list(Replica.objects.filter(profile=profile).live().select_related("model", "agent")[:20])


Profile.in_use_checks.append(_live_replicas_of)
