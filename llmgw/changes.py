"""What changed in the cluster over a period, newest first, from every record that keeps a
time: operators' acts from any surface (``fleet.models.OperatorAction``: stop, start,
cordon, drain, evict, agents' restart), edits in the admin (Django's ``LogEntry``), load
scaling steps, replicas that failed, API keys created or revoked, teams and agents added,
models added or edited outside the admin. Read by ``llmgw changes`` and the dashboard's
"Changes" page (``/admin/dashboard/changes/``).

Lives in the project package: it reads ``catalog``, ``fleet`` and ``gateway`` alike, which
import nothing from each other (docs/architecture.md, "Dependency direction").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.utils import timezone

from catalog.models import Model
from fleet.models import Agent, OperatorAction, Replica, ScalingEvent
from fleet.protocol import error_summary
from fleet.states import ReplicaState
from gateway.models import ApiKey, Team

#: The kinds of change, in the words the page and the CLI show (and ``--kind`` filters on).
KINDS = ("operator", "admin", "scaling", "failure", "key", "team", "agent", "model")
#: Rows read per source at most: a period with more shows the newest (``truncated``).
PER_SOURCE = 500
_ADMIN_VERBS = {ADDITION: "added", CHANGE: "changed", DELETION: "deleted"}


@dataclass(frozen=True)
class Change:
    """One change: ``at`` (aware), ``kind`` (one of :data:`KINDS`), ``who`` ("" when the
    record keeps no actor: the reconciler, an engine), ``what`` (one line), ``detail``."""

    at: datetime
    kind: str
    who: str
    what: str
    detail: str = ""

    def as_json(self) -> dict:
        """The change with ``at`` as ISO 8601."""
        data = asdict(self)
        data["at"] = self.at.isoformat()
        return data


@dataclass(frozen=True)
class Period:
    """The changes of one period: ``changes`` newest first; ``truncated`` when a source had
    more than :data:`PER_SOURCE` rows (the oldest of them are left out)."""

    since: datetime
    changes: list[Change]
    truncated: bool


def parse_since(text: str) -> timedelta:
    """``"30m"``, ``"24h"``, ``"7d"``, ``"90s"`` → a timedelta. ValueError (saying what is
    accepted) for anything else, zero or negative included."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    value, unit = text.strip()[:-1], text.strip()[-1:].lower()
    try:
        seconds = float(value) * units[unit]
    except (KeyError, ValueError):
        raise ValueError(f"{text!r} is not a period: use a number and s, m, h or d (30m, 24h, 7d)") from None
    if not 0 < seconds <= 3650 * 86400:
        raise ValueError(f"{text!r} is not a period between 1 second and 10 years")
    return timedelta(seconds=seconds)


def recent(since: timedelta = timedelta(days=1), now: datetime | None = None,
           kinds: frozenset[str] | None = None) -> Period:
    """Every change in the ``since`` before ``now`` (default: the last day), newest first.
    ``kinds``: only those (None: all). A handful of queries, each bounded by
    :data:`PER_SOURCE`."""
    start = (now or timezone.now()) - since
    wanted = set(KINDS if kinds is None else kinds)
    changes: list[Change] = []
    truncated = False

    def take(queryset):
        nonlocal truncated
        rows = list(queryset[: PER_SOURCE + 1])
        truncated |= len(rows) > PER_SOURCE
        return rows[:PER_SOURCE]

    added_in_admin: set[tuple[str, str]] = set()  # (model name, object id) added through the admin
    touched_in_admin: set[tuple[str, str]] = set()  # … or changed there
    entries = take(LogEntry.objects.filter(action_time__gte=start).select_related("user", "content_type")
                   .order_by("-action_time"))
    for entry in entries:
        if entry.content_type is not None:
            touched_in_admin.add((entry.content_type.model, str(entry.object_id)))
            if entry.action_flag == ADDITION:
                added_in_admin.add((entry.content_type.model, str(entry.object_id)))
    if "admin" in wanted:
        for entry in entries:
            kind_name = entry.content_type.name if entry.content_type else "object"
            verb = _ADMIN_VERBS.get(entry.action_flag, "changed")
            message = entry.get_change_message()
            changes.append(Change(entry.action_time, "admin", f"{entry.user.get_username()} (admin)" if entry.user else "",
                                  f"{verb} {kind_name} {entry.object_repr}", message if message != "No fields changed." else ""))
    if "operator" in wanted:
        for act in take(OperatorAction.objects.filter(at__gte=start).order_by("-at")):
            changes.append(Change(act.at, "operator", act.actor, f"{act.action} {act.target}".strip(), act.detail))
    if "scaling" in wanted:
        for event in take(ScalingEvent.objects.filter(at__gte=start).select_related("model").order_by("-at")):
            changes.append(Change(event.at, "scaling", "", f"{event.model.name}: {event.from_replicas} → "
                                                           f"{event.to_replicas} replicas", event.reason))
    if "failure" in wanted:
        for replica in take(Replica.objects.filter(state=ReplicaState.FAILED.value, state_changed_at__gte=start)
                            .select_related("agent").order_by("-state_changed_at")):
            changes.append(Change(replica.state_changed_at, "failure", "",
                                  f"replica r{replica.pk} of {replica.model_name or 'a deleted model'} failed on "
                                  f"{replica.agent.name}", error_summary(replica.error) or replica.reason))
    if "key" in wanted:
        for key in take(ApiKey.objects.filter(created_at__gte=start).select_related("team").order_by("-created_at")):
            if ("apikey", str(key.pk)) in added_in_admin:
                continue
            team = f" (team {key.team.name})" if key.team_id else ""
            changes.append(Change(key.created_at, "key", "", f"key {key.name} created{team}", f"prefix {key.prefix}"))
        for key in take(ApiKey.objects.filter(revoked_at__gte=start).order_by("-revoked_at")):
            changes.append(Change(key.revoked_at, "key", "", f"key {key.name} revoked", f"prefix {key.prefix}"))
    if "team" in wanted:
        for team in take(Team.objects.filter(created_at__gte=start).order_by("-created_at")):
            if ("team", str(team.pk)) not in added_in_admin:
                changes.append(Change(team.created_at, "team", "", f"team {team.name} created"))
    if "agent" in wanted:
        for agent in take(Agent.objects.filter(created_at__gte=start).order_by("-created_at")):
            if ("agent", str(agent.pk)) not in added_in_admin:
                changes.append(Change(agent.created_at, "agent", "", f"agent {agent.name} registered"))
    if "model" in wanted:
        for model in take(Model.objects.filter(updated_at__gte=start).order_by("-updated_at")):
            if ("model", str(model.pk)) in touched_in_admin:
                continue  # the admin's own entry says it, with who and which fields
            if model.created_at >= start:
                changes.append(Change(model.created_at, "model", "", f"model {model.name} added"))
            else:
                changes.append(Change(model.updated_at, "model", "", f"model {model.name} edited"))
    changes.sort(key=lambda c: c.at, reverse=True)
    return Period(start, changes, truncated)


#: The page's period choices: (key, words).
PAGE_PERIODS = (("1h", "hour"), ("24h", "day"), ("7d", "7 days"), ("30d", "30 days"))


def page(request):
    """The dashboard's "Changes" page (``/admin/dashboard/changes/``, staff through the admin
    site): :func:`recent` over ``?since=`` (one of :data:`PAGE_PERIODS`, default 24h) as a
    table. Needs ``Act.VIEW_CLUSTER``, like the dashboard; keys and teams are shown to those
    who may view them, admin edits to those who may view the admin's log. 400 for another
    period."""
    from django.contrib import admin
    from django.core.exceptions import PermissionDenied
    from django.http import HttpResponseBadRequest
    from django.template.response import TemplateResponse

    from llmgw.permissions import Act, can

    if not can(request.user, Act.VIEW_CLUSTER):
        raise PermissionDenied
    key = request.GET.get("since", "24h")
    words = dict(PAGE_PERIODS).get(key)
    if words is None:
        return HttpResponseBadRequest(f"since must be one of {', '.join(k for k, _ in PAGE_PERIODS)}\n",
                                      content_type="text/plain; charset=utf-8")
    user = request.user
    kinds = {"operator", "scaling", "failure", "agent", "model"}
    if user.has_perm("gateway.view_apikey"):
        kinds.add("key")
    if user.has_perm("gateway.view_team"):
        kinds.add("team")
    if user.has_perm("admin.view_logentry"):
        kinds.add("admin")
    period = recent(parse_since(key), kinds=frozenset(kinds))
    context = {**admin.site.each_context(request), "is_nav_sidebar_enabled": False, "title": "Changes",
               "period": period, "since_key": key, "since_words": words, "periods": PAGE_PERIODS,
               "per_source": PER_SOURCE, "hidden": sorted(set(KINDS) - kinds)}
    return TemplateResponse(request, "llmgw/changes.html", context)
