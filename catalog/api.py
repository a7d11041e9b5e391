"""REST API for the catalog: models, engine profiles, schedule windows. Each needs staff
and the model's view/add/change/delete permission (``llmgw.permissions``); engine code (a
profile's command and env, ``pypi:``/``file:`` weights) also needs
``catalog.change_engine_code``, and every change of it is recorded (``catalog.engine_code``).

Want, evict and explain act on the fleet and live in ``fleet.ops.api`` (catalog imports no
fleet); ``llmgw.api_urls`` mounts both under ``/api/``.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import ProtectedError
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response

from catalog import engine_code
from catalog.models import Model, Profile, ScheduleWindow
from catalog.serializers import ModelSerializer, ProfileSerializer, ScheduleWindowSerializer
from llmgw.integers import id_from_text


def int_param(request, name: str) -> int | None:
    """An optional positive integer query parameter; 400 with a field message if malformed."""
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    number = id_from_text(raw)
    if number is None:
        raise ValidationError({name: [f"'{raw}' is not an id."]})
    return number


class ProtectedDestroyMixin:
    """Deleting a row others still point at (PROTECT) answers 409 with what holds it."""

    def destroy(self, request, *args, **kwargs):
        try:
            return super().destroy(request, *args, **kwargs)
        except ProtectedError as exc:
            used_by = sorted({str(o) for o in exc.protected_objects})[:10]
            return Response({"detail": f"still in use by: {', '.join(used_by)}"}, status=status.HTTP_409_CONFLICT)


class EngineCodeMixin:
    """Creating or updating through the API: engine-code changes (``catalog.engine_code``)
    are refused with 403 unless the user may make them, and recorded when saved."""

    def _save_guarded(self, serializer, before) -> None:
        model_class = serializer.Meta.model
        found = engine_code.changes(model_class, before, serializer.validated_data)
        if found and not engine_code.allowed(self.request.user):
            raise PermissionDenied(engine_code.denial(model_class, creating=before is None))
        with transaction.atomic():  # never saved without its record
            obj = serializer.save()
            engine_code.record(self.request.user, obj, found, "the REST API")

    def perform_create(self, serializer) -> None:
        self._save_guarded(serializer, None)

    def perform_update(self, serializer) -> None:
        self._save_guarded(serializer, serializer.instance)


@extend_schema_view(destroy=extend_schema(responses={204: None, 403: OpenApiTypes.OBJECT,
                                                     409: OpenApiTypes.OBJECT}))
class ProfileViewSet(ProtectedDestroyMixin, EngineCodeMixin, viewsets.ModelViewSet):
    """Engine profiles: how to run an engine and what one replica needs."""

    queryset = Profile.objects.all()
    serializer_class = ProfileSerializer


class ModelViewSet(EngineCodeMixin, viewsets.ModelViewSet):
    """Catalog models. ``desired`` and ``reason`` come from the last reconcile pass."""

    queryset = Model.objects.select_related("profile", "fleet_state")
    serializer_class = ModelSerializer


@extend_schema_view(list=extend_schema(parameters=[
    OpenApiParameter("model", int, description="Only this model's windows (its id).")]))
class ScheduleWindowViewSet(viewsets.ModelViewSet):
    """Time-of-day windows that raise a model's min/max (cluster time zone)."""

    queryset = ScheduleWindow.objects.all()  # the model the permissions are read from; rows: get_queryset
    serializer_class = ScheduleWindowSerializer

    def get_queryset(self):
        queryset = ScheduleWindow.objects.select_related("model")
        if self.action == "list":
            model_id = int_param(self.request, "model")
            if model_id is not None:
                queryset = queryset.filter(model_id=model_id)
        return queryset
