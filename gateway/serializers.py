"""DRF serializers for API keys and teams (the clear key appears once, in the answer to
creating it). Limits are the models' fields (``gateway.models.LIMIT_FIELDS``; null: no
limit); ``priority`` is ``low``, ``normal`` or ``high``; ``model_budgets`` are written as a
whole list (one entry per model) and replace the owner's budgets."""

from __future__ import annotations

from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from catalog.models import Model
from catalog.serializers import FullCleanMixin
from gateway import tenant_usage
from gateway.models import LIMIT_FIELDS, ApiKey, ModelBudget, Priority, Team
from llmgw.rest import RefuseUnknownFields

_PRIORITY_OF = {label: value for value, label in Priority.choices}


class PriorityField(serializers.ChoiceField):
    """A priority class by name (``low``, ``normal``, ``high``), stored as ``Priority``."""

    def __init__(self, **kwargs) -> None:
        super().__init__(choices=list(_PRIORITY_OF), **kwargs)

    def to_representation(self, value):
        return None if value is None else Priority(value).label

    def to_internal_value(self, data):
        return _PRIORITY_OF[super().to_internal_value(data)]


class ModelBudgetSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    """A token budget for one model, by its name (tokens per UTC day and month)."""

    model = serializers.SlugRelatedField(slug_field="name", queryset=Model.objects.all(),
                                         help_text="The model, by name.")

    class Meta:
        model = ModelBudget
        fields = ["model", "tokens_per_day", "tokens_per_month"]

    def validate(self, attrs: dict) -> dict:
        # A PATCH of the owner is partial, and DRF makes every nested field optional with
        # it; a budget without its model has no meaning, partial or not.
        if "model" not in attrs:
            raise serializers.ValidationError({"model": "Name the model this budget is for."})
        if attrs.get("tokens_per_day") is None and attrs.get("tokens_per_month") is None:
            raise serializers.ValidationError(ModelBudget.EMPTY)
        return attrs


class BudgetsMixin:
    """``model_budgets`` written with the owner: kept out of ``full_clean`` (a reverse
    relation), refused when a model appears twice, replacing the owner's budgets on save."""

    def validate_model_budgets(self, value: list[dict]) -> list[dict]:
        names = [b["model"].name for b in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise serializers.ValidationError(f"One budget per model: {', '.join(twice)} appear(s) more than once.")
        return value

    def validate(self, attrs: dict) -> dict:
        budgets = attrs.pop("model_budgets", None)
        attrs = super().validate(attrs)
        if budgets is not None:
            attrs["model_budgets"] = budgets
        return attrs

    def create(self, validated_data: dict):
        budgets = validated_data.pop("model_budgets", None)
        with transaction.atomic():
            obj = super().create(validated_data)
            if budgets is not None:
                ModelBudget.replace_for(obj, budgets)
        return obj

    def update(self, instance, validated_data: dict):
        budgets = validated_data.pop("model_budgets", None)
        with transaction.atomic():
            obj = super().update(instance, validated_data)
            if budgets is not None:
                ModelBudget.replace_for(obj, budgets)
        return obj


class UsageMixin:
    """A read-only ``usage``: where the object stands against its limits now
    (``gateway.tenant_usage.usage``); for detail answers, not lists."""

    usage_kind = ""

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_usage(self, obj) -> dict:
        return tenant_usage.usage(self.usage_kind, obj)


class TeamSerializer(RefuseUnknownFields, BudgetsMixin, FullCleanMixin, serializers.ModelSerializer):
    """A team: limits shared by its keys (the stricter of a key's and its team's applies),
    a priority class and a weight in the admission queue's fair share."""

    priority = PriorityField(required=False, help_text="Priority class of its keys' requests (default normal).")
    model_budgets = ModelBudgetSerializer(many=True, required=False,
                                          help_text="Token budgets for single models; replaces the team's.")
    members = serializers.IntegerField(source="keys.count", read_only=True, help_text="Keys in the team.")

    class Meta:
        model = Team
        fields = ["id", "name", "priority", "weight", *LIMIT_FIELDS, "model_budgets", "members", "created_at",
                  "updated_at"]
        read_only_fields = ["created_at", "updated_at"]


class TeamDetailSerializer(UsageMixin, TeamSerializer):
    usage_kind = "team"
    usage = serializers.SerializerMethodField(help_text="Where the team stands against its limits now.")

    class Meta(TeamSerializer.Meta):
        fields = TeamSerializer.Meta.fields + ["usage"]


class ApiKeySerializer(RefuseUnknownFields, BudgetsMixin, FullCleanMixin, serializers.ModelSerializer):
    """A /v1/ key. ``allowed_models`` are model names; empty means every model. ``team``
    by name (null: none)."""

    allowed_models = serializers.SlugRelatedField(
        slug_field="name", many=True, required=False, queryset=Model.objects.all(),
        help_text="Models this key may use, by name. Empty: every model.")
    state = serializers.CharField(read_only=True, help_text="active, expired or revoked")
    team = serializers.SlugRelatedField(slug_field="name", queryset=Team.objects.all(), required=False,
                                        allow_null=True, help_text="The team, by name (its limits apply too).")
    priority = PriorityField(required=False, allow_null=True,
                             help_text="Priority class; null: the team's (normal without a team).")
    model_budgets = ModelBudgetSerializer(many=True, required=False,
                                          help_text="Token budgets for single models; replaces the key's.")

    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "allowed_models", "state", "expires_at", "revoked_at", "team", "priority",
                  *LIMIT_FIELDS, "model_budgets", "created_at", "updated_at"]
        read_only_fields = ["prefix", "revoked_at", "created_at", "updated_at"]


class ApiKeyDetailSerializer(UsageMixin, ApiKeySerializer):
    usage_kind = "key"
    usage = serializers.SerializerMethodField(help_text="Where the key stands against its limits now.")

    class Meta(ApiKeySerializer.Meta):
        fields = ApiKeySerializer.Meta.fields + ["usage"]


class ApiKeyCreatedSerializer(ApiKeySerializer):
    key = serializers.CharField(read_only=True, help_text="The clear key: shown this once, stored only as a hash.")

    class Meta(ApiKeySerializer.Meta):
        fields = ApiKeySerializer.Meta.fields + ["key"]
