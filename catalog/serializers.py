"""DRF serializers for the catalog: models, engine profiles, schedule windows.

Validation is the models' own: :class:`FullCleanMixin` runs ``full_clean()`` on the object
as it would be saved, so the API answers the admin's messages as field errors (400) and a
rule lives in one place (``catalog.models``).
"""

from __future__ import annotations

import copy

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.settings import api_settings

from catalog.models import KEY_STAYS_WITH_ITS_URL, Model, Profile, RoutingPolicy, ScheduleWindow
from llmgw.rest import RefuseUnknownFields


class FullCleanMixin:
    """Run the model's ``full_clean()`` (field validators, ``clean()``, uniqueness) on the
    object the request would save, and turn its messages into DRF field errors; errors not
    tied to a field come back under ``non_field_errors``. Many-to-many fields are left to
    the serializer (they are not set on an unsaved object)."""

    def validate(self, attrs: dict) -> dict:
        attrs = super().validate(attrs)
        model_class = self.Meta.model
        obj = copy.copy(self.instance) if self.instance is not None else model_class()
        m2m = {f.name for f in model_class._meta.many_to_many}
        for name, value in attrs.items():
            if name not in m2m:
                setattr(obj, name, value)
        # As a ModelForm would: fields nobody edits (hashes, timestamps) are not checked.
        exclude = [f.name for f in model_class._meta.fields if not f.editable]
        try:
            obj.full_clean(exclude=exclude)
        except DjangoValidationError as exc:
            detail = exc.message_dict if hasattr(exc, "error_dict") else {NON_FIELD_ERRORS: exc.messages}
            if NON_FIELD_ERRORS in detail:
                detail[api_settings.NON_FIELD_ERRORS_KEY] = detail.pop(NON_FIELD_ERRORS)
            raise serializers.ValidationError(detail) from exc
        return attrs


class ProfileSerializer(RefuseUnknownFields, FullCleanMixin, serializers.ModelSerializer):
    """An engine profile; ``served_endpoints`` (read-only) is what its engines serve: its
    ``endpoints`` if set, else the engine's default for its command."""

    served_endpoints = serializers.SerializerMethodField()

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_served_endpoints(self, obj: Profile) -> list[str]:
        return sorted(obj.served_endpoints)

    class Meta:
        model = Profile
        fields = ["id", "name", "engine", "command", "gpus_needed", "gpu_memory_mib", "cpu_cores", "memory_mib",
                  "env", "readiness_path", "startup_timeout_s", "metrics_path", "metric_running", "metric_waiting",
                  "endpoints", "served_endpoints", "notes"]


_ROUTING_CHOICES = ", ".join(RoutingPolicy.values[:-1]) + " or " + RoutingPolicy.values[-1]
#: The 400s for a ``routing_policy`` that is not one (DRF fills in ``{input}``): they name the choices.
NOT_A_ROUTING_POLICY = f"'{{input}}' is not a routing policy: choose {_ROUTING_CHOICES}."
NO_ROUTING_POLICY = f"null is not a routing policy: choose {_ROUTING_CHOICES}."


class ModelSerializer(RefuseUnknownFields, FullCleanMixin, serializers.ModelSerializer):
    """A catalog model. ``external_api_key`` is write-only (``external_api_key_set`` says
    whether one is stored), and changing ``external_base_url`` needs it given again (or
    empty); ``desired`` and ``reason`` are the last reconcile pass's word. ``context_length``
    and ``max_output_tokens`` are the operator's; ``weights_context_length`` is detected
    (read-only); ``token_limits`` and ``served_endpoints`` are what is in force.
    ``routing_policy`` is one of ``catalog.models.RoutingPolicy`` (default least-loaded;
    anything else is a 400 naming the choices); changing it restarts no replica."""

    external_api_key = serializers.CharField(write_only=True, required=False, allow_blank=True, max_length=500)
    external_api_key_set = serializers.SerializerMethodField()
    desired = serializers.SerializerMethodField()
    reason = serializers.SerializerMethodField()
    served_endpoints = serializers.SerializerMethodField()
    token_limits = serializers.SerializerMethodField()

    class Meta:
        model = Model
        fields = ["id", "name", "aliases", "weights", "profile", "min_replicas", "max_replicas", "on_demand",
                  "idle_timeout_s", "default_max_tokens", "external_base_url", "external_api_key", "external_api_key_set",
                  "endpoints", "served_endpoints", "context_length", "max_output_tokens", "weights_context_length",
                  "token_limits", "external_forward_org_headers", "routing_policy",
                  "desired", "reason", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at", "weights_context_length"]
        extra_kwargs = {"routing_policy": {"error_messages": {"invalid_choice": NOT_A_ROUTING_POLICY,
                                                              "null": NO_ROUTING_POLICY}}}

    def validate(self, attrs: dict) -> dict:
        # Written, never read: nor sent to a new address by whoever may change the URL.
        inst = self.instance
        if (inst is not None and inst.external_api_key and "external_api_key" not in attrs
                and "external_base_url" in attrs and attrs["external_base_url"] != inst.external_base_url):
            raise serializers.ValidationError({"external_api_key": [KEY_STAYS_WITH_ITS_URL]})
        return super().validate(attrs)

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_served_endpoints(self, obj: Model) -> list[str]:
        return sorted(obj.served_endpoints)

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField(allow_null=True)))
    def get_token_limits(self, obj: Model) -> dict[str, int | None]:
        """The limits in force (``Model.token_limits``): ``context_length``, ``max_output_tokens``."""
        context, output = obj.token_limits()
        return {"context_length": context, "max_output_tokens": output}

    def get_external_api_key_set(self, obj: Model) -> bool:
        return bool(obj.external_api_key)

    @staticmethod
    def _state(obj: Model):
        # The fleet's memory of the model, through the reverse relation (catalog imports no
        # fleet); missing until a reconcile pass has looked at the model.
        return getattr(obj, "fleet_state", None)

    @extend_schema_field(serializers.IntegerField())
    def get_desired(self, obj: Model) -> int:
        state = self._state(obj)
        return state.desired if state else 0

    @extend_schema_field(serializers.CharField())
    def get_reason(self, obj: Model) -> str:
        state = self._state(obj)
        return state.reason if state else ""


class ScheduleWindowSerializer(RefuseUnknownFields, FullCleanMixin, serializers.ModelSerializer):
    class Meta:
        model = ScheduleWindow
        fields = ["id", "model", "weekdays", "start", "end", "min_replicas", "max_replicas"]
