"""DRF serializers for API keys (the clear key appears once, in the answer to creating it)."""

from __future__ import annotations

from rest_framework import serializers

from catalog.models import Model
from catalog.serializers import FullCleanMixin
from gateway.models import ApiKey
from llmgw.rest import RefuseUnknownFields


class ApiKeySerializer(RefuseUnknownFields, FullCleanMixin, serializers.ModelSerializer):
    """A /v1/ key. ``allowed_models`` are model names; empty means every model."""

    allowed_models = serializers.SlugRelatedField(
        slug_field="name", many=True, required=False, queryset=Model.objects.all(),
        help_text="Models this key may use, by name. Empty: every model.")
    state = serializers.CharField(read_only=True, help_text="active, expired or revoked")

    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "allowed_models", "state", "expires_at", "revoked_at", "created_at",
                  "updated_at"]
        read_only_fields = ["prefix", "revoked_at", "created_at", "updated_at"]


class ApiKeyCreatedSerializer(ApiKeySerializer):
    key = serializers.CharField(read_only=True, help_text="The clear key: shown this once, stored only as a hash.")

    class Meta(ApiKeySerializer.Meta):
        fields = ApiKeySerializer.Meta.fields + ["key"]
