"""REST API for /v1/ keys: create (the clear key is answered once), list, change, revoke.
Keys are revoked, not deleted, so usage records keep naming them. Creating and revoking
are acts with permissions of their own (``llmgw.permissions``); list and change need the
model's view/change permission."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from gateway.models import ApiKey
from gateway.serializers import ApiKeyCreatedSerializer, ApiKeySerializer
from llmgw.permissions import Act


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
        return Response(ApiKeyCreatedSerializer(key).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=ApiKeySerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """Revoke the key; requests with it are refused within a fraction of a second."""
        key = self.get_object()
        key.revoke()
        return Response(ApiKeySerializer(key).data)
