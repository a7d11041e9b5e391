"""URL map: admin, gateway (/v1/). The agents' websocket is routed in ``llmgw.asgi``."""

from django.contrib import admin
from django.http import HttpResponseRedirect
from django.urls import include, path

from fleet import api as fleet_api

admin.site.site_header = "llmgw"
admin.site.site_title = "llmgw"
admin.site.index_title = "Cluster"

urlpatterns = [
    path("", lambda request: HttpResponseRedirect("/admin/")),
    path("admin/", admin.site.urls),
    path("api/cluster/", fleet_api.cluster),
    path("api/cluster/stop/", fleet_api.cluster_stop),
    path("api/cluster/start/", fleet_api.cluster_start),
    path("", include("gateway.urls")),
]
