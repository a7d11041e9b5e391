"""REST API for the fleet and cluster operations: cluster status, stop and start; agents
(cordon, uncordon, drain); replicas; wanting and evicting on-demand models; explain. Thin:
each view calls ``fleet.ops.operations`` and shapes the answer.

Every view needs staff and a permission: the model's view/add permission, or the act's
(``llmgw.permissions.ACTS``), the same as the admin and the dashboard ask for."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.decorators import action, api_view, permission_classes
from rest_framework.exceptions import AuthenticationFailed, NotFound, ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from catalog.api import int_param
from catalog.models import Model
from llmgw import auth_throttle, rest
from fleet.models import Agent, ApiToken, Replica
from fleet.ops.explain import explain_model
from llmgw.shown_once import shown_once_api_response
from fleet.ops.operations import (
    cluster_status,
    drain_agent,
    evict_model,
    set_cordoned,
    start_cluster,
    stop_cluster,
    want_model,
)
from fleet.ops.serializers import (
    AgentActionSerializer,
    AgentCreatedSerializer,
    AgentSerializer,
    ClusterActionSerializer,
    ClusterStatusSerializer,
    ExplainSerializer,
    ModelActionSerializer,
    ReplicaSerializer,
)
from fleet.states import ReplicaState
from llmgw.permissions import Act, requires


@extend_schema(responses=ClusterStatusSerializer)
@api_view(["GET"])
@permission_classes([requires(Act.VIEW_CLUSTER)])
def cluster(request):
    """The same summary as ``llmgw status --json``."""
    return Response(cluster_status())


@extend_schema(request=None, responses=ClusterActionSerializer)
@api_view(["POST"])
@permission_classes([requires(Act.STOP_CLUSTER)])
def cluster_stop(request):
    """Stop the cluster: every replica drains and stops, /v1/ answers 503 system_stopped."""
    changed = stop_cluster(request.user.get_username())
    return Response({"stopped": True, "changed": changed})


@extend_schema(request=None, responses=ClusterActionSerializer)
@api_view(["POST"])
@permission_classes([requires(Act.START_CLUSTER)])
def cluster_start(request):
    """Start the cluster: models are placed again as the catalog asks."""
    changed = start_cluster(request.user.get_username())
    return Response({"stopped": False, "changed": changed})


@extend_schema_view(create=extend_schema(responses={201: AgentCreatedSerializer}))
class AgentViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Agents, one per machine. Creating one returns its token, once."""

    queryset = Agent.objects.prefetch_related("gpus")
    serializer_class = AgentSerializer
    act_permissions = {"create": Act.REGISTER_AGENT, "cordon": Act.CORDON_AGENT, "uncordon": Act.CORDON_AGENT,
                       "drain": Act.DRAIN_AGENT, "rekey": Act.REGISTER_AGENT}

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        agent, token = Agent.create_with_token(serializer.validated_data["name"])
        agent.token = token
        return shown_once_api_response(AgentCreatedSerializer(agent).data, status=status.HTTP_201_CREATED)

    def _answer(self, agent: Agent, changed: bool, moved: int = 0) -> Response:
        return Response({"agent": agent.name, "cordoned": agent.cordoned, "changed": changed,
                         "replicas_moved": moved})

    @extend_schema(request=None, responses=AgentActionSerializer)
    @action(detail=True, methods=["post"])
    def cordon(self, request, pk=None):
        """Place nothing new on this agent; what runs there keeps running."""
        agent = self.get_object()
        return self._answer(agent, set_cordoned(agent, True, request.user.get_username()))

    @extend_schema(request=None, responses=AgentActionSerializer)
    @action(detail=True, methods=["post"])
    def uncordon(self, request, pk=None):
        agent = self.get_object()
        return self._answer(agent, set_cordoned(agent, False, request.user.get_username()))

    @extend_schema(request=None, responses=AgentActionSerializer)
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        """Cordon, drain its ready replicas (stop those still starting); the reconciler
        places their successors on other agents."""
        agent = self.get_object()
        was_cordoned = agent.cordoned
        moved = drain_agent(agent, request.user.get_username())
        return self._answer(agent, not was_cordoned or moved > 0, moved)


    @extend_schema(request=None, responses={200: AgentCreatedSerializer})
    @action(detail=True, methods=["post"])
    def rekey(self, request, pk=None):
        """A new token for this agent, answered once; the old one is refused from now on and
        the agent's live websocket is closed (it reconnects with the new token)."""
        agent = self.get_object()
        agent.token = agent.rekey()
        return shown_once_api_response(AgentCreatedSerializer(agent).data)


class ReplicaPagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000


@extend_schema_view(list=extend_schema(parameters=[
    OpenApiParameter("model", int, description="Only this model's replicas (its id)."),
    OpenApiParameter("agent", int, description="Only this agent's replicas (its id)."),
    OpenApiParameter("state", str, enum=[s.value for s in ReplicaState], description="Only replicas in this state."),
]))
class ReplicaViewSet(viewsets.ReadOnlyModelViewSet):
    """Engine replicas, newest first (read-only: the reconciler owns them)."""

    queryset = Replica.objects.all()  # the model the permissions are read from; rows: get_queryset
    serializer_class = ReplicaSerializer
    pagination_class = ReplicaPagination

    def get_queryset(self):
        queryset = Replica.objects.select_related("model__profile", "agent")
        if self.action == "list":
            for name in ("model", "agent"):
                value = int_param(self.request, name)
                if value is not None:
                    queryset = queryset.filter(**{f"{name}_id": value})
            state = self.request.query_params.get("state")
            if state:
                if state not in {s.value for s in ReplicaState}:
                    raise ValidationError({"state": [f"'{state}' is not a replica state."]})
                queryset = queryset.filter(state=state)
        return queryset


class ModelWantView(APIView):
    """Ask for an on-demand model now, as a request for it would (a pass runs at once)."""

    permission_classes = [requires(Act.WANT_MODEL)]

    @extend_schema(request=None, responses={200: ModelActionSerializer, 400: OpenApiTypes.OBJECT})
    def post(self, request, pk: int):
        model = get_object_or_404(Model, pk=pk)
        try:
            want_model(model)
        except ValueError as exc:
            raise ValidationError({"model": [str(exc)]})
        return Response({"model": model.name, "detail": "wanted: a replica is being placed"})


class ModelEvictView(APIView):
    """Evict an on-demand model: forget its demand and drain its replicas."""

    permission_classes = [requires(Act.EVICT_MODEL)]

    @extend_schema(request=None, responses={200: ModelActionSerializer, 400: OpenApiTypes.OBJECT})
    def post(self, request, pk: int):
        model = get_object_or_404(Model, pk=pk)
        try:
            moved = evict_model(model, request.user.get_username())
        except ValueError as exc:
            raise ValidationError({"model": [str(exc)]})
        return Response({"model": model.name, "detail": f"evicted: {moved} replica(s) draining",
                         "replicas_moved": moved})


class ExplainView(APIView):
    """Why a model (by name or alias) has the replicas it has: ``llmgw explain --json``."""

    permission_classes = [requires(Act.EXPLAIN_MODEL)]

    @extend_schema(responses={200: ExplainSerializer, 404: OpenApiResponse(description="No such model.")})
    def get(self, request, name: str):
        model = Model.resolve(name)
        if model is None:
            raise NotFound(f"no model called {name!r}")
        return Response(explain_model(model))


class ObtainToken(APIView):
    """POST username and password → a new REST API token, shown once (stored hashed; it
    expires after ``LLMGW_API_TOKEN_TTL``); a wrong username or password is a 401, a
    missing or malformed field a 400. Failed attempts are counted per username and
    per client address: past ``LLMGW_AUTH_FAILURE_LIMIT`` in a window, 429 with
    ``Retry-After`` (``llmgw.auth_throttle``)."""

    permission_classes = [permissions.AllowAny]
    authentication_classes: list = []
    serializer_class = AuthTokenSerializer

    @extend_schema(responses={200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT, 401: OpenApiTypes.OBJECT,
                              429: OpenApiTypes.OBJECT})
    def post(self, request):
        username = request.data.get("username") if hasattr(request.data, "get") else None
        attempt = auth_throttle.attempt(username, auth_throttle.client_address(request))
        serializer = AuthTokenSerializer(data=request.data, context={"request": request})
        if not serializer.is_valid():  # a failure: it stays counted
            if rest.wrong_credentials(serializer.errors):
                raise AuthenticationFailed("Wrong username or password.")  # 401 (llmgw.rest)
            raise ValidationError(serializer.errors)
        attempt.succeeded()
        return shown_once_api_response({"token": ApiToken.issue(serializer.validated_data["user"])})
