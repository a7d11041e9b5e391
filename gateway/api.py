"""REST API for /v1/ keys: create (the clear key is answered once), list, change, revoke.
Keys are revoked, not deleted, so usage records keep naming them. Creating and revoking
are acts with permissions of their own (``llmgw.permissions``); list and change need the
model's view/change permission, and a change of ``expires_at`` that revokes (earlier) or
issues (an expired key valid again) needs that act's permission too."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from llmgw.shown_once import shown_once_api_response
from gateway.models import ApiKey
from gateway.serializers import ApiKeyCreatedSerializer, ApiKeySerializer
from llmgw.permissions import Act, can, permission_for


def expiry_denial(act: Act) -> str:
    """Why an expiry change is refused (the API's 403, the admin's field error)."""
    what = "Moving a key's expiry earlier revokes it" if act == Act.REVOKE_KEY else \
        "Making an expired key valid again issues a key"
    return f"{what}: it needs the permission {permission_for(act)}."


@extend_schema_view(create=extend_schema(responses={201: ApiKeyCreatedSerializer}))
class ApiKeyViewSet(mixins.CreateModelMixin, mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    queryset = ApiKey.objects.prefetch_related("allowed_models")
    serializer_class = ApiKeySerializer
    act_permissions = {"create": Act.CREATE_KEY, "revoke": Act.REVOKE_KEY}

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        key, clear = ApiKey.create_key(data["name"], [m.name for m in data.get("allowed_models", [])],
                                       data.get("expires_at"))
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
