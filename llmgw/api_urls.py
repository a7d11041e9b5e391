"""URL map of the REST API, mounted at /api/ (staff with the matching permission: see
``llmgw.permissions``; session, basic or token auth).

The OpenAI-shaped gateway is /v1/, not here. The schema is /api/schema/ (OpenAPI 3, by
drf-spectacular), browsable at /api/schema/ui/; DRF's own browsable pages answer any
endpoint opened in a browser.
"""

from django.contrib.auth.views import redirect_to_login
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework import exceptions, permissions
from rest_framework.routers import APIRootView, DefaultRouter

from catalog import api as catalog_api
from fleet.ops import api as fleet_api
from gateway import api as gateway_api


class StaffRootView(APIRootView):
    """DRF's index of the API's resources: staff only, like the schema (it lists links,
    no rows)."""

    permission_classes = [permissions.IsAdminUser]


class SwaggerPage(SpectacularSwaggerView):
    """Swagger UI; a browser that is not logged in is sent to the admin's login page and
    back, instead of a bare 403 (the API itself still answers 401/403)."""

    def handle_exception(self, exc):
        request = self.request
        if (isinstance(exc, (exceptions.NotAuthenticated, exceptions.PermissionDenied))
                and not request.user.is_authenticated and "HTTP_AUTHORIZATION" not in request.META):
            return redirect_to_login(request.get_full_path(), login_url="/admin/login/")
        return super().handle_exception(exc)


router = DefaultRouter()
router.APIRootView = StaffRootView
router.register("models", catalog_api.ModelViewSet, basename="model")
router.register("profiles", catalog_api.ProfileViewSet, basename="profile")
router.register("schedule-windows", catalog_api.ScheduleWindowViewSet, basename="schedulewindow")
router.register("agents", fleet_api.AgentViewSet, basename="agent")
router.register("replicas", fleet_api.ReplicaViewSet, basename="replica")
router.register("keys", gateway_api.ApiKeyViewSet, basename="apikey")
router.register("teams", gateway_api.TeamViewSet, basename="team")

urlpatterns = [
    path("cluster/", fleet_api.cluster, name="cluster"),
    path("cluster/stop/", fleet_api.cluster_stop, name="cluster-stop"),
    path("cluster/start/", fleet_api.cluster_start, name="cluster-start"),
    path("models/<int:pk>/want/", fleet_api.ModelWantView.as_view(), name="model-want"),
    path("models/<int:pk>/evict/", fleet_api.ModelEvictView.as_view(), name="model-evict"),
    path("explain/<path:name>/", fleet_api.ExplainView.as_view(), name="explain"),
    path("auth/token/", fleet_api.ObtainToken.as_view(), name="auth-token"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("schema/ui/", SwaggerPage.as_view(url_name="api:schema"), name="schema-ui"),
    path("", include(router.urls)),
]
