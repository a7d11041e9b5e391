"""What the operators want: models, engine profiles and the cluster's settings.

``catalog`` imports nothing from ``fleet`` or ``gateway`` (docs/architecture.md, "Dependency
direction").
"""

from __future__ import annotations

import re
import zoneinfo

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import ProtectedError, Q
from django.db.models.signals import pre_delete
from django.dispatch import receiver

from catalog import schedules
from catalog.engines import OPENAI_LIKE, EngineTraits, engine_traits
from catalog.presets import PLACEHOLDERS, PRESETS, template_fields, uses_api_key
from catalog.weights import parse_weights_source

#: The largest default_max_tokens accepted: beyond any context window, inside a 32-bit column.
MAX_TOKENS_LIMIT = 100_000_000

#: The endpoints under ``/v1/`` a model can serve, as the gateway names them (the path after
#: ``/v1/``): the ones OpenAI's API and every engine in our presets share. Anything else
#: under ``/v1/`` (engine-private ``/slots``, ``/props``, ``/v1/load_lora_adapter``,
#: tokenizer endpoints…) never goes upstream (docs/architecture.md, "Gateway rules": paths). A
#: model's ``endpoints`` field narrows this set.
OPENAI_ENDPOINTS = ("chat/completions", "completions", "embeddings")

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


def validate_model_name(value: str) -> None:
    """Model names and aliases: letters, digits and ``. _ : / -``, up to 128 characters."""
    if not NAME_RE.match(value):
        raise ValidationError(
            f"'{value}' is not a valid model name: use letters, digits and . _ : / - "
            "(starting with a letter or digit, at most 128 characters)."
        )


#: Changing a model's external base URL without giving its API key again: the gateway sends
#: the stored key to that URL, so whoever may change the URL could collect the key there.
KEY_STAYS_WITH_ITS_URL = ("The stored external API key is not sent to a new address: give it again with the new "
                          "external base URL (or remove it).")


class Profile(models.Model):
    """How to run an engine: its command template, the resources one replica needs, and how
    to tell it is ready and how loaded it is. See ``catalog.presets`` for the placeholders.
    """

    class Engine(models.TextChoices):
        LLAMA_CPP_PYTHON = "llama_cpp_python", "llama-cpp-python server"
        LLAMA_SERVER = "llama_server", "llama.cpp llama-server"
        VLLM = "vllm", "vLLM"
        SGLANG = "sglang", "SGLang"
        CUSTOM = "custom", "Custom command"

    name = models.SlugField(max_length=64, unique=True)
    engine = models.CharField(max_length=32, choices=Engine.choices, default=Engine.CUSTOM)
    command = models.TextField(
        help_text="Command template. Placeholders: "
        + ", ".join("{" + p + "}" for p in sorted(PLACEHOLDERS))
        + ". {port} is required. Without {api_key} (here or in env) anyone who reaches the "
        "engine's port can use it around the gateway."
    )
    gpus_needed = models.PositiveIntegerField(
        default=0, help_text="GPUs per replica (tensor-parallel size). 0 = CPU-only."
    )
    gpu_memory_mib = models.PositiveIntegerField(
        default=0, help_text="Memory each of those GPUs must have, in MiB."
    )
    cpu_cores = models.FloatField(
        default=0, validators=[MinValueValidator(0)], help_text="CPU cores a replica uses."
    )
    memory_mib = models.PositiveIntegerField(default=0, help_text="RAM a replica uses, in MiB.")
    env = models.JSONField(
        default=dict, blank=True, help_text='Extra environment, e.g. {"OMP_NUM_THREADS": "1"}. '
        '{api_key} in a value is replaced by the replica\'s engine key, e.g. {"VLLM_API_KEY": "{api_key}"}.'
    )
    readiness_path = models.CharField(max_length=200, default="/v1/models")
    startup_timeout_s = models.PositiveIntegerField(
        default=300, validators=[MinValueValidator(1)], help_text="Seconds to become ready."
    )
    metrics_path = models.CharField(max_length=200, blank=True, default="")
    metric_running = models.CharField(max_length=120, blank=True, default="")
    metric_waiting = models.CharField(max_length=120, blank=True, default="")
    endpoints = models.CharField(
        max_length=200, blank=True, default="",
        help_text="Endpoints under /v1/ its engines serve, comma-separated (of " + ", ".join(OPENAI_ENDPOINTS)
        + "). Empty: what the engine serves started with this command (chat/completions and completions; "
        "embeddings too when the command starts it for them, e.g. llama-server --embedding, vLLM --task embed, "
        "SGLang --is-embedding; a custom engine: all). A model's own endpoints narrow this further.",
    )
    notes = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["name"]
        permissions = [
            ("change_engine_code",
             "Can change engine commands, environment and pypi:/file: weights (runs code on every agent)"),
        ]

    #: Callables ``(profile) -> list of objects`` that still need a profile although no
    #: foreign key protects it — ``fleet`` registers its replicas that may still run (their
    #: stopped rows let go of it). Deleting a profile is refused while any returns something
    #: (:func:`_refuse_delete_in_use`), the admin lists them as protected.
    in_use_checks: list = []

    def __str__(self) -> str:
        return self.name

    def delete(self, *args, **kwargs):
        """Refused with ProtectedError while :meth:`in_use_by` names something — checked
        here, before Django's delete opens its transaction, so a refusal leaves the caller's
        transaction usable (the pre_delete check behind it covers queryset deletes)."""
        in_use = self.in_use_by()
        if in_use:
            raise ProtectedError(f"Profile {self} is used by replicas that may still run", set(in_use))
        return super().delete(*args, **kwargs)

    def in_use_by(self) -> list:
        """What :attr:`in_use_checks` say still needs this profile (empty: free to delete,
        as far as they know; models using it are protected by their own foreign key)."""
        return [obj for check in self.in_use_checks for obj in check(self)]

    @property
    def protects_engine(self) -> bool:
        """Whether its engines are started with the replica's engine key (``{api_key}`` in the
        command or env), so that only the gateway can use them (docs/architecture.md,
        "Security": engine keys). A custom command may go without (engines that take no key):
        allowed, but shown as unprotected in the admin and in ``llmgw explain``."""
        return uses_api_key(self.command, self.env if isinstance(self.env, dict) else {})

    @property
    def engine_traits(self) -> EngineTraits:
        """What its engines do themselves, from its engine kind and command
        (:func:`catalog.engines.engine_traits`)."""
        return engine_traits(self.engine, self.command or "")

    @property
    def served_endpoints(self) -> frozenset[str]:
        """The endpoints under ``/v1/`` its engines serve: its ``endpoints`` field if set,
        else the engine's default for its command."""
        if (self.endpoints or "").strip():
            return Model.parse_endpoints(self.endpoints)
        return self.engine_traits.endpoints

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        unknown_endpoints = sorted(Model.parse_endpoints(self.endpoints) - set(OPENAI_ENDPOINTS))
        if unknown_endpoints:
            errors.setdefault("endpoints", []).append(
                f"Unknown endpoint(s) {', '.join(unknown_endpoints)}: choose from {', '.join(OPENAI_ENDPOINTS)}."
            )
        try:
            fields = template_fields(self.command or "")
        except ValueError as exc:
            errors.setdefault("command", []).append(str(exc))
        else:
            unknown = sorted(fields - PLACEHOLDERS)
            if unknown:
                errors.setdefault("command", []).append(
                    "Unknown placeholder(s): " + ", ".join("{" + u + "}" for u in unknown)
                )
            if "port" not in fields:
                errors.setdefault("command", []).append(
                    "The command must contain {port}: the agent chooses the engine's port."
                )
        if self.gpus_needed > 0 and self.gpu_memory_mib == 0:
            errors.setdefault("gpu_memory_mib", []).append(
                "Say how much memory each GPU needs (MiB)."
            )
        if self.gpus_needed == 0 and self.cpu_cores <= 0:
            errors.setdefault("cpu_cores", []).append(
                "A CPU-only profile (0 GPUs) needs at least some CPU cores."
            )
        # Both are appended to http://127.0.0.1:PORT by every agent: not starting with "/",
        # "@host/…" would send the agents to another host.
        for name in ("readiness_path", "metrics_path"):
            if getattr(self, name) and not getattr(self, name).startswith("/"):
                errors.setdefault(name, []).append("Start the path with '/'.")
        if not isinstance(self.env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in (self.env or {}).items()
        ):
            errors.setdefault("env", []).append("Use an object of string names to strings.")
        if errors:
            raise ValidationError(errors)

    @classmethod
    def from_preset(cls, preset: str, name: str | None = None) -> "Profile":
        """An unsaved Profile filled from ``catalog.presets.PRESETS[preset]`` (KeyError if
        the preset does not exist)."""
        values = dict(PRESETS[preset])
        values["env"] = dict(values.get("env") or {})  # never share the preset's dict
        return cls(name=name or preset, **values)



@receiver(pre_delete, sender=Profile, dispatch_uid="catalog-profile-in-use")
def _refuse_delete_in_use(sender, instance: Profile, **kwargs) -> None:
    """Deleting a profile that replicas may still run with raises ProtectedError (the REST
    API answers 409 naming them, the admin lists them): their engines were started from it."""
    in_use = instance.in_use_by()
    if in_use:
        raise ProtectedError(f"Profile {instance} is used by replicas that may still run", set(in_use))


class RoutingPolicy(models.TextChoices):
    """How the gateway chooses among a model's ready replicas (``fleet.planning.routing``,
    whose names these are; docs/architecture.md, "Gateway rules": routing)."""

    LEAST_LOADED = "least-loaded", "least-loaded: fewest requests in flight"
    PREFIX_AFFINITY = "prefix-affinity", "prefix-affinity: where the prompt's prefix was sent (bounded load)"
    SESSION = "session", "session: by X-Session-Id or user, else by prefix (bounded load)"


class Model(models.Model):
    """A model clients can ask for by name or alias.

    Served here (a ``profile`` and ``weights``) or elsewhere (an ``external_base_url``, only
    proxied). Scaling: ``min_replicas``..``max_replicas``; an ``on_demand`` model with min 0
    runs one replica while it was asked for within its idle timeout (docs/architecture.md,
    R6).
    """

    name = models.CharField(max_length=128, unique=True, validators=[validate_model_name])
    aliases = models.CharField(
        max_length=1000, blank=True, default="", help_text="Other names, comma-separated."
    )
    weights = models.CharField(
        max_length=500,
        blank=True,
        default="",
        help_text="pypi:PACKAGE, file:/path, hf:ORG/NAME[/FILE] or mirror:NAME.",
    )
    profile = models.ForeignKey(
        Profile, null=True, blank=True, on_delete=models.PROTECT, related_name="models"
    )
    min_replicas = models.PositiveIntegerField(default=0)
    max_replicas = models.PositiveIntegerField(default=1)
    on_demand = models.BooleanField(
        default=False, help_text="Start a replica when asked for; evict after the idle timeout."
    )
    idle_timeout_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="Seconds without requests before an on-demand model "
        "is evicted. Empty: the cluster default."
    )
    default_max_tokens = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(MAX_TOKENS_LIMIT)],
        help_text="Tokens to generate when a request sets neither max_tokens nor "
        "max_completion_tokens (served here only). Empty: the engine decides (often until its "
        "context is full).",
    )
    context_length = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(MAX_TOKENS_LIMIT)],
        help_text="Tokens of context (prompt plus output) a request may use. Empty: the smaller of what the "
        "profile's command sets (--n_ctx, -c/--ctx-size, --max-model-len, --context-length) and what the "
        "weights say (detected by the agent); unknown if neither is known. Set it to override both.",
    )
    max_output_tokens = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(MAX_TOKENS_LIMIT)],
        help_text="The most tokens a request may ask to generate (max_tokens, max_completion_tokens). "
        "Empty: no limit beyond the context length.",
    )
    weights_context_length = models.PositiveIntegerField(
        null=True, blank=True, editable=False,
        help_text="The context length the weights were trained for, as the agent read it from their "
        "metadata (GGUF), read when a replica starts; not for editing.",
    )
    external_base_url = models.URLField(
        blank=True, default="", help_text="Served elsewhere: requests are forwarded here."
    )
    external_api_key = models.CharField(max_length=500, blank=True, default="")
    endpoints = models.CharField(
        max_length=200, blank=True, default="",
        help_text="Endpoints under /v1/ this model serves, comma-separated (of "
        + ", ".join(OPENAI_ENDPOINTS) + "). Empty: what its profile serves (an external model: all). "
        "Others answer 404 and are never forwarded (nor is an external model's key).",
    )
    external_forward_org_headers = models.BooleanField(
        default=False,
        help_text="External models only: forward the client's OpenAI-Organization and "
        "OpenAI-Project headers to the external service. Off: a client cannot pick which "
        "organization or project of the operator's key is billed.",
    )
    routing_policy = models.CharField(
        max_length=20, choices=RoutingPolicy.choices, default=RoutingPolicy.LEAST_LOADED,
        help_text="How requests choose among this model's replicas. prefix-affinity sends a prompt to the "
        "replica that most likely holds its prefix in its cache (long shared system prompts: far less "
        "prefill), spilling to another when that one runs 2 requests more than the least loaded (25% more past 8); session "
        "keeps one X-Session-Id (or user) on one replica. Changing it restarts nothing.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        permissions = [
            ("want_model", "Can want an on-demand model (start a replica now)"),
            ("evict_model", "Can evict an on-demand model (drain its replicas)"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def alias_list(self) -> list[str]:
        return [a.strip() for a in self.aliases.split(",") if a.strip()]

    @property
    def is_external(self) -> bool:
        return bool(self.external_base_url)

    @staticmethod
    def known_names() -> set[str]:
        """Every catalog model's name and aliases (one query): a usage record's model name
        outside it is a client's invention (404 model_not_found), shown as "unknown model"."""
        names: set[str] = set()
        for name, aliases in Model.objects.values_list("name", "aliases"):
            names.add(name)
            names.update(a.strip() for a in (aliases or "").split(",") if a.strip())
        return names

    @staticmethod
    def parse_endpoints(text: str) -> frozenset[str]:
        """The endpoints an ``endpoints`` value names (``"chat/completions, embeddings"``);
        blank: all of :data:`OPENAI_ENDPOINTS`. Unknown names are kept (``clean`` rejects
        them; the gateway then serves none of them)."""
        names = frozenset(e.strip().strip("/") for e in (text or "").split(",") if e.strip())
        return names or frozenset(OPENAI_ENDPOINTS)

    @property
    def served_endpoints(self) -> frozenset[str]:
        """The endpoints under ``/v1/`` this model serves (docs/architecture.md, "Gateway
        rules": paths): its own ``endpoints`` if set, else its profile's
        (:attr:`Profile.served_endpoints`), else (an external model) all of them."""
        if (self.endpoints or "").strip():
            return self.parse_endpoints(self.endpoints)
        if self.profile_id and not self.is_external:
            return self.profile.served_endpoints
        return frozenset(OPENAI_ENDPOINTS)

    @property
    def engine_traits(self) -> EngineTraits:
        """What its engines do themselves (:class:`catalog.engines.EngineTraits`); an
        external model (or one without a profile) is treated as OpenAI itself."""
        if self.profile_id and not self.is_external:
            return self.profile.engine_traits
        return OPENAI_LIKE

    def token_limits(self) -> tuple[int | None, int | None]:
        """``(context_length, max_output_tokens)`` in tokens, each None when unknown.

        Context: the operator's ``context_length``, else the smaller of the profile command's
        flag and ``weights_context_length`` where known (an external model: the operator's
        only). Output: the operator's
        ``max_output_tokens``. See :func:`effective_context_length`."""
        if self.is_external or not self.profile_id:  # served elsewhere: only the operator knows
            return self.context_length, self.max_output_tokens
        command = self.profile.engine_traits.context_length
        return effective_context_length(self.context_length, command, self.weights_context_length), \
            self.max_output_tokens

    @property
    def context_limit(self) -> int | None:
        """The effective context length in tokens (``token_limits()[0]``); the field
        ``context_length`` is only the operator's value."""
        return self.token_limits()[0]

    @classmethod
    def resolve_queryset(cls, name: str) -> models.QuerySet["Model"]:
        """Candidates for ``name`` (exact name, or an alias); filter with :meth:`matches`."""
        return cls.objects.select_related("profile").filter(
            Q(name=name) | Q(aliases__contains=name)
        )

    def matches(self, name: str) -> bool:
        return name == self.name or name in self.alias_list

    @classmethod
    def resolve(cls, name: str) -> "Model | None":
        """The model called ``name`` by its name or an alias, or None."""
        for candidate in cls.resolve_queryset(name):
            if candidate.matches(name):
                return candidate
        return None

    @classmethod
    async def aresolve(cls, name: str) -> "Model | None":
        """Async :meth:`resolve`."""
        async for candidate in cls.resolve_queryset(name):
            if candidate.matches(name):
                return candidate
        return None

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        for alias in self.alias_list:
            try:
                validate_model_name(alias)
            except ValidationError as exc:
                errors.setdefault("aliases", []).extend(exc.messages)
        if self.name and self.name in self.alias_list:
            errors.setdefault("aliases", []).append("An alias cannot repeat the model's name.")
        others = list(Model.objects.exclude(pk=self.pk))
        taken = {o.name for o in others} | {a for o in others for a in o.alias_list}
        for alias in self.alias_list:
            if alias in taken:
                errors.setdefault("aliases", []).append(
                    f"'{alias}' is already the name or an alias of another model."
                )
        if self.name and any(self.name in o.alias_list for o in others):
            errors.setdefault("name", []).append(
                f"'{self.name}' is already an alias of another model."
            )
        named = self.parse_endpoints(self.endpoints) if (self.endpoints or "").strip() else frozenset()
        unknown = sorted(named - set(OPENAI_ENDPOINTS))
        if unknown:
            errors.setdefault("endpoints", []).append(
                f"Unknown endpoint(s) {', '.join(unknown)}: choose from {', '.join(OPENAI_ENDPOINTS)}."
            )
        elif named and self.profile_id and not self.external_base_url:
            served = self.profile.served_endpoints
            missing = sorted(named - served)
            if missing:
                errors.setdefault("endpoints", []).append(
                    f"Its profile {self.profile} does not serve {', '.join(missing)}: it serves "
                    f"{', '.join(sorted(served))} (set the profile's endpoints, or start its engine for them)."
                )
        for name, text in limit_errors(self).items():
            errors.setdefault(name, []).append(text)
        if self.external_forward_org_headers and not self.external_base_url:
            errors.setdefault("external_forward_org_headers", []).append(
                "Only for external models: engines served here read no organization or project."
            )
        if self.external_base_url:
            if self.profile_id or self.weights:
                errors.setdefault("external_base_url", []).append(
                    "An external model is served elsewhere: leave profile and weights empty."
                )
            if self.default_max_tokens:
                errors.setdefault("default_max_tokens", []).append(
                    "Only for models served here: an external service has its own limits "
                    "(and some refuse max_tokens)."
                )
        else:
            if not self.profile_id:
                errors.setdefault("profile", []).append(
                    "Choose an engine profile (or give an external base URL)."
                )
            if not self.weights:
                errors.setdefault("weights", []).append(
                    "Say where the weights come from (or give an external base URL)."
                )
            else:
                try:
                    parse_weights_source(self.weights)
                except ValueError as exc:
                    errors.setdefault("weights", []).append(str(exc))
        if self.max_replicas < self.min_replicas:
            errors.setdefault("max_replicas", []).append(
                "Max replicas must be at least min replicas."
            )
        if self.on_demand and self.max_replicas == 0:
            errors.setdefault("max_replicas", []).append(
                "An on-demand model needs max replicas of at least 1."
            )
        if errors:
            raise ValidationError(errors)


def effective_context_length(operator: int | None, command: int | None, weights: int | None) -> int | None:
    """The context length in tokens a model serves: the operator's value if set (it
    overrides both), else the smaller of the command's flag and the weights' own length
    where known, else None (unknown)."""
    if operator:
        return operator
    known = [n for n in (command, weights) if n]
    return min(known) if known else None


def limit_errors(model: "Model") -> dict[str, str]:
    """Field → message for token limits that contradict each other: ``default_max_tokens``
    above ``max_output_tokens`` or above the known context length, ``max_output_tokens``
    above the known context length (:meth:`Model.token_limits`). Pure over the model's attributes (its profile is read)."""
    errors: dict[str, str] = {}
    context, output = model.token_limits()
    default = model.default_max_tokens
    if default and output and default > output:
        errors["default_max_tokens"] = f"Default max tokens {default} is above its max output tokens {output}."
    elif default and context and default > context:
        errors["default_max_tokens"] = f"Default max tokens {default} is above its context length {context}."
    if output and context and output > context:
        errors["max_output_tokens"] = f"Max output tokens {output} is above its context length {context}."
    return errors


def limits_info(model: "Model") -> dict:
    """What ``llmgw explain`` and the admin show of a model's limits (JSON-ready):
    ``context_length`` and ``max_output_tokens`` in force (tokens, None unknown or
    unlimited), ``default_max_tokens`` (what a request without max_tokens gets, tokens; None:
    the engine decides, and always None for an external model, where the gateway adds none),
    ``served_endpoints`` (sorted) and ``text``, the limits in words, e.g. ``"context 2048
    tokens, output at most 512 tokens; a request without max_tokens gets 128"``."""
    context, output = model.token_limits()
    default = None if model.is_external else model.default_max_tokens
    return {
        "context_length": context,
        "max_output_tokens": output,
        "default_max_tokens": default,
        "served_endpoints": sorted(model.served_endpoints),
        "text": f"context {f'{context} tokens' if context else 'unknown'}, "
                f"output {f'at most {output} tokens' if output else 'unlimited (up to the context)'}"
                + (f"; a request without max_tokens gets {default}" if default else ""),
    }


def validate_time_zone(value: str) -> None:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValidationError(f"'{value}' is not a time zone (e.g. Europe/Istanbul, UTC).")


class ClusterSettings(models.Model):
    """The cluster's live settings: one row (pk 1), read with :meth:`get_solo`."""

    stopped = models.BooleanField(
        default=False, help_text="Stopped: every replica is stopped and /v1/ answers 503."
    )
    stopped_at = models.DateTimeField(null=True, blank=True)
    stopped_by = models.CharField(max_length=150, blank=True, default="")
    time_zone = models.CharField(max_length=64, default="UTC", validators=[validate_time_zone])
    default_idle_timeout_s = models.PositiveIntegerField(
        default=600, validators=[MinValueValidator(1)]
    )
    min_idle_before_eviction_s = models.PositiveIntegerField(
        default=60,
        help_text="To make room, only replicas idle at least this long may be evicted.",
    )
    scale_up_waiting = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.01)],
        help_text="Requests waiting per replica at which a model is busy.",
    )
    scale_up_after_s = models.PositiveIntegerField(default=30)
    scale_down_after_s = models.PositiveIntegerField(default=300)
    cold_start_timeout_s = models.PositiveIntegerField(
        default=300, validators=[MinValueValidator(1)],
        help_text="How long a request waits for a replica to become ready.",
    )
    class RateLimitsWithoutRedis(models.TextChoices):
        """What the gateway does with a request when Redis, which keeps the limits' counters
        in production mode, cannot be reached (docs/architecture.md, "Tenants")."""

        OPEN = "open", "admit (limits are not counted while Redis is away)"
        CLOSED = "closed", "refuse limited keys with 503 until Redis is back"

    rate_limits_without_redis = models.CharField(
        max_length=8, choices=RateLimitsWithoutRedis.choices, default=RateLimitsWithoutRedis.OPEN,
        help_text="When Redis is away (production mode): admit requests of limited keys uncounted, or refuse "
        "them. Logged once per outage.")
    admission_wait_s = models.PositiveIntegerField(
        default=30, validators=[MinValueValidator(1), MaxValueValidator(3600)],
        help_text="How long a request may wait in the admission queue of a full model before a 429.")
    history_retention_days = models.PositiveIntegerField(
        default=30, validators=[MaxValueValidator(36500)],
        help_text="Usage records, scaling events and stopped or failed replicas older than "
        "this many days are deleted (checked hourly). 0: keep them forever.",
    )
    # Warm before demand (docs/architecture.md, R11).
    prewarm_windows = models.BooleanField(
        default=True, help_text="Place a schedule window's replicas ahead of its start by their measured cold "
        "start, so they are ready when it opens.")
    predictive_warmth = models.BooleanField(
        default=True, help_text="Keep an on-demand model warm ahead of the hours it is usually asked for "
        "(learned from four weeks running), on free room only; such a replica is evicted first.")
    ramp_scaling = models.BooleanField(
        default=True, help_text="Scale a model whose cold start is long ahead of a rising load, not after "
        "its queue forms.")
    default_cold_start_s = models.PositiveIntegerField(
        default=120, validators=[MinValueValidator(1), MaxValueValidator(86400)],
        help_text="Placement to ready assumed for a model none of whose replicas has started yet.")

    class Meta:
        verbose_name = "cluster settings"
        verbose_name_plural = "cluster settings"
        permissions = [
            ("stop_cluster", "Can stop the cluster (every replica drains and stops)"),
            ("start_cluster", "Can start the cluster (models are placed again)"),
        ]

    def __str__(self) -> str:
        return "Cluster settings"

    def save(self, *args, **kwargs) -> None:
        self.pk = 1
        super().save(*args, **kwargs)

    @classmethod
    def get_solo(cls) -> "ClusterSettings":
        obj, _ = cls.objects.get_or_create(pk=1)
        return obj


class ScheduleWindow(models.Model):
    """Office hours for a model: on these weekdays, between ``start`` and ``end`` local
    time (cluster time zone; end before start crosses midnight), the model runs at least
    ``min_replicas`` and at most ``max_replicas`` (if set) instead of its own min/max."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="schedule_windows")
    weekdays = models.CharField(max_length=64, default="mon-fri",
                                help_text="mon,tue,… or ranges (mon-fri), daily, weekdays, weekends.")
    start = models.TimeField(help_text="Local time (cluster time zone).")
    end = models.TimeField(help_text="Local time; before the start means it ends the next day.")
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: the model's own max, or this window's min where that is higher.")

    class Meta:
        ordering = ["model", "start"]

    def __str__(self) -> str:
        return schedules.describe(self.as_window())

    def as_window(self) -> schedules.Window:
        try:
            days = schedules.parse_weekdays(self.weekdays)
        except ValueError:
            days = ()
        return schedules.Window(days, self.start, self.end, self.min_replicas, self.max_replicas, self.pk)

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        try:
            schedules.parse_weekdays(self.weekdays)
        except ValueError as exc:
            errors["weekdays"] = [str(exc)]
        if self.start is not None and self.end is not None and self.start == self.end:
            errors["end"] = ["A window needs an end different from its start."]
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            errors["max_replicas"] = ["Max must be at least the window's min."]
        if not errors and self.model_id and self.start is not None and self.end is not None:
            siblings = [w.as_window() for w in ScheduleWindow.objects.filter(model_id=self.model_id).exclude(pk=self.pk)]
            clash = [b for a, b in schedules.overlapping([self.as_window()] + siblings) if a.id == self.pk]
            if clash:
                errors["start"] = [f"Overlaps the window {schedules.describe(clash[0])}."]
        if errors:
            raise ValidationError(errors)


class Benchmark(models.Model):
    """Measured capacity of a model on a profile: the highest concurrency per replica that
    still met the SLO (``llmgw bench``). Load scaling uses it (docs/architecture.md, R7)."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="benchmarks")
    profile = models.ForeignKey(Profile, on_delete=models.CASCADE, related_name="benchmarks")
    max_concurrency = models.PositiveIntegerField(help_text="Concurrent requests per replica within the SLO.")
    slo_ttft_p95_ms = models.FloatField()
    slo_tpot_p95_ms = models.FloatField(null=True, blank=True)
    measured_at = models.DateTimeField(auto_now=True)
    method = models.TextField(blank=True, default="", help_text="How it was measured.")
    steps = models.JSONField(default=list, blank=True, help_text="Each step's figures.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["model", "profile"], name="benchmark_per_model_profile")]

    def __str__(self) -> str:
        return f"{self.model} on {self.profile}: {self.max_concurrency} concurrent"
