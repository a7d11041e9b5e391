"""The catalog's admin. Engine code (a profile's command and env, ``pypi:``/``file:``
weights) is read-only to users without ``catalog.change_engine_code`` and every change of
it is recorded (``catalog.engine_code``); stopping and starting the cluster need their own
permissions (``llmgw.permissions``)."""

from datetime import UTC, datetime

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Max
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from catalog import engine_code, schedules
from catalog.models import (KEY_STAYS_WITH_ITS_URL, Benchmark, ClusterSettings, Model, Profile, ScheduleWindow,
                            limits_info)
from llmgw.permissions import Act, can


#: How many characters of a name or reason a list column shows (the whole text in its title),
#: so every list fits a 1366 px screen with its filters.
LIST_TEXT_CHARS = 40


def cut(value, limit: int = LIST_TEXT_CHARS) -> str:
    """``value`` for a list column: as it is when it is short, else its first ``limit`` - 1
    characters and "…" in a ``<span>`` whose ``title`` holds the whole text (a hover shows
    it). Escaped either way (``format_html``): names and errors come from users, engines and
    agents, and never reach a page as markup. "-" for an empty value."""
    text = "" if value is None else str(value)
    if not text:
        return "-"
    if len(text) <= limit:
        return format_html("{}", text)
    return format_html('<span title="{}">{}…</span>', text, text[:limit - 1])


def instant(when) -> str:
    """An instant as the admin shows it everywhere: "2026-12-04 18:47:12 UTC", to the second in
    the admin's time zone (``TIME_ZONE``, as the dashboard's times) with its name; "-" for
    none. ``when`` is an aware datetime or an ISO 8601 string (``tenant_usage``'s resets);
    a naive one is taken as UTC. Raises ValueError for a string that is no ISO 8601 instant."""
    if when is None or when == "":
        return "-"
    if isinstance(when, str):
        when = datetime.fromisoformat(when)
    if timezone.is_naive(when):
        when = when.replace(tzinfo=UTC)
    return timezone.localtime(when).strftime("%Y-%m-%d %H:%M:%S %Z")


def admin_link(viewname: str, pk, text, limit: int = LIST_TEXT_CHARS) -> str:
    """``text`` (cut as :func:`cut` does) linked to the admin page ``viewname`` of the
    object ``pk``; only the text when ``pk`` is None (the object is gone)."""
    shown = cut(text, limit)
    if pk is None:
        return shown
    return format_html('<a href="{}">{}</a>', reverse(viewname, args=[pk]), shown)


class WideListMixin:
    """A list page without the admin's navigation sidebar (the breadcrumbs still lead
    everywhere): its columns — state, reason, an error line — then fit a 1366 px screen
    beside the filters without scrolling sideways."""

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {**(extra_context or {}), "is_nav_sidebar_enabled": False})


class SecretFieldsAdminMixin:
    """Refuses changelist lookups on secret fields (``secret_fields``): Django's admin takes
    any lookup on a model's own fields from the query string (``?engine_key__startswith=a``),
    and the list shrinking when a guess is wrong would let anyone who may view the list walk
    to the whole secret a character at a time. Such a request gets 400 (Django's
    ``DisallowedModelAdminLookup``)."""

    #: Names of the model's fields that are never filtered on from a URL.
    secret_fields: tuple[str, ...] = ()

    def lookup_allowed(self, lookup, value, request=None):
        if lookup.split("__", 1)[0] in self.secret_fields:
            return False
        return super().lookup_allowed(lookup, value, request)


class EngineCodeAdminMixin:
    """Saves through the admin: engine-code changes are refused unless the user may make
    them (the fields are read-only to others, so this is the last guard) and recorded in
    the object's history and the ``llmgw.audit`` log."""

    def _engine_code_values(self, form) -> dict:
        return {name: form.cleaned_data[name] for name in ("command", "env", "weights") if name in form.cleaned_data}

    def save_model(self, request, obj, form, change):
        before = type(obj).objects.get(pk=obj.pk) if change and obj.pk else None
        found = engine_code.changes(type(obj), before, self._engine_code_values(form))
        if found and not engine_code.allowed(request.user):
            raise PermissionDenied(engine_code.denial(type(obj), creating=before is None))
        with transaction.atomic():  # never saved without its record
            super().save_model(request, obj, form, change)
            engine_code.record(request.user, obj, found, "the admin")


class ScheduleWindowFormSet(forms.BaseInlineFormSet):
    """Rejects windows of one model that overlap each other, across the rows being saved."""

    def clean(self) -> None:
        super().clean()
        windows = []
        for form in self.forms:
            data = getattr(form, "cleaned_data", None)
            if not data or data.get("DELETE") or not data.get("start") or not data.get("end"):
                continue
            try:
                days = schedules.parse_weekdays(data.get("weekdays", ""))
            except ValueError:
                continue
            windows.append(schedules.Window(days, data["start"], data["end"], data.get("min_replicas") or 0,
                                            data.get("max_replicas"), id=len(windows)))
        clashes = schedules.overlapping(windows)
        if clashes:
            a, b = clashes[0]
            raise forms.ValidationError(
                f"Schedule windows overlap: {schedules.describe(a)} and {schedules.describe(b)}.")


class ScheduleWindowInline(admin.TabularInline):
    model = ScheduleWindow
    formset = ScheduleWindowFormSet
    extra = 0
    fields = ("weekdays", "start", "end", "min_replicas", "max_replicas")


class BenchmarkInline(admin.TabularInline):
    model = Benchmark
    extra = 0
    fields = ("profile", "max_concurrency", "slo_ttft_p95_ms", "slo_tpot_p95_ms", "measured_at", "method")
    readonly_fields = ("measured_at",)


@admin.register(Profile)
class ProfileAdmin(WideListMixin, EngineCodeAdminMixin, admin.ModelAdmin):
    """Engine profiles. ``command`` and ``env`` are read-only without the engine-code
    permission, and creating a profile needs it too (a profile is a command). A profile
    whose engines do not take their replica's key is flagged UNPROTECTED."""

    list_display = ("name", "engine", "gpus_needed", "gpu_memory_mib", "cpu_cores", "memory_mib", "readiness_path",
                    "engine_key")
    list_filter = ("engine",)
    search_fields = ("name", "command")
    readonly_fields = ("engine_key_note", "serves")

    @admin.display(description="serves")
    def serves(self, obj: Profile) -> str:
        traits = obj.engine_traits
        context = f"{traits.context_length} tokens of context" if traits.context_length else "context length unknown"
        return f"{', '.join(sorted(obj.served_endpoints))}; {context} (from its command)"

    @admin.display(boolean=True, description="engine key")
    def engine_key(self, obj: Profile) -> bool:
        return obj.protects_engine

    @admin.display(description="engine key")
    def engine_key_note(self, obj: Profile) -> str:
        if obj.pk is None:
            return "Put {api_key} in the command or an env value so that only the gateway can use the engine."
        if obj.protects_engine:
            return "Engines start with their replica's key: only the gateway can use them."
        return ("UNPROTECTED: the command and env have no {api_key}, so anyone who reaches an engine's port "
                "can use it around the gateway's keys and limits. Add the engine's API key option if it has one.")

    def get_readonly_fields(self, request, obj=None):
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields if engine_code.allowed(request.user) else fields + ("command", "env")

    def has_add_permission(self, request) -> bool:
        return super().has_add_permission(request) and engine_code.allowed(request.user)

    def get_deleted_objects(self, objs, request):
        """Django's delete confirmation, with what still needs a profile beyond foreign keys
        (replicas that may still run, ``Profile.in_use_by``) listed as protected: the page
        says why it cannot be deleted instead of failing when the delete is tried."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        protected = list(protected) + [f"{type(o)._meta.verbose_name}: {o} (may still run)"
                                       for profile in objs for o in profile.in_use_by()]
        return deleted, counts, perms_needed, protected


class SecretKeyField(forms.CharField):
    """A write-only secret: a password input that never renders the stored value, where
    blank means "leave it unchanged" (so it only counts as changed when something is typed,
    and the admin's history names the field, never a value)."""

    widget = forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"})

    def has_changed(self, initial, data) -> bool:
        return bool(data)


class ModelAdminForm(forms.ModelForm):
    """The model form with ``external_api_key`` write-only (docs/architecture.md,
    "Security": write-only secrets): shown as set / not set, replaced by typing a new key,
    removed with ``clear_external_api_key``; left blank, the stored key stays."""

    external_api_key = SecretKeyField(
        required=False, max_length=500, strip=True, label="External API key",
        help_text="Write-only: type a key to set or replace it; leave blank to keep the stored one.")
    clear_external_api_key = forms.BooleanField(required=False, label="Clear the stored external API key")

    class Meta:
        model = Model
        fields = "__all__"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        stored = bool(self.instance and self.instance.pk and self.instance.external_api_key)
        self.initial["external_api_key"] = ""  # never sent to the browser
        self.fields["external_api_key"].help_text = (
            ("A key is set." if stored else "No key is set.") + " " + self.fields["external_api_key"].help_text)

    def clean_external_api_key(self) -> str:
        typed = self.cleaned_data.get("external_api_key") or ""
        if typed:
            return typed
        return self.instance.external_api_key if self.instance and self.instance.pk else ""

    def clean(self) -> dict:
        data = super().clean()
        typed = bool(self.data.get(self.add_prefix("external_api_key")))
        if data.get("clear_external_api_key"):
            if typed:
                self.add_error("clear_external_api_key", "Either type a new key or clear the stored one, not both.")
            data["external_api_key"] = ""
            self.instance.external_api_key = ""
        elif (self.instance.pk and self.instance.external_api_key and not typed
              and "external_base_url" in data and data["external_base_url"] != self.instance.external_base_url):
            # The stored key is never sent to a new address: give it again, or clear it.
            self.add_error("external_api_key", KEY_STAYS_WITH_ITS_URL)
        return data


class WeightsGuardForm(ModelAdminForm):
    """A model's form for users without the engine-code permission: ``pypi:`` and
    ``file:`` weights are refused with the reason (other sources are fine); the external
    key stays write-only as in :class:`ModelAdminForm`."""

    def clean_weights(self):
        value = self.cleaned_data.get("weights", "")
        before = Model.objects.get(pk=self.instance.pk) if self.instance.pk else None
        if engine_code.changes(Model, before, {"weights": value}):
            raise forms.ValidationError(engine_code.denial(Model, creating=before is None))
        return value


@admin.register(Model)
class ModelAdmin(WideListMixin, SecretFieldsAdminMixin, EngineCodeAdminMixin, admin.ModelAdmin):
    """Catalog models. Without the engine-code permission, ``pypi:``/``file:`` weights
    are read-only and cannot be set. The external provider key is write-only, and never
    a filter. The routing policy has its own fieldset and is a filter, not a column.

    The list shows each model's state (ready of desired, in the dashboard's words) and the
    last pass's reason, cut to fit 1366 px (the whole in the title). A model's page shows,
    read-only, where it stands (its replicas, outdated ones, the last failure, explain's
    text) and its recent usage. What runs is the fleet's and usage the gateway's: neither
    may be imported here, so each injects its part (``live_panel`` and ``live_rows`` from
    ``fleet.admin``, ``usage_panel`` from ``gateway.admin``); without them the page says
    nothing about either."""

    secret_fields = ("external_api_key",)

    #: ``live_rows(model_ids) -> {model id: {"state": str, "reason": str, "last_used_at":
    #: datetime | None}}`` for the list, in a few queries whatever the page's size (set by
    #: ``fleet.admin``).
    live_rows = None
    #: ``live_panel(model) -> html`` for a model's page (set by ``fleet.admin``).
    live_panel = None
    #: ``usage_panel(model) -> html`` for a model's page (set by ``gateway.admin``), shown to
    #: users with ``usage_panel_permission`` (the right to see usage records).
    usage_panel = None
    usage_panel_permission = ""

    list_display = ("name_cut", "aliases_cut", "profile", "scaling", "served_at", "state", "reason", "last_used")
    inlines = [ScheduleWindowInline, BenchmarkInline]
    list_filter = ("on_demand", "routing_policy", "profile")
    search_fields = ("name", "aliases", "weights")
    list_select_related = ("profile", "fleet_state")
    fieldsets = (
        (None, {"fields": ("name", "aliases")}),
        ("Served here", {"fields": ("profile", "weights")}),
        ("Scaling", {"fields": ("min_replicas", "max_replicas", "on_demand", "idle_timeout_s")}),
        ("Routing", {"fields": ("routing_policy",),
                     "description": "Which of its replicas a request goes to. It does not apply to an external "
                     "model: its requests go to its base URL."}),
        ("Requests", {"fields": ("default_max_tokens", "endpoints", "context_length", "max_output_tokens",
                                 "weights_context_length", "limits")}),
        ("Warm before demand", {"fields": ("cold_start", "warm_ahead"),
                                "description": "Measured by the fleet; the cluster settings switch the rules. "
                                "llmgw explain says more: the next window, the hours it is usually asked for, the "
                                "load's trend."}),
        ("Served elsewhere (external)", {"fields": ("external_base_url", "external_api_key", "clear_external_api_key",
                                                    "external_forward_org_headers"), "classes": ("collapse",)}),
    )
    form = ModelAdminForm

    def get_fieldsets(self, request, obj=None):
        """For someone who may only view a model, the key's field is read-only, and the
        admin shows read-only fields' values: show whether one is set instead. A model's
        page (not the add page) starts with where it stands and ends with its usage, for
        those who may see usage records."""
        fieldsets = list(super().get_fieldsets(request, obj))
        if obj is not None:
            fieldsets = [("Where it stands now", {"fields": ("live",), "description": "Read-only: the fleet's read "
                                                  "model, as llmgw status, explain and the dashboard show it."})
                         ] + fieldsets
            permission = type(self).usage_panel_permission
            if type(self).usage_panel is not None and permission and request.user.has_perm(permission):
                fieldsets.append(("Recent usage", {"fields": ("recent_usage",)}))
        if obj is not None and not self.has_change_permission(request, obj):
            secret = ("external_api_key", "clear_external_api_key")
            fieldsets = [(name, {**options, "fields": tuple(
                f for f in options["fields"] if f not in secret) + (("external_api_key_state",) if any(
                    f in secret for f in options["fields"]) else ())}) for name, options in fieldsets]
        return fieldsets

    @admin.display(description="limits in force")
    def limits(self, obj: Model) -> str:
        info = limits_info(obj)
        return f"{info['text']}; serves {', '.join(info['served_endpoints'])}"

    @admin.display(description="external API key")
    def external_api_key_state(self, obj: Model) -> str:
        return "set" if obj.external_api_key else "not set"

    @admin.display(description="cold start")
    def cold_start(self, obj: Model) -> str:
        """The fleet's measured placement → ready time, as the last reconcile pass stored it."""
        state = getattr(obj, "fleet_state", None)
        if state is None or state.cold_start_s is None:
            return "not measured yet (none of its replicas has become ready): the cluster's default cold start applies"
        n = state.cold_start_samples
        return f"about {state.cold_start_s:.0f} s (the 90th percentile of its last {n} start{'s' if n != 1 else ''})"

    @admin.display(description="warm ahead now")
    def warm_ahead(self, obj: Model) -> str:
        state = getattr(obj, "fleet_state", None)
        return (state.warm_ahead if state and state.warm_ahead else "nothing: it runs what its demand and schedule ask")

    def get_readonly_fields(self, request, obj=None):
        fields = tuple(super().get_readonly_fields(request, obj)) + ("weights_context_length", "limits",
                                                                     "cold_start", "warm_ahead", "live",
                                                                     "recent_usage")
        if obj is not None and engine_code.is_code_weights(obj.weights) and not engine_code.allowed(request.user):
            fields += ("weights",)
        return fields

    def get_form(self, request, obj=None, change=False, **kwargs):
        kwargs["form"] = ModelAdminForm if engine_code.allowed(request.user) else WeightsGuardForm
        return super().get_form(request, obj, change=change, **kwargs)

    @admin.display(description="where it stands")
    def live(self, obj: Model) -> str:
        panel = type(self).live_panel
        return panel(obj) if panel is not None and obj.pk else "-"

    @admin.display(description="recent usage")
    def recent_usage(self, obj: Model) -> str:
        panel = type(self).usage_panel
        return panel(obj) if panel is not None and obj.pk else "-"

    def get_changelist_instance(self, request):
        """The list, with each shown model's live state read once for the page."""
        changelist = super().get_changelist_instance(request)
        rows = type(self).live_rows
        if rows is not None:
            shown = list(changelist.result_list)  # evaluated once: the rows the page renders
            found = rows([m.pk for m in shown])
            for m in shown:
                m.live_row = found.get(m.pk)
            changelist.result_list = shown
        return changelist

    @admin.display(description="name", ordering="name")
    def name_cut(self, obj: Model) -> str:
        return cut(obj.name)

    @admin.display(description="aliases", ordering="aliases")
    def aliases_cut(self, obj: Model) -> str:
        return cut(obj.aliases, 24)

    @admin.display(description="replicas")
    def scaling(self, obj: Model) -> str:
        """Min–max, and whether it is scaled from zero on demand."""
        return f"{obj.min_replicas}–{obj.max_replicas}" + (", on demand" if obj.on_demand else "")

    @admin.display(description="served")
    def served_at(self, obj: Model) -> str:
        return "external" if obj.is_external else "here"

    @admin.display(description="last used (idle for)")
    def last_used(self, obj: Model) -> str:
        row = getattr(obj, "live_row", None)
        last = row["last_used_at"] if row is not None else obj.replicas.aggregate(t=Max("last_used_at"))["t"]
        if last is None:
            return "never told"
        idle = (timezone.now() - last).total_seconds()
        return f"{last:%Y-%m-%d %H:%M:%S} ({idle / 60:.0f} min)" if idle >= 120 else f"{last:%H:%M:%S} ({idle:.0f} s)"

    @admin.display(description="state")
    def state(self, obj: Model) -> str:
        """Ready of desired, and the dashboard's word for it (ready, loading, failed…)."""
        row = getattr(obj, "live_row", None)
        if row is not None:
            return cut(row["state"], 30)
        state = getattr(obj, "fleet_state", None)
        return f"{state.desired} desired" if state else "-"

    @admin.display(description="reason")
    def reason(self, obj: Model) -> str:
        """The last pass's word on it (or why its newest replica failed), cut."""
        row = getattr(obj, "live_row", None)
        if row is not None:
            return cut(row["reason"], 60)
        state = getattr(obj, "fleet_state", None)
        return cut(state.reason if state else "", 60)


@admin.register(ClusterSettings)
class ClusterSettingsAdmin(admin.ModelAdmin):
    """The singleton. Stopping and starting go through confirmation pages (the flag is
    live: stopping frees every GPU); the ``stop_cluster``/``start_cluster`` callables are
    injected by ``fleet`` (catalog imports nothing from it)."""

    list_display = ("__str__", "stopped", "time_zone", "default_idle_timeout_s", "cold_start_timeout_s",
                    "rate_limits_without_redis", "admission_wait_s")
    readonly_fields = ("stopped", "stopped_at", "stopped_by")
    change_form_template = "admin/catalog/clustersettings/change_form.html"
    stop_cluster = None
    start_cluster = None

    def get_urls(self):
        return [
            path("stop/", self.admin_site.admin_view(self.stop_view), name="cluster-stop"),
            path("start/", self.admin_site.admin_view(self.start_view), name="cluster-start"),
        ] + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = {**(extra_context or {}), "can_stop": can(request.user, Act.STOP_CLUSTER),
                         "can_start": can(request.user, Act.START_CLUSTER)}
        return super().change_view(request, object_id, form_url, extra_context)

    def _confirm(self, request, act, title, explanation, button, action, danger):
        back = "../1/change/"
        if not can(request.user, act):
            raise PermissionDenied
        if request.method == "POST":
            changed = action(request)
            self.message_user(request, f"{title}: {'done' if changed else 'nothing to do'}.")
            return HttpResponseRedirect(back)
        context = {**self.admin_site.each_context(request), "title": title, "explanation": explanation,
                   "button": button, "back": back, "danger": danger}
        return TemplateResponse(request, "admin/catalog/clustersettings/confirm.html", context)

    def stop_view(self, request):
        ClusterSettings.get_solo()
        return self._confirm(
            request, Act.STOP_CLUSTER, "Stop the cluster",
            "Every replica will drain and stop, freeing every GPU, and /v1/ will answer 503 system_stopped "
            "until the cluster is started again. No model's definition changes.",
            "Yes, stop the cluster", lambda r: type(self).stop_cluster(r.user.get_username()), True)

    def start_view(self, request):
        ClusterSettings.get_solo()
        return self._confirm(
            request, Act.START_CLUSTER, "Start the cluster", "Models will be placed again as the catalog asks.",
            "Start", lambda r: type(self).start_cluster(), False)

    def has_add_permission(self, request) -> bool:
        return super().has_add_permission(request) and not ClusterSettings.objects.exists()

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Benchmark)
class BenchmarkAdmin(admin.ModelAdmin):
    list_display = ("model", "profile", "max_concurrency", "slo_ttft_p95_ms", "slo_tpot_p95_ms", "measured_at")
    list_select_related = ("model", "profile")
    readonly_fields = ("measured_at", "steps")
