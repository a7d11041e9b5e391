"""The cluster dashboard (staff only, inside the admin): the page, the fragment it reloads
itself with, and its actions. Views stay thin: the data comes from ``fleet.ops.dashboard``, the
actions from ``fleet.ops.operations``.

Actions that take capacity away (stop or start the cluster, drain an agent, evict a model)
answer GET with a confirmation page and act on POST; cordon, uncordon and want act on POST
at once. Every action redirects back to the dashboard with a message.

Each action needs the permission of its act (``llmgw.permissions``), the same as the admin
and the REST API; the page itself needs the one ``GET /api/cluster/`` needs (it shows the
same cluster) and shows only the buttons the user may use.

The charts page (``charts``, and ``charts_data``, its figures as JSON) draws from
``fleet.ops.charts``; it needs ``Act.VIEW_CLUSTER`` as well, and its usage charts also need
the view permission of the usage records the URL map hands it (``usage``: ``fleet`` does not
import ``gateway``).
"""

from __future__ import annotations

import hashlib
import re
import zoneinfo
from collections.abc import Callable

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
    JsonResponse,
)
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from catalog.models import ClusterSettings, Model
from fleet.models import Agent
from fleet.ops import charts as figures
from fleet.ops import dashboard as data
from fleet.ops import operations
from llmgw.permissions import Act, can

#: CSRF tokens are masked differently on every render: they are no change to the page.
CSRF_INPUT = re.compile(r'<input type="hidden" name="csrfmiddlewaretoken" value="[^"]*">')


def _context(request: HttpRequest, **extra) -> dict:
    user = request.user
    refresh_s = float(getattr(settings, "LLMGW_DASHBOARD_REFRESH_S", 5.0))
    flags = {f"can_{act}": can(user, act) for act in (Act.STOP_CLUSTER, Act.START_CLUSTER, Act.CORDON_AGENT,
                                                      Act.DRAIN_AGENT, Act.WANT_MODEL, Act.EVICT_MODEL)}
    return {
        **admin.site.each_context(request),
        "is_nav_sidebar_enabled": False,
        "d": data.load(),
        **flags,
        # Whether a section has any button at all.
        "can_agents": flags["can_cordon_agent"] or flags["can_drain_agent"],
        "can_cluster": flags["can_stop_cluster"] or flags["can_start_cluster"],
        "can_models": flags["can_want_model"] or flags["can_evict_model"],
        "refresh_ms": int(1000 * refresh_s),
        "refresh_s": f"{refresh_s:g}",
        **extra,
    }


def _render_live(request: HttpRequest, context: dict) -> tuple[str, str]:
    """The self-refreshing part of the page and a digest of it, so the page swaps it in
    only when something changed (a button is not replaced under the pointer)."""
    html = render_to_string("llmgw/_dashboard_live.html", context, request=request)
    return html, hashlib.sha256(CSRF_INPUT.sub("", html).encode()).hexdigest()[:20]


def dashboard(request: HttpRequest) -> HttpResponse:
    """The page: the cluster's status (``Act.VIEW_CLUSTER``, as ``GET /api/cluster/``)."""
    _require(request, Act.VIEW_CLUSTER)
    context = _context(request, title="Cluster dashboard")
    context["live_html"], context["live_digest"] = _render_live(request, context)
    return TemplateResponse(request, "llmgw/dashboard.html", context)


def live(request: HttpRequest) -> HttpResponse:
    """The part of the page that refreshes itself (fetched every few seconds); its digest
    is in the ``X-Dashboard-Digest`` header. Needs ``Act.VIEW_CLUSTER``, like the page."""
    _require(request, Act.VIEW_CLUSTER)
    html, digest = _render_live(request, _context(request))
    return HttpResponse(html, headers={"X-Dashboard-Digest": digest})


def _back() -> HttpResponseRedirect:
    return HttpResponseRedirect(reverse("dashboard:index"))


def _require(request: HttpRequest, act: Act) -> None:
    if not can(request.user, act):
        raise PermissionDenied


def _confirm(request: HttpRequest, act: Act, title: str, explanation: str, button: str, danger: bool,
             action: Callable[[], str]) -> HttpResponse:
    """GET: a confirmation page. POST: run ``action`` (it returns the message to show)."""
    _require(request, act)
    if request.method == "POST":
        try:
            messages.success(request, action())
        except ValueError as exc:
            messages.error(request, f"Nothing done: {exc}")
        return _back()
    context = {**admin.site.each_context(request), "title": title, "explanation": explanation,
               "button": button, "danger": danger, "back": reverse("dashboard:index")}
    return TemplateResponse(request, "llmgw/confirm.html", context)


def cluster_stop(request: HttpRequest) -> HttpResponse:
    def stop() -> str:
        changed = operations.stop_cluster(request.user.get_username())
        return "Cluster stopped: every replica drains and stops." if changed else "The cluster was already stopped."

    return _confirm(
        request, Act.STOP_CLUSTER, "Stop the cluster",
        "Every replica will drain and stop, freeing every GPU, and /v1/ will answer 503 system_stopped "
        "until the cluster is started again. No model's definition changes.",
        "Yes, stop the cluster", True, stop)


def cluster_start(request: HttpRequest) -> HttpResponse:
    def start() -> str:
        return "Cluster started." if operations.start_cluster(request.user.get_username()) else "The cluster was already serving."

    return _confirm(request, Act.START_CLUSTER, "Start the cluster",
                    "Models will be placed again as the catalog asks.", "Yes, start the cluster", False, start)


@require_POST
def agent_cordon(request: HttpRequest, pk: int) -> HttpResponse:
    _require(request, Act.CORDON_AGENT)
    agent = get_object_or_404(Agent, pk=pk)
    changed = operations.set_cordoned(agent, True, request.user.get_username())
    messages.success(request, f"Cordoned {agent.name}: nothing new is placed on it." if changed
                     else f"Already cordoned: {agent.name}.")
    return _back()


@require_POST
def agent_uncordon(request: HttpRequest, pk: int) -> HttpResponse:
    _require(request, Act.CORDON_AGENT)
    agent = get_object_or_404(Agent, pk=pk)
    changed = operations.set_cordoned(agent, False, request.user.get_username())
    messages.success(request, f"Uncordoned {agent.name}." if changed else f"Not cordoned: {agent.name}.")
    return _back()


def agent_drain(request: HttpRequest, pk: int) -> HttpResponse:
    agent = get_object_or_404(Agent, pk=pk)

    def drain() -> str:
        moved = operations.drain_agent(agent, request.user.get_username())
        return f"Drained {agent.name} (now cordoned): {moved} replica(s) moving to other agents."

    return _confirm(
        request, Act.DRAIN_AGENT, f"Drain {agent.name}",
        f"{agent.name} will be cordoned; its ready replicas drain (in-flight requests finish) and stop, "
        "replicas still starting stop at once, and the reconciler places their successors on other agents.",
        f"Yes, drain {agent.name}", True, drain)


@require_POST
def model_want(request: HttpRequest, pk: int) -> HttpResponse:
    _require(request, Act.WANT_MODEL)
    model = get_object_or_404(Model, pk=pk)
    try:
        operations.want_model(model)
    except ValueError as exc:
        messages.error(request, f"Nothing done: {exc}")
    else:
        messages.success(request, f"Wanted {model.name}: a replica is being placed.")
    return _back()


def model_evict(request: HttpRequest, pk: int) -> HttpResponse:
    model = get_object_or_404(Model, pk=pk)

    def evict() -> str:
        moved = operations.evict_model(model, request.user.get_username())
        return f"Evicted {model.name}: {moved} replica(s) draining."

    return _confirm(
        request, Act.EVICT_MODEL, f"Evict {model.name}",
        f"{model.name}'s replicas drain and stop and its demand is forgotten; the next request for it "
        "starts it again.", f"Yes, evict {model.name}", True, evict)


# --- Charts -----------------------------------------------------------------------------------


def _charts(request: HttpRequest, usage: QuerySet, teams: QuerySet | None) -> dict:
    """The charts' figures for the request's ``period`` and ``by`` (UnknownChoice if bad);
    model names outside the catalog are one "unknown model" series."""
    period = figures.period(request.GET.get("period"))
    by = figures.grouping(request.GET.get("by"))
    cluster = ClusterSettings.get_solo()
    tz = _zone(cluster.time_zone)
    now = timezone.now()
    meta = usage.model._meta
    may_see_usage = request.user.has_perm(f"{meta.app_label}.view_{meta.model_name}")
    usage_charts = figures.usage_charts(usage.all(), period, by, now, tz, catalog_names=Model.known_names(),
                                        teams=None if teams is None else teams.all()) if may_see_usage else []
    gpu_charts = figures.gpu_charts(period, now, tz)
    return {"period": period, "by": by, "time_zone": cluster.time_zone, "may_see_usage": may_see_usage,
            "retention_days": cluster.history_retention_days,
            "usage_charts": [c.as_json() for c in usage_charts], "gpu_charts": [c.as_json() for c in gpu_charts],
            "charts": [c.as_json() for c in usage_charts + gpu_charts]}


def _zone(name: str) -> zoneinfo.ZoneInfo:
    """The cluster's time zone (validated when saved; UTC if it has gone bad since)."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return zoneinfo.ZoneInfo("UTC")


@require_GET
def charts(request: HttpRequest, usage: QuerySet, teams: QuerySet | None = None) -> HttpResponse:
    """The charts page: requests, tokens and TTFT p95 per model, key or team, GPU memory and
    utilisation per agent, over ``?period=`` (1h, 6h, 24h, 7d, 30d; default 24h), grouped
    ``?by=`` model, key or team (``teams``, the gateway's, name them). 400 naming the choices
    for any other value."""
    _require(request, Act.VIEW_CLUSTER)
    try:
        found = _charts(request, usage, teams)
    except figures.UnknownChoice as exc:
        return HttpResponseBadRequest(f"{exc}\n", content_type="text/plain; charset=utf-8")
    context = {**admin.site.each_context(request), "is_nav_sidebar_enabled": False, "title": "Charts",
               **found, "periods": figures.PERIODS, "groupings": figures.BY, "top_series": figures.TOP_SERIES,
               "longer_than_kept": 0 < found["retention_days"] * 86400 < found["period"].seconds}
    return TemplateResponse(request, "llmgw/charts.html", context)


@require_GET
def charts_data(request: HttpRequest, usage: QuerySet, teams: QuerySet | None = None) -> HttpResponse:
    """The charts' figures as JSON: ``{"period", "bucket_s", "by", "time_zone", "charts":
    [{"id", "title", "unit", "labels", "series": [{"label", "data"}], "empty", "note"}]}``;
    400 ``{"error": ...}`` for an unknown period or grouping."""
    _require(request, Act.VIEW_CLUSTER)
    try:
        found = _charts(request, usage, teams)
    except figures.UnknownChoice as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({"period": found["period"].key, "bucket_s": found["period"].bucket_s, "by": found["by"],
                         "time_zone": found["time_zone"], "charts": found["charts"]})
