"""URL map of the cluster dashboard, mounted at /admin/dashboard/ (staff only: each view
goes through the admin site's login and CSRF protection).

The charts read the gateway's usage records and name its teams; ``fleet`` does not import
``gateway``, so this map (wiring, which may import anything) hands their querysets to the views."""

from django.contrib import admin
from django.urls import path

from fleet.ops import views
from gateway.models import Team, UsageRecord
from llmgw import changes

app_name = "dashboard"
_USAGE = {"usage": UsageRecord.objects.all(), "teams": Team.objects.all()}


def _staff(view):
    return admin.site.admin_view(view)


urlpatterns = [
    path("", _staff(views.dashboard), name="index"),
    path("live/", _staff(views.live), name="live"),
    path("charts/", _staff(views.charts), _USAGE, name="charts"),
    path("charts/data/", _staff(views.charts_data), _USAGE, name="charts-data"),
    path("changes/", _staff(changes.page), name="changes"),
    path("cluster/stop/", _staff(views.cluster_stop), name="cluster-stop"),
    path("cluster/start/", _staff(views.cluster_start), name="cluster-start"),
    path("agents/<int:pk>/cordon/", _staff(views.agent_cordon), name="agent-cordon"),
    path("agents/<int:pk>/uncordon/", _staff(views.agent_uncordon), name="agent-uncordon"),
    path("agents/<int:pk>/drain/", _staff(views.agent_drain), name="agent-drain"),
    path("models/<int:pk>/want/", _staff(views.model_want), name="model-want"),
    path("models/<int:pk>/evict/", _staff(views.model_evict), name="model-evict"),
]
