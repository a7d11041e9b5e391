"""REST API for /v1/ keys and teams.

Keys: create (the clear key is answered once), list, change, revoke. Keys are revoked, not
deleted, so usage records keep naming them. Creating and revoking are acts with
permissions of their own (``llmgw.permissions``); list and change need the model's
view/change permission, and a change of ``expires_at`` that revokes (earlier) or issues (an
expired key valid again) needs that act's permission too. A key's team, priority, limits
and model budgets are part of the key: changing them is changing the key.

Teams: list, create, change, delete with the team model's own permissions; a deleted
team's keys stay, without a team. A key's or team's detail answer carries ``usage``: where
it stands against its limits now (``gateway.tenant_usage``)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_view
from django.db import transaction
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from llmgw.shown_once import shown_once_api_response
from gateway.models import LIMIT_FIELDS, ApiKey, ModelBudget, Team
from gateway.serializers import (ApiKeyCreatedSerializer, ApiKeyDetailSerializer, ApiKeySerializer,
                                 TeamDetailSerializer, TeamSerializer)
from llmgw.permissions import Act, can, permission_for


def expiry_denial(act: Act) -> str:
    """Why an expiry change is refused (the API's 403, the admin's field error)."""
    what = "Moving a key's expiry earlier revokes it" if act == Act.REVOKE_KEY else \
        "Making an expired key valid again issues a key"
    return f"{what}: it needs the permission {permission_for(act)}."


@extend_schema_view(create=extend_schema(responses={201: ApiKeyCreatedSerializer}),
                    retrieve=extend_schema(responses=ApiKeyDetailSerializer))
class ApiKeyViewSet(mixins.CreateModelMixin, mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    queryset = ApiKey.objects.select_related("team").prefetch_related("allowed_models", "model_budgets__model")
    serializer_class = ApiKeySerializer
    act_permissions = {"create": Act.CREATE_KEY, "revoke": Act.REVOKE_KEY}

    def get_serializer_class(self):
        return ApiKeyDetailSerializer if self.action == "retrieve" else ApiKeySerializer

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        with transaction.atomic():  # never a key without the budgets it was asked with
            key, clear = ApiKey.create_key(data["name"], [m.name for m in data.get("allowed_models", [])],
                                           data.get("expires_at"), team=data.get("team"),
                                           priority=data.get("priority"),
                                           **{name: data[name] for name in LIMIT_FIELDS if name in data})
            if data.get("model_budgets"):
                ModelBudget.replace_for(key, data["model_budgets"])
        key.key = clear
        return shown_once_api_response(ApiKeyCreatedSerializer(key).data, status=status.HTTP_201_CREATED)

    def perform_update(self, serializer) -> None:
        # An expiry moved earlier is a revocation, an expired key made valid again an issue.
        if "expires_at" in serializer.validated_data:
            act = serializer.instance.expiry_act(serializer.validated_data["expires_at"])
            if act is not None and not can(self.request.user, act):
                raise PermissionDenied(expiry_denial(act))
        serializer.save()

    @extend_schema(request=None, responses=ApiKeySerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """Revoke the key; requests with it are refused within a fraction of a second."""
        key = self.get_object()
        key.revoke()
        return Response(ApiKeySerializer(key).data)


@extend_schema_view(retrieve=extend_schema(responses=TeamDetailSerializer))
class TeamViewSet(viewsets.ModelViewSet):
    """Teams: keys sharing limits, a priority class and a fair-share weight."""

    queryset = Team.objects.prefetch_related("model_budgets__model")
    serializer_class = TeamSerializer

    def get_serializer_class(self):
        return TeamDetailSerializer if self.action == "retrieve" else TeamSerializer
