"""REST API for cluster operations (staff only): status, stop, start."""

from __future__ import annotations

from rest_framework.decorators import api_view
from rest_framework.response import Response

from fleet.operations import cluster_status, start_cluster, stop_cluster


@api_view(["GET"])
def cluster(request):
    """The same summary as ``llmgw status --json``."""
    return Response(cluster_status())


@api_view(["POST"])
def cluster_stop(request):
    changed = stop_cluster(request.user.get_username())
    return Response({"stopped": True, "changed": changed})


@api_view(["POST"])
def cluster_start(request):
    changed = start_cluster()
    return Response({"stopped": False, "changed": changed})
