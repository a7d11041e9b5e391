"""URL map: admin (with the cluster dashboard), REST API (/api/), gateway (/v1/), health
(/healthz, /readyz). The agents' websocket is routed in ``llmgw.asgi``."""

from django.contrib import admin
from django.http import HttpResponseRedirect
from django.urls import include, path, re_path

from fleet.ops import mirror
from llmgw import health

admin.site.site_header = "llmgw"
admin.site.site_title = "llmgw"
admin.site.index_title = "Cluster"

urlpatterns = [
    path("", lambda request: HttpResponseRedirect("/admin/")),
    # Unauthenticated, any Host (llmgw.asgi): for load balancers and systemd.
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("admin/dashboard/", include("llmgw.dashboard_urls")),
    path("admin/", admin.site.urls),
    path("api/", include(("llmgw.api_urls", "api"))),
    # Agents download mirrored weights (agent token; Range resumes): manifest at NAME/, files below.
    re_path(r"^mirror/(?P<name>[^/]+)/(?P<file>.*)$", mirror.download, name="mirror-download"),
    path("", include("gateway.urls")),
]
