"""URL map of the cluster dashboard, mounted at /admin/dashboard/ (staff only: each view
goes through the admin site's login and CSRF protection)."""

from django.contrib import admin
from django.urls import path

from fleet.ops import views

app_name = "dashboard"


def _staff(view):
    return admin.site.admin_view(view)


urlpatterns = [
    path("", _staff(views.dashboard), name="index"),
    path("live/", _staff(views.live), name="live"),
    path("cluster/stop/", _staff(views.cluster_stop), name="cluster-stop"),
    path("cluster/start/", _staff(views.cluster_start), name="cluster-start"),
    path("agents/<int:pk>/cordon/", _staff(views.agent_cordon), name="agent-cordon"),
    path("agents/<int:pk>/uncordon/", _staff(views.agent_uncordon), name="agent-uncordon"),
    path("agents/<int:pk>/drain/", _staff(views.agent_drain), name="agent-drain"),
    path("models/<int:pk>/want/", _staff(views.model_want), name="model-want"),
    path("models/<int:pk>/evict/", _staff(views.model_evict), name="model-evict"),
]
