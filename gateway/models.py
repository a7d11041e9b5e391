"""API keys and teams for /v1/, their limits, and the per-request usage records."""

from __future__ import annotations

import math
from datetime import datetime

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.utils import timezone

from catalog.models import Model
from llmgw import tokens
from llmgw.permissions import Act


class Priority(models.IntegerChoices):
    """A request's priority class in the admission queue (docs/architecture.md, "Tenants"):
    a higher class is always admitted first. A key or team has one; a request may ask for a
    lower one with ``X-Llmgw-Priority``, never a higher."""

    LOW = 0, "low"
    NORMAL = 1, "normal"
    HIGH = 2, "high"


def _limit(help_text: str) -> models.PositiveIntegerField:
    return models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)],
                                       help_text=help_text + " Empty: no limit.")


class Limits(models.Model):
    """The limits a team and a key may each carry (the stricter of a key's and its team's
    applies; docs/architecture.md, "Tenants"). Tokens are prompt + completion. Minutes are
    fixed 60 s windows; days and months are UTC calendar days and months."""

    requests_per_minute = _limit("Requests admitted per minute.")
    tokens_per_minute = _limit("Prompt + completion tokens per minute (reserved from the request's max_tokens at "
                               "admission, settled with the real count at the end).")
    max_concurrent_requests = _limit("Requests at once (held, queued or running).")
    tokens_per_day = _limit("Token budget per UTC day, every model together.")
    tokens_per_month = _limit("Token budget per UTC month, every model together.")

    class Meta:
        abstract = True

    def limit_fields(self) -> dict[str, int | None]:
        """The limits by field name (None: no limit)."""
        return {name: getattr(self, name) for name in LIMIT_FIELDS}


#: The fields of :class:`Limits`, in the order people read them.
LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests", "tokens_per_day",
                "tokens_per_month")


class Team(Limits):
    """A group of keys sharing limits, a priority class and a weight in the admission
    queue's fair share (a team of weight 2 gets twice the tokens of a team of weight 1 when
    both wait)."""

    name = models.CharField(max_length=128, unique=True)
    priority = models.IntegerField(choices=Priority.choices, default=Priority.NORMAL)
    weight = models.FloatField(default=1.0, validators=[MinValueValidator(0.01), MaxValueValidator(1000.0)],
                               help_text="Share of the tokens when the model is full and teams wait (relative).")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """A name people can read on one line; a weight that is a number (NaN passes the
        range validators)."""
        if self.name and any(ord(ch) < 32 or ord(ch) == 127 for ch in self.name):
            raise ValidationError({"name": "A team's name cannot contain control characters (a newline, a tab…)."})
        if self.weight is not None and not math.isfinite(self.weight):
            raise ValidationError({"weight": "The weight must be a number between 0.01 and 1000."})


class ApiKey(Limits):
    """A client's key: stored as SHA-256 with a visible prefix (the clear key is shown once,
    at creation), optionally limited to some models, with expiry and revocation that apply
    within a fraction of a second (the gateway caches keys for one watcher refresh)."""

    class State(models.TextChoices):
        """Where a key stands (:attr:`ApiKey.state`; computed, not stored)."""

        ACTIVE = "active", "active"
        EXPIRED = "expired", "expired"
        REVOKED = "revoked", "revoked"

    name = models.CharField(max_length=128)
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.SET_NULL, related_name="keys",
                             help_text="The team whose limits apply too (the stricter wins).")
    priority = models.IntegerField(choices=Priority.choices, null=True, blank=True,
                                   help_text="Priority class in the admission queue. Empty: the team's (normal "
                                             "without a team).")
    prefix = models.CharField(max_length=64, db_index=True, editable=False)
    sha256 = models.CharField(max_length=64, editable=False)
    allowed_models = models.ManyToManyField(Model, blank=True, related_name="api_keys",
                                    help_text="Models this key may use. None selected: every model.")
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "API key"
        permissions = [("revoke_apikey", "Can revoke API keys")]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def create_key(cls, name: str, model_names: list[str] | None = None,
                   expires_at: datetime | None = None, team: "Team | None" = None,
                   priority: int | None = None, **limits: int | None) -> tuple["ApiKey", str]:
        """Create a key; returns it and the clear key (shown once, never stored).
        ``limits``: any of :data:`LIMIT_FIELDS`. Raises Model.DoesNotExist naming a model
        that is not in the catalog, TypeError for a limit that does not exist."""
        unknown = set(limits) - set(LIMIT_FIELDS)
        if unknown:
            raise TypeError(f"no such limit: {', '.join(sorted(unknown))}")
        for field_name, value in limits.items():  # ValidationError for 0, negative or too large
            if value is not None:
                cls._meta.get_field(field_name).clean(value, None)
        clear = tokens.new_token("key")
        models_ = []
        for model_name in model_names or []:
            model = Model.resolve(model_name)
            if model is None:
                raise Model.DoesNotExist(f"no model called {model_name!r}")
            models_.append(model)
        # One transaction: a gateway must never see the key without its model limits.
        with transaction.atomic():
            key = cls(name=name, prefix=tokens.token_prefix(clear), sha256=tokens.token_hash(clear),
                      expires_at=expires_at, team=team, priority=priority, **limits)
            key.save()
            key.allowed_models.add(*models_)
        return key, clear

    def expiry_act(self, expires_at: datetime | None, now: datetime | None = None):
        """The act that setting this key's expiry to ``expires_at`` is, beyond changing a
        key (``llmgw.permissions.Act``), or None: moving the expiry earlier (an active key
        stops working then, or at once) is revoking it; making an expired key work again is
        issuing one."""
        now = now or timezone.now()
        old = self.expires_at
        if old is not None and old <= now:
            return Act.CREATE_KEY if (expires_at is None or expires_at > now) and self.revoked_at is None else None
        if expires_at is not None and (old is None or expires_at < old):
            return Act.REVOKE_KEY
        return None

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at", "updated_at"])

    @property
    def state(self) -> "ApiKey.State":
        """Revoked (whatever its expiry), else expired once ``expires_at`` has passed, else active."""
        if self.revoked_at:
            return ApiKey.State.REVOKED
        if self.expires_at and self.expires_at <= timezone.now():
            return ApiKey.State.EXPIRED
        return ApiKey.State.ACTIVE


class ModelBudget(models.Model):
    """A token budget of a team or a key for one model (beside the budgets for every model
    on :class:`Team` and :class:`ApiKey`)."""

    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="model_budgets")
    key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.CASCADE, related_name="model_budgets")
    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="budgets")
    tokens_per_day = _limit("Token budget per UTC day for this model.")
    tokens_per_month = _limit("Token budget per UTC month for this model.")
    #: When it was last set: names its counters (``gateway.quotas.Subject.budget_version``).
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(team__isnull=False, key__isnull=True)
                                   | models.Q(team__isnull=True, key__isnull=False), name="budget_one_owner"),
            models.UniqueConstraint(fields=["team", "model"], name="budget_one_per_team_model"),
            models.UniqueConstraint(fields=["key", "model"], name="budget_one_per_key_model"),
        ]

    #: Why a budget row with neither limit is refused (admin, REST).
    EMPTY = "Give a token budget per day, per month or both (or remove the row)."

    def __str__(self) -> str:
        return f"budget of {self.team or self.key} for {self.model}"

    def clean(self) -> None:
        if self.tokens_per_day is None and self.tokens_per_month is None:
            raise ValidationError(self.EMPTY)

    @classmethod
    def set_for(cls, owner: "Team | ApiKey", model: Model, tokens_per_day: int | None,
                tokens_per_month: int | None) -> "ModelBudget | None":
        """Set ``owner``'s (a team or a key) token budget for ``model`` (tokens per UTC day
        and month, None: no limit); with neither, remove it. Returns the budget, or None
        when removed. The gateway applies it within one watcher refresh."""
        owner_field = "team" if isinstance(owner, Team) else "key"
        if tokens_per_day is None and tokens_per_month is None:
            cls.objects.filter(**{owner_field: owner}, model=model).delete()
            return None
        budget, _ = cls.objects.update_or_create(
            **{owner_field: owner}, model=model,
            defaults={"tokens_per_day": tokens_per_day, "tokens_per_month": tokens_per_month})
        return budget

    @classmethod
    def replace_for(cls, owner: "Team | ApiKey", budgets: list[dict]) -> None:
        """Make ``owner``'s budgets exactly ``budgets`` (``{"model", "tokens_per_day",
        "tokens_per_month"}`` each, one per model), in one transaction."""
        owner_field = "team" if isinstance(owner, Team) else "key"
        with transaction.atomic():
            cls.objects.filter(**{owner_field: owner}).delete()
            cls.objects.bulk_create([cls(**{owner_field: owner}, model=b["model"],
                                         tokens_per_day=b.get("tokens_per_day"),
                                         tokens_per_month=b.get("tokens_per_month")) for b in budgets])


class UsageRecord(models.Model):
    """One /v1/ request: who, which model (its catalog name, whatever alias the client used)
    and replica, the answer's status (and the upstream's, where it differs in meaning),
    tokens, timing. Written in batches by the web process; flushed when it shuts down."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="usage")
    #: The key's team when the request was made (a plain id: the record outlives the team),
    #: so a team's budget is seeded from what its keys spent while they were in it.
    team_id = models.PositiveIntegerField(null=True, blank=True, db_index=True)
    model_name = models.CharField(max_length=128, db_index=True)
    replica_id = models.PositiveIntegerField(null=True, blank=True)
    path = models.CharField(max_length=128)
    status = models.PositiveSmallIntegerField(help_text="The status the client got.")
    upstream_status = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="The engine's (or external service's) own status, where one answered: an "
        "engine's 500 reaches the client as 502 engine_error and is kept here as 500.")
    stream = models.BooleanField(default=False)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True)
    total_ms = models.FloatField()
    overhead_ms = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.model_name} {self.status}"
