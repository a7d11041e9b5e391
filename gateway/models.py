"""API keys for /v1/ and the per-request usage records."""

from __future__ import annotations

from datetime import datetime

from django.db import models, transaction
from django.utils import timezone

from catalog.models import Model
from llmgw import tokens
from llmgw.permissions import Act


class ApiKey(models.Model):
    """A client's key: stored as SHA-256 with a visible prefix (the clear key is shown once,
    at creation), optionally limited to some models, with expiry and revocation that apply
    within a fraction of a second (the gateway caches keys for one watcher refresh)."""

    class State(models.TextChoices):
        """Where a key stands (:attr:`ApiKey.state`; computed, not stored)."""

        ACTIVE = "active", "active"
        EXPIRED = "expired", "expired"
        REVOKED = "revoked", "revoked"

    name = models.CharField(max_length=128)
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
                   expires_at: datetime | None = None) -> tuple["ApiKey", str]:
        """Create a key; returns it and the clear key (shown once, never stored).
        Raises Model.DoesNotExist naming a model that is not in the catalog."""
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
                      expires_at=expires_at)
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


class UsageRecord(models.Model):
    """One /v1/ request: who, which model (its catalog name, whatever alias the client used)
    and replica, the answer's status (and the upstream's, where it differs in meaning),
    tokens, timing. Written in batches by the web process; flushed when it shuts down."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="usage")
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
