from datetime import timedelta

from django import forms
from django.contrib import admin
from django.db.models import Count, Sum
from django.urls import reverse
from django.utils import timezone

from catalog.admin import SecretFieldsAdminMixin
from gateway.api import expiry_denial
from gateway.models import ApiKey, UsageRecord
from llmgw import tokens
from llmgw.permissions import Act, can
from llmgw.shown_once import shown_once_response


@admin.register(ApiKey)
class ApiKeyAdmin(SecretFieldsAdminMixin, admin.ModelAdmin):
    """Keys are created here like anywhere else; the clear key is shown once, on the page
    answering the save of a new one (never in a message: those travel in a cookie)."""

    list_display = ("name", "prefix", "state", "models_allowed", "expires_at", "revoked_at", "created_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "prefix")
    secret_fields = ("sha256",)
    readonly_fields = ("prefix", "revoked_at", "created_at")
    filter_horizontal = ("allowed_models",)
    actions = ["revoke"]

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


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ("at", "key", "model_name", "replica_id", "status", "upstream_status", "stream", "prompt_tokens",
                    "completion_tokens", "ttft_ms", "total_ms")
    list_filter = (PeriodFilter, "status", "stream", "model_name", "key")
    list_select_related = ("key",)
    date_hierarchy = "at"
    change_list_template = "admin/gateway/usagerecord/change_list.html"

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
        response.context_data["totals_by_model"] = qs.values("model_name").annotate(**fields).order_by("-requests")
        return response
