"""The fleet's admin. Acts (cordon, drain, registering an agent, revoking a REST API
token) need the permissions of ``llmgw.permissions``, the same as the dashboard and the
REST API ask for. The admin's login page counts failed logins with the REST API's
(``llmgw.auth_throttle``)."""

from django import forms
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.urls import reverse

from catalog.admin import ClusterSettingsAdmin, SecretFieldsAdminMixin
from fleet.models import Agent, ApiToken, Gpu, ModelState, Replica, ScalingEvent
from fleet.ops.operations import drain_agent, set_cordoned, start_cluster, stop_cluster
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


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    readonly_fields = ("index", "uuid", "name", "memory_total_mib", "memory_used_mib")
    can_delete = False


@admin.register(Agent)
class AgentAdmin(SecretFieldsAdminMixin, admin.ModelAdmin):
    """Agents. Adding one registers the machine and shows its token once; ``cordoned`` is
    read-only without the cordon permission (changing it *is* cordoning)."""

    list_display = ("name", "connected", "cordoned", "address", "cpu_cores", "memory_mib", "gpu_count", "last_seen_at", "version")
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

    @admin.display(description="GPUs")
    def gpu_count(self, obj: Agent) -> int:
        return obj.gpus.count()

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


@admin.register(Replica)
class ReplicaAdmin(SecretFieldsAdminMixin, admin.ModelAdmin):
    list_display = ("id", "model", "agent", "state", "port", "gpu_indices", "state_changed_at", "last_used_at", "reason")
    list_filter = ("state", "agent", "model")
    list_select_related = ("model", "agent")
    # Not the engine key: only the gateway and the replica's agent may know it.
    readonly_fields = [f.name for f in Replica._meta.fields if f.name != "engine_key"]
    secret_fields = ("engine_key",)

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(ModelState)
class ModelStateAdmin(admin.ModelAdmin):
    list_display = ("model", "desired", "wanted_at", "unservable", "reason", "reason_at")
    list_select_related = ("model",)
    readonly_fields = [f.name for f in ModelState._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(ScalingEvent)
class ScalingEventAdmin(admin.ModelAdmin):
    list_display = ("at", "model", "from_replicas", "to_replicas", "reason")
    list_filter = ("model",)
    list_select_related = ("model",)
    date_hierarchy = "at"
    readonly_fields = [f.name for f in ScalingEvent._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


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
    def expires(self, obj: ApiToken):
        return obj.expires_at or "never"

    @admin.display(description="state")
    def state(self, obj: ApiToken) -> str:
        return "expired" if obj.expired() else "active"

    def has_add_permission(self, request) -> bool:
        return False  # issued by POST /api/auth/token/, which shows the token once

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return can(request.user, Act.REVOKE_API_TOKEN)


# The cluster-settings admin (catalog) stops and starts through fleet's operations.
def _wire_cluster_admin() -> None:
    ClusterSettingsAdmin.stop_cluster = staticmethod(stop_cluster)
    ClusterSettingsAdmin.start_cluster = staticmethod(start_cluster)


_wire_cluster_admin()
