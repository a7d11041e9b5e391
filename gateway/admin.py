from datetime import timedelta

from django import forms
from django.contrib import admin
from django.db.models import Count, OuterRef, Q, Subquery, Sum
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from catalog.admin import ModelAdmin, SecretFieldsAdminMixin, WideListMixin, admin_link, cut, instant
from catalog.models import Model
from gateway import tenant_usage
from gateway.api import expiry_denial
from gateway.models import LIMIT_FIELDS, ApiKey, ModelBudget, Team, UsageRecord
from llmgw import tokens
from llmgw.permissions import Act, can
from llmgw.shown_once import shown_once_response


_LIMITS_HELP = ("Empty: no limit. The stricter of a key's and its team's limits applies; minutes are fixed "
                "60 s windows, days and months UTC calendar days and months.")


def usage_panel(kind: str, obj) -> str:
    """The change page's "usage now": a table of each limit's use (``tenant_usage.usage``)."""
    if obj is None or obj.pk is None:
        return "—"
    found = tenant_usage.usage(kind, obj)
    rows = [(name.replace("_", " "), "", entry) for name, entry in found["limits"].items()]
    rows += [(name.replace("_", " "), model, entry) for model, budgets in found["model_budgets"].items()
             for name, entry in budgets.items()]
    if not rows:
        return "No limits."
    body = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (
        (name, model or "every model", "—" if e["used"] is None else f"{e['used']:,}", f"{e['limit']:,}",
         tenant_usage.CONCURRENCY_ELSEWHERE if e["remaining"] is None else f"{e['remaining']:,}",
         instant(e["resets_at"]) if e["resets_at"] else "—") for name, model, e in rows))
    note = f" — {found['note']}" if found.get("note") else ""
    return format_html('<table class="tenant-usage"><thead><tr><th>limit</th><th>model</th><th>used</th>'
                       "<th>of</th><th>remaining</th><th>resets at</th></tr></thead><tbody>{}</tbody></table>"
                       "<p>Source: {}{}</p>", body, found["source"], note)


class BudgetInline(admin.TabularInline):
    """Budgets for single models, edited with their owner: they are part of it (changing a
    key's budgets is changing the key), so the owner's permissions apply."""

    model = ModelBudget
    fields = ("model", "tokens_per_day", "tokens_per_month")
    extra = 0
    owner_model = ""

    def _owner_perm(self, request, what: str) -> bool:
        return request.user.has_perm(f"gateway.{what}_{self.owner_model}")

    def has_view_permission(self, request, obj=None) -> bool:
        return self._owner_perm(request, "view") or self._owner_perm(request, "change")

    def has_add_permission(self, request, obj=None) -> bool:
        return self._owner_perm(request, "change")

    def has_change_permission(self, request, obj=None) -> bool:
        return self._owner_perm(request, "change")

    def has_delete_permission(self, request, obj=None) -> bool:
        return self._owner_perm(request, "change")


class TeamBudgetInline(BudgetInline):
    fk_name = "team"
    owner_model = "team"
    verbose_name = verbose_name_plural = "token budgets for single models"


class KeyBudgetInline(BudgetInline):
    fk_name = "key"
    owner_model = "apikey"
    verbose_name = verbose_name_plural = "token budgets for single models"


@admin.register(Team)
class TeamAdmin(WideListMixin, admin.ModelAdmin):
    """Teams: keys sharing limits, a priority class and a fair-share weight; the change page
    shows where the team stands now."""

    list_display = ("name", "priority", "weight", "members", "limits", "created_at")
    list_filter = ("priority",)
    search_fields = ("name",)
    readonly_fields = ("usage_now", "created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("name", "priority", "weight")}),
        ("Limits", {"fields": LIMIT_FIELDS, "description": _LIMITS_HELP}),
        ("Usage now", {"fields": ("usage_now",)}),
        ("Dates", {"fields": ("created_at", "updated_at")}),
    )
    inlines = [TeamBudgetInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(members_count=Count("keys"))

    @admin.display(description="members", ordering="members_count")
    def members(self, obj: Team) -> int:
        return obj.members_count

    @admin.display(description="limits")
    def limits(self, obj: Team) -> str:
        return tenant_usage.limits_text(obj.limit_fields())

    @admin.display(description="usage now")
    def usage_now(self, obj: Team) -> str:
        return usage_panel("team", obj)


@admin.register(ApiKey)
class ApiKeyAdmin(WideListMixin, SecretFieldsAdminMixin, admin.ModelAdmin):
    """Keys are created here like anywhere else; the clear key is shown once, on the page
    answering the save of a new one (never in a message: those travel in a cookie). Its
    team, priority, limits and model budgets (on the change page) are part of the key."""

    list_display = ("name", "prefix", "state", "team", "priority", "limits", "models_allowed", "expires_at",
                    "revoked_at", "created_at")
    list_filter = ("revoked_at", "team", "priority")
    list_select_related = ("team",)
    search_fields = ("name", "prefix")
    secret_fields = ("sha256",)
    readonly_fields = ("prefix", "revoked_at", "created_at", "usage_now")
    filter_horizontal = ("allowed_models",)
    actions = ["revoke"]
    fieldsets = (
        (None, {"fields": ("name", "prefix", "allowed_models", "expires_at", "revoked_at", "created_at")}),
        ("Team and priority", {"fields": ("team", "priority")}),
        ("Limits", {"fields": LIMIT_FIELDS, "description": _LIMITS_HELP}),
        ("Usage now", {"fields": ("usage_now",)}),
    )

    def get_inlines(self, request, obj):
        # A new key's page answers with its clear key: budgets are added on its change page.
        return [KeyBudgetInline] if obj is not None else []

    def get_fieldsets(self, request, obj=None):
        if obj is None:
            return [fs for fs in self.fieldsets if fs[0] != "Usage now"]
        return self.fieldsets

    @admin.display(description="limits")
    def limits(self, obj: ApiKey) -> str:
        return tenant_usage.limits_text(obj.limit_fields())

    @admin.display(description="usage now")
    def usage_now(self, obj: ApiKey) -> str:
        return usage_panel("key", obj)

    def has_add_permission(self, request) -> bool:
        return can(request.user, Act.CREATE_KEY)

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        user = request.user

        class ExpiryGuardForm(form):
            """An expiry moved earlier is a revocation, an expired key made valid again an issue."""

            def clean_expires_at(self):
                value = self.cleaned_data.get("expires_at")
                if self.instance.pk:
                    act = ApiKey.objects.get(pk=self.instance.pk).expiry_act(value)
                    if act is not None and not can(user, act):
                        raise forms.ValidationError(expiry_denial(act))
                return value

        return ExpiryGuardForm

    def has_revoke_permission(self, request) -> bool:
        return can(request.user, Act.REVOKE_KEY)

    @admin.display(description="models")
    def models_allowed(self, obj: ApiKey) -> str:
        names = [m.name for m in obj.allowed_models.all()]
        return ", ".join(names) if names else "all"

    def save_model(self, request, obj, form, change):
        if not change:
            clear = tokens.new_token("key")
            obj.prefix, obj.sha256 = tokens.token_prefix(clear), tokens.token_hash(clear)
            super().save_model(request, obj, form, change)
            obj._clear_key = clear  # for response_add, on this object only: never stored
            return
        super().save_model(request, obj, form, change)

    def response_add(self, request, obj, post_url_continue=None):
        clear = getattr(obj, "_clear_key", "")
        if not clear:
            return super().response_add(request, obj, post_url_continue)
        return shown_once_response(
            request, self.admin_site, title=f"API key {obj.name} created",
            explanation=f"The key for {obj.name} is below.", secrets=[(obj.name, clear)],
            back=reverse("admin:gateway_apikey_change", args=[obj.pk]),
            usage="Clients send it as Authorization: Bearer <key>.")

    @admin.action(description="Revoke (applies within a fraction of a second)", permissions=["revoke"])
    def revoke(self, request, queryset):
        for key in queryset:
            key.revoke()
        self.message_user(request, f"{queryset.count()} key(s) revoked.")


class PeriodFilter(admin.SimpleListFilter):
    title = "period"
    parameter_name = "period"

    def lookups(self, request, model_admin):
        return [("1h", "last hour"), ("24h", "last 24 hours"), ("7d", "last 7 days"), ("30d", "last 30 days")]

    def queryset(self, request, queryset):
        spans = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7), "30d": timedelta(days=30)}
        if self.value() in spans:
            return queryset.filter(at__gte=timezone.now() - spans[self.value()])
        return queryset


def _ms(value: float | None) -> str:
    """A duration in milliseconds, rounded to the millisecond ("-" for none)."""
    return "-" if value is None else f"{value:,.0f} ms"


@admin.register(UsageRecord)
class UsageRecordAdmin(WideListMixin, admin.ModelAdmin):
    """One row a request: when, the key (linked), the model by its catalog name (linked
    while it exists; long names cut, the whole in the title), the endpoint, the replica
    (linked), the status the client got (and the engine's own where it differs), tokens and
    times rounded to the millisecond. Read-only."""

    list_display = ("when", "key_link", "model_link", "endpoint", "replica_link", "status_shown", "tokens", "ttft",
                    "total", "overhead")
    list_filter = (PeriodFilter, "status", "stream", "path", "model_name", "key")
    list_select_related = ("key",)
    search_fields = ("model_name", "path", "key__name")
    date_hierarchy = "at"
    change_list_template = "admin/gateway/usagerecord/change_list.html"
    fields = ("at", "key_link", "team_id", "model_link", "endpoint", "replica_link", "status", "upstream_status",
              "prompt_tokens", "completion_tokens", "ttft", "total", "overhead")
    readonly_fields = fields

    def get_queryset(self, request):
        # The catalog model by the name the record keeps, in the same query: no link once deleted.
        model_pk = Model.objects.filter(name=OuterRef("model_name")).values("pk")[:1]
        return super().get_queryset(request).annotate(model_pk=Subquery(model_pk))

    @admin.display(description="at", ordering="at")
    def when(self, obj: UsageRecord) -> str:
        return instant(obj.at)

    @admin.display(description="key", ordering="key__name")
    def key_link(self, obj: UsageRecord) -> str:
        return admin_link("admin:gateway_apikey_change", obj.key_id, obj.key.name if obj.key else "(none)", 24)

    @admin.display(description="model", ordering="model_name")
    def model_link(self, obj: UsageRecord) -> str:
        return admin_link("admin:catalog_model_change", getattr(obj, "model_pk", None), obj.model_name)

    @admin.display(description="endpoint", ordering="path")
    def endpoint(self, obj: UsageRecord) -> str:
        """The path asked for, and "streamed" for a streamed answer."""
        return format_html("{}{}", cut(obj.path, 28), " (streamed)" if obj.stream else "")

    @admin.display(description="tokens in / out")
    def tokens(self, obj: UsageRecord) -> str:
        return f"{obj.prompt_tokens if obj.prompt_tokens is not None else '-'} / " \
               f"{obj.completion_tokens if obj.completion_tokens is not None else '-'}"

    @admin.display(description="replica", ordering="replica_id")
    def replica_link(self, obj: UsageRecord) -> str:
        # Replicas that ended are pruned after the usage records they served (the same
        # retention, and they ended later), so the page is there unless its agent was deleted.
        if obj.replica_id is None:
            return "-"
        return admin_link("admin:fleet_replica_change", obj.replica_id, f"r{obj.replica_id}")

    @admin.display(description="status", ordering="status")
    def status_shown(self, obj: UsageRecord) -> str:
        if obj.upstream_status is not None and obj.upstream_status != obj.status:
            return f"{obj.status} (upstream {obj.upstream_status})"
        return str(obj.status)

    @admin.display(description="TTFT", ordering="ttft_ms")
    def ttft(self, obj: UsageRecord) -> str:
        return _ms(obj.ttft_ms)

    @admin.display(description="total", ordering="total_ms")
    def total(self, obj: UsageRecord) -> str:
        return _ms(obj.total_ms)

    @admin.display(description="overhead", ordering="overhead_ms")
    def overhead(self, obj: UsageRecord) -> str:
        return _ms(obj.overhead_ms)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def changelist_view(self, request, extra_context=None):
        response = super().changelist_view(request, extra_context)
        try:
            qs = response.context_data["cl"].queryset
        except (AttributeError, KeyError):
            return response
        fields = dict(requests=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
        response.context_data["totals_by_key"] = qs.values("key__name").annotate(**fields).order_by("-requests")
        response.context_data["totals_by_model"] = totals_by_model(
            qs.values("model_name").annotate(**fields).order_by("-requests"), Model.known_names())
        return response


#: The totals' and charts' name for records of a model no catalog model is called.
UNKNOWN_MODEL = "unknown model"


def totals_by_model(rows, known: set[str]) -> list[dict]:
    """The usage list's totals per model (``rows``: ``{"model_name", "requests", "prompt",
    "completion"}``, most requests first), with every name outside ``known`` (the catalog's
    names and aliases: a client's invented ``gpt-4o``) summed in one :data:`UNKNOWN_MODEL`
    row, so a client cannot add rows; still most requests first. The list's filter by model
    name still finds each."""
    out: list[dict] = []
    unknown = {"model_name": UNKNOWN_MODEL, "requests": 0, "prompt": 0, "completion": 0, "unknown": True}
    for row in rows:
        if row["model_name"] in known:
            out.append(row)
        else:
            for field in ("requests", "prompt", "completion"):
                unknown[field] += row[field] or 0
    if unknown["requests"]:
        out.append(unknown)
        out.sort(key=lambda r: -r["requests"])
    return out


#: How many of a model's newest usage records its page lists.
RECENT_USAGE_ROWS = 10


def model_usage_panel(model: Model) -> str:
    """A model's page, "recent usage" (HTML, escaped): the last 24 hours' requests, errors
    (status 400 and up), prompt and completion tokens and TTFT p95 (of the newest 10,000),
    then its newest :data:`RECENT_USAGE_ROWS` records, and a link to all of them."""
    records = UsageRecord.objects.filter(model_name=model.name)
    day = records.filter(at__gte=timezone.now() - timedelta(days=1))
    totals = day.aggregate(requests=Count("id"), errors=Count("id", filter=Q(status__gte=400)),
                           prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    ttfts = sorted(day.exclude(ttft_ms=None).values_list("ttft_ms", flat=True)[:10_000])
    p95 = _ms(ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))]) if ttfts else "-"
    rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                            "</tr>", (
        (instant(r.at),
         admin_link("admin:gateway_apikey_change", r.key_id, r.key.name if r.key else "(none)", 24),
         cut(r.path, 28), r.status, f"{r.prompt_tokens or 0} / {r.completion_tokens or 0}", _ms(r.ttft_ms),
         _ms(r.total_ms)) for r in records.select_related("key")[:RECENT_USAGE_ROWS]))
    listing = reverse("admin:gateway_usagerecord_changelist") + "?" + urlencode({"model_name": model.name})
    return format_html(
        '<div class="llmgw-usage"><p id="usage-24h">Last 24 hours: {} requests, {} errors, {} prompt and {} '
        "completion tokens, TTFT p95 {}.</p>"
        '<table><thead><tr><th>at</th><th>key</th><th>endpoint</th><th>status</th><th>tokens in / out</th>'
        '<th>TTFT</th><th>total</th></tr></thead><tbody>{}</tbody></table><p><a href="{}">Every usage record of this '
        "model</a></p></div>",
        f"{totals['requests']:,}", f"{totals['errors']:,}", f"{totals['prompt'] or 0:,}",
        f"{totals['completion'] or 0:,}", p95, rows, listing)


# The catalog's admin (which imports nothing from the gateway) shows a model's usage from here.
ModelAdmin.usage_panel = staticmethod(model_usage_panel)
ModelAdmin.usage_panel_permission = "gateway.view_usagerecord"
