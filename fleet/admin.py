"""The fleet's admin. Acts (cordon, drain, registering an agent, revoking a REST API
token) need the permissions of ``llmgw.permissions``, the same as the dashboard and the
REST API ask for. The admin's login page counts failed logins with the REST API's
(``llmgw.auth_throttle``).

The lists show what every surface shows (the read model, ``fleet.ops.cluster``: alive,
lost, a replica's state on a silent agent, outdated), with a failed replica's meaningful
error line, cut to fit a 1366 px screen; internal fields (generations, sessions, spec
hashes, GPU inventory, the reconciler's model state) are read-only. The catalog's model
list and page get their live columns and "where it stands now" from here (``model_rows``,
``model_panel``)."""

from __future__ import annotations

from datetime import datetime

from django import forms
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.db.models import Count, Max, Q
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from catalog.admin import (ClusterSettingsAdmin, ModelAdmin, SecretFieldsAdminMixin, WideListMixin, admin_link, cut,
                           instant)
from catalog.models import Model
from fleet.models import Agent, ApiToken, Gpu, ModelState, Replica, ScalingEvent
from fleet.ops import cluster as read
from fleet.ops.dashboard import model_phase
from fleet.ops.explain import explain_model, explain_text
from fleet.ops.operations import drain_agent, set_cordoned, start_cluster, stop_cluster
from fleet.protocol import error_summary, trouble_line
from fleet.states import LIVE, ReplicaState
from llmgw import auth_throttle
from llmgw.permissions import Act, can
from llmgw.shown_once import shown_once_response


class ThrottledAdminAuthenticationForm(AdminAuthenticationForm):
    """The admin's login form, with failed logins counted per username and per address
    in the counters the token endpoint and HTTP basic use: past the limit every attempt is
    refused until the window ends, a correct password too (otherwise this page would be
    the way around the REST API's throttle)."""

    def clean(self):
        attempt, wait = auth_throttle.reserve(self.cleaned_data.get("username"),
                                              auth_throttle.client_address(self.request))
        if attempt is None:
            raise forms.ValidationError(f"{auth_throttle.MESSAGE} (in {wait} s)", code="throttled")
        cleaned = super().clean()  # a failure raises: it stays counted
        attempt.succeeded()
        return cleaned


admin.site.login_form = ThrottledAdminAuthenticationForm


def _second(when: datetime | None) -> str:
    """An instant in the admin's time zone, to the second, with the zone's name ("-" for none)."""
    return instant(when)


def _ago(seconds: float) -> str:
    """A duration for people: "40 s", "12 min", "3 h"."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.0f} h"


def error_cell(error: str, limit: int) -> str:
    """A replica's error for a table cell: the line that says what went wrong
    (``fleet.protocol.trouble_line``) cut to ``limit`` characters, else the agent's own
    words; the one-line summary (``error_summary``) in the title. Escaped; "-" for none."""
    summary = error_summary(error)
    if not summary:
        return "-"
    picked = trouble_line([line.strip() for line in error.splitlines()[1:]])
    shown = picked[1] if picked else summary
    if len(shown) > limit:
        shown = shown[:limit - 1] + "…"
    return format_html('<span title="{}">{}</span>', summary, shown)


class GpuInline(admin.TabularInline):
    """An agent's GPUs as it reported them: inventory, read-only."""

    model = Gpu
    extra = 0
    fields = readonly_fields = ("index", "uuid", "name", "memory_total_mib", "memory_used_mib", "utilisation_pct",
                                "temperature_c")
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # the agent's hello says which GPUs it has


@admin.register(Agent)
class AgentAdmin(WideListMixin, SecretFieldsAdminMixin, admin.ModelAdmin):
    """Agents. Adding one registers the machine and shows its token once; ``cordoned`` is
    read-only without the cordon permission (changing it *is* cordoning)."""

    list_display = ("name_cut", "state", "address", "resources", "replica_count", "last_seen", "version")
    list_filter = ("connected", "cordoned")
    search_fields = ("name", "address")
    readonly_fields = ("token_prefix", "connected", "connected_since", "last_seen_at", "version", "address",
                       "cpu_cores", "memory_mib", "generation", "restart_generation", "session")
    exclude = ("token_sha256",)
    secret_fields = ("token_sha256",)
    inlines = [GpuInline]
    actions = ["cordon", "uncordon", "drain", "rekey"]

    def save_model(self, request, obj, form, change):
        """A new agent gets its token here; it is shown once by :meth:`response_add`."""
        super().save_model(request, obj, form, change)
        if not change:
            obj._clear_token = obj.rekey()  # on this object only: never stored in clear

    def response_add(self, request, obj, post_url_continue=None):
        clear = getattr(obj, "_clear_token", "")
        if not clear:
            return super().response_add(request, obj, post_url_continue)
        return self._show_tokens(request, f"Agent {obj.name} added", [(obj.name, clear)])

    def _show_tokens(self, request, title: str, tokens: list[tuple[str, str]]):
        return shown_once_response(
            request, self.admin_site, title=title, explanation="Each agent's new token is below.",
            secrets=tokens, back=reverse("admin:fleet_agent_changelist"),
            usage="On the agent's machine: LLMGW_AGENT_TOKEN=<token> manage.py llmgw agent --server URL "
                  "(in the environment, not on the command line, which every user can read with ps).")

    @admin.action(description="Re-key (new token; the old one is refused and its connection closed at once)",
                  permissions=["rekey"])
    def rekey(self, request, queryset):
        tokens = [(agent.name, agent.rekey()) for agent in queryset.order_by("name")]
        return self._show_tokens(request, f"{len(tokens)} agent(s) re-keyed", tokens)

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            gpus_n=Count("gpus", distinct=True), running_n=Count("replicas", distinct=True,
                                                                 filter=read_live_filter()))

    def get_changelist_instance(self, request):
        """The list, read at one moment of the read model (alive, lost) for every row."""
        changelist = super().get_changelist_instance(request)
        at = read.moment()
        shown = list(changelist.result_list)
        for agent in shown:
            agent.at = at
        changelist.result_list = shown
        return changelist

    @admin.display(description="name", ordering="name")
    def name_cut(self, obj: Agent) -> str:
        return cut(obj.name, 30)

    @admin.display(description="state")
    def state(self, obj: Agent) -> str:
        """Alive, lost (silent for how long) or disconnected, as ``llmgw status`` says, and
        cordoned when it is."""
        at = getattr(obj, "at", None) or read.moment()
        if at.agent_alive(obj):
            words = "alive"
        elif not at.agent_heard_from(obj):
            silent = (at.now - obj.last_seen_at).total_seconds() if obj.last_seen_at else None
            words = f"lost (silent for {_ago(silent)})" if silent is not None else "never heard from"
        else:
            words = "disconnected"
        return words + (", cordoned" if obj.cordoned else "")

    @admin.display(description="GPUs · cores · memory")
    def resources(self, obj: Agent) -> str:
        gpus = getattr(obj, "gpus_n", None)
        gpus = obj.gpus.count() if gpus is None else gpus
        return f"{gpus} GPU{'s' if gpus != 1 else ''} · {obj.cpu_cores} cores · {obj.memory_mib / 1024:.0f} GiB"

    @admin.display(description="replicas")
    def replica_count(self, obj: Agent) -> int:
        n = getattr(obj, "running_n", None)
        return obj.replicas.live().count() if n is None else n

    @admin.display(description="last seen", ordering="last_seen_at")
    def last_seen(self, obj: Agent) -> str:
        return _second(obj.last_seen_at)

    def get_readonly_fields(self, request, obj=None):
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields if can(request.user, Act.CORDON_AGENT) else fields + ("cordoned",)

    def has_add_permission(self, request) -> bool:
        return can(request.user, Act.REGISTER_AGENT)

    def has_rekey_permission(self, request) -> bool:
        return can(request.user, Act.REGISTER_AGENT)  # a new token is a new way in, like adding

    def has_cordon_permission(self, request) -> bool:
        return can(request.user, Act.CORDON_AGENT)

    def has_drain_permission(self, request) -> bool:
        return can(request.user, Act.DRAIN_AGENT)

    @admin.action(description="Cordon (place nothing new)", permissions=["cordon"])
    def cordon(self, request, queryset):
        n = sum(set_cordoned(agent, True) for agent in queryset)
        self.message_user(request, f"{n} agent(s) cordoned.")

    @admin.action(description="Uncordon", permissions=["cordon"])
    def uncordon(self, request, queryset):
        n = sum(set_cordoned(agent, False) for agent in queryset)
        self.message_user(request, f"{n} agent(s) uncordoned.")

    @admin.action(description="Drain (cordon and move replicas to other agents)", permissions=["drain"])
    def drain(self, request, queryset):
        moved = sum(drain_agent(agent, request.user.get_username()) for agent in queryset)
        self.message_user(request, f"{queryset.count()} agent(s) drained: {moved} replica(s) moving away.")


def read_live_filter() -> Q:
    """The ``Q`` of an agent's replicas an operator sees as running (``Replica.objects.live``)."""
    return Q(replicas__state__in=[s.value for s in LIVE])


@admin.register(Replica)
class ReplicaAdmin(WideListMixin, SecretFieldsAdminMixin, admin.ModelAdmin):
    """Replicas, read-only. The list shows each one's state as every surface shows it (on a
    lost agent, the state the next pass gives it; "outdated" when started from an older
    spec), since when, the planner's reason and a failed one's error line (the meaningful
    line, ``fleet.protocol.error_summary``), cut to fit 1366 px with the whole in the title."""

    list_display = ("id", "model_cut", "agent_cut", "state_shown", "gpus", "since", "reason_cut", "error_line")
    list_filter = ("state", "agent")
    list_select_related = ("model", "agent")
    search_fields = ("model_name", "agent__name", "reason", "error")
    # Not the engine key: only the gateway and the replica's agent may know it.
    readonly_fields = [f.name for f in Replica._meta.fields if f.name != "engine_key"] + ["error_line"]
    secret_fields = ("engine_key",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a row dropped under a running engine orphans it: drain the agent or evict the model

    def get_changelist_instance(self, request):
        """The list, read at one moment of the read model, with the current spec hashes of
        the page's models (one query each)."""
        changelist = super().get_changelist_instance(request)
        at = read.moment()
        shown = list(changelist.result_list)
        hashes = read.spec_hashes({r.model_id for r in shown if r.model_id is not None})
        for r in shown:
            r.shown = at.replica_state(r)
            r.outdated = read.replica_outdated(r, hashes)
        changelist.result_list = shown
        return changelist

    @admin.display(description="model", ordering="model_name")
    def model_cut(self, obj: Replica) -> str:
        return admin_link("admin:catalog_model_change", obj.model_id, obj.shown_model_name, 30)

    @admin.display(description="agent", ordering="agent__name")
    def agent_cut(self, obj: Replica) -> str:
        return admin_link("admin:fleet_agent_change", obj.agent_id, obj.agent.name, 20)

    @admin.display(description="state", ordering="state")
    def state_shown(self, obj: Replica) -> str:
        state = getattr(obj, "shown", None) or ReplicaState(obj.state)
        words = state.value if state.value == obj.state else f"{state.value} (agent silent)"
        return words + (", outdated" if getattr(obj, "outdated", False) and state in LIVE else "")

    @admin.display(description="GPUs")
    def gpus(self, obj: Replica) -> str:
        return ",".join(str(i) for i in obj.gpu_indices) if obj.gpu_indices else "CPU"

    @admin.display(description="since", ordering="state_changed_at")
    def since(self, obj: Replica) -> str:
        return _second(obj.state_changed_at)

    @admin.display(description="reason")
    def reason_cut(self, obj: Replica) -> str:
        return cut(obj.reason, 50)

    @admin.display(description="error")
    def error_line(self, obj: Replica) -> str:
        """The meaningful line of its error, cut: the log line that names the trouble when
        there is one ("address already in use", the exception), else the agent's words; the
        summary with both in the title, the whole error on its page."""
        return error_cell(obj.error, 120)


@admin.register(ModelState)
class ModelStateAdmin(admin.ModelAdmin):
    """The reconciler's state per model: internal, read-only."""

    list_display = ("model_cut", "desired", "wanted_at", "unservable", "reason_cut", "reason_at")
    list_select_related = ("model",)
    readonly_fields = [f.name for f in ModelState._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # the reconciler's own; it goes with its model

    @admin.display(description="model", ordering="model__name")
    def model_cut(self, obj: ModelState) -> str:
        return cut(obj.model.name)

    @admin.display(description="reason")
    def reason_cut(self, obj: ModelState) -> str:
        return cut(obj.reason, 60)


@admin.register(ScalingEvent)
class ScalingEventAdmin(WideListMixin, admin.ModelAdmin):
    """The reconciler's scale-ups and -downs: read-only; the list cuts the model's name and the
    reason to fit 1366 px (the whole on hover and on the event's page)."""

    list_display = ("when", "model_cut", "from_replicas", "to_replicas", "reason_cut")
    list_filter = ("model",)
    list_select_related = ("model",)
    date_hierarchy = "at"
    readonly_fields = [f.name for f in ScalingEvent._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # history: pruned by its retention, not by hand

    @admin.display(description="at", ordering="at")
    def when(self, obj: ScalingEvent) -> str:
        return instant(obj.at)

    @admin.display(description="model", ordering="model__name")
    def model_cut(self, obj: ScalingEvent) -> str:
        return cut(obj.model.name)

    @admin.display(description="reason")
    def reason_cut(self, obj: ScalingEvent) -> str:
        return cut(obj.reason, 60)


@admin.register(ApiToken)
class ApiTokenAdmin(SecretFieldsAdminMixin, admin.ModelAdmin):
    """REST API tokens (issued by ``POST /api/auth/token/``): who holds which, when each was
    last used and when it expires. Deleting one revokes it at once (every request looks
    the token up); nothing else about a token can be changed here."""

    list_display = ("user", "prefix", "created_at", "last_used_at", "expires", "state")
    list_filter = ("user",)
    list_select_related = ("user",)
    search_fields = ("user__username", "prefix")
    secret_fields = ("sha256",)
    readonly_fields = ("user", "prefix", "created_at", "last_used_at", "expires", "state")
    fields = readonly_fields

    @admin.display(description="expires")
    def expires(self, obj: ApiToken) -> str:
        return instant(obj.expires_at) if obj.expires_at else "never"

    @admin.display(description="state")
    def state(self, obj: ApiToken) -> str:
        return "expired" if obj.expired() else "active"

    def has_add_permission(self, request) -> bool:
        return False  # issued by POST /api/auth/token/, which shows the token once

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return can(request.user, Act.REVOKE_API_TOKEN)


def model_rows(model_ids: list[int]) -> dict[int, dict]:
    """Model id → ``state`` ("1 of 2 ready · loading": ready of desired and the dashboard's
    phase, ``fleet.ops.dashboard.model_phase``), ``reason`` (the last pass's word, read
    model; for a failed model with nothing to say, its newest replica's error line) and
    ``last_used_at``, for the catalog's model list: a handful of queries whatever the
    page's size."""
    ids = list(model_ids)
    at = read.moment()
    live = list(Replica.objects.live().filter(model_id__in=ids).select_related("agent"))
    by_model: dict[int, list[str]] = {i: [] for i in ids}
    for r in live:
        by_model[r.model_id].append(at.replica_state(r).value)
    newest = Replica.objects.filter(model_id__in=ids).values("model_id").annotate(n=Max("id")).values("n")
    last = {m: (state, error) for m, state, error in Replica.objects.filter(id__in=newest)
            .values_list("model_id", "state", "error")}
    used = dict(Replica.objects.filter(model_id__in=ids).values("model_id").annotate(t=Max("last_used_at"))
                .values_list("model_id", "t"))
    states = {s.model_id: s for s in ModelState.objects.filter(model_id__in=ids)}
    out = {}
    for m in Model.objects.filter(pk__in=ids):
        st = states.get(m.pk)
        desired = st.desired if st else 0
        last_state, last_error = last.get(m.pk, (None, ""))
        phase = model_phase(external=m.is_external, desired=desired, states=by_model[m.pk],
                            unservable=bool(st and st.unservable), last_state=last_state)
        ready = by_model[m.pk].count(ReplicaState.READY.value)
        reason = read.model_reason(st)
        if phase == "failed" and not reason and last_error:
            reason = error_summary(last_error)
        out[m.pk] = {"state": phase if m.is_external else f"{ready} of {desired} ready · {phase}",
                     "reason": reason, "last_used_at": used.get(m.pk)}
    return out


def model_panel(model: Model) -> str:
    """A model's page, "where it stands now" (HTML, every value escaped): its state and the
    pass's reason, its replicas (agent, GPUs, state, since, note, error line), how many are
    outdated, the last failure (the meaningful line, when, which replica; cleared once a
    replica is ready since) and ``llmgw explain``'s text (``fleet.ops.explain``)."""
    info = explain_model(model)
    row = model_rows([model.pk]).get(model.pk, {"state": "-"})
    at = read.moment()
    hashes = read.spec_hashes([model.pk])
    replicas = list(model.replicas.exclude(state=ReplicaState.STOPPED.value).select_related("agent")
                    .order_by("-id")[:20])
    outdated = [r for r in replicas if read.replica_outdated(r, hashes) and ReplicaState(r.state) in LIVE]
    body = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                            "</tr>", (
        (admin_link("admin:fleet_replica_change", r.pk, f"r{r.pk}"),
         admin_link("admin:fleet_agent_change", r.agent_id, r.agent.name, 20),
         ",".join(str(i) for i in r.gpu_indices) if r.gpu_indices else "CPU", at.replica_state(r).value,
         _second(r.state_changed_at), read.replica_note(r, hashes) or "-", error_cell(r.error, 120))
        for r in replicas))
    table = (format_html('<table class="llmgw-replicas"><thead><tr><th>replica</th><th>agent</th><th>GPUs</th>'
                         "<th>state</th><th>since</th><th>note</th><th>error</th></tr></thead><tbody>{}</tbody>"
                         "</table>", body) if replicas else format_html("<p>{}</p>", "No replicas now."))
    if info["last_failure"]:
        failure = format_html('<p id="last-failure"><strong>Last failure:</strong> {} (replica {}): {}</p>',
                              _second(datetime.fromisoformat(info["last_failure_at"])), info["last_failure_replica"],
                              info["last_failure"])
    else:
        failure = format_html('<p id="last-failure"><strong>Last failure:</strong> {}</p>',
                              "none since a replica last became ready")
    wrap = "white-space:pre-wrap;overflow-wrap:anywhere;max-width:100%;margin:0"
    return format_html(
        '<div class="llmgw-live"><p><strong>State:</strong> <span id="model-state">{}</span></p>'
        '<p><strong>Reason:</strong> {}</p><p><strong>Outdated:</strong> {}</p>{}{}'
        '<details open><summary>llmgw explain {}</summary><pre id="model-explain" style="{}">{}</pre></details></div>',
        row["state"], info["reason"] or "-",
        f"{len(outdated)} replica(s) started from an older spec, being replaced" if outdated else "none",
        failure, table, model.name, wrap, explain_text(info))


# The catalog's admin (which imports nothing from fleet) stops and starts the cluster and
# shows what runs through fleet's reads and operations.
def _wire_cluster_admin() -> None:
    ClusterSettingsAdmin.stop_cluster = staticmethod(stop_cluster)
    ClusterSettingsAdmin.start_cluster = staticmethod(start_cluster)
    ModelAdmin.live_rows = staticmethod(model_rows)
    ModelAdmin.live_panel = staticmethod(model_panel)


_wire_cluster_admin()
