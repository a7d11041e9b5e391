from django.contrib import admin

from catalog.models import ClusterSettings, Model, Profile


@admin.register(Profile)
class ProfileAdmin(admin.ModelAdmin):
    list_display = ("name", "engine", "gpus_needed", "gpu_memory_mib", "cpu_cores", "memory_mib", "readiness_path")
    list_filter = ("engine",)
    search_fields = ("name", "command")


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ("name", "aliases", "profile", "min_replicas", "max_replicas", "on_demand", "served_at", "status")
    list_filter = ("on_demand", "profile")
    search_fields = ("name", "aliases", "weights")
    list_select_related = ("profile", "fleet_state")
    fieldsets = (
        (None, {"fields": ("name", "aliases")}),
        ("Served here", {"fields": ("profile", "weights")}),
        ("Scaling", {"fields": ("min_replicas", "max_replicas", "on_demand", "idle_timeout_s")}),
        ("Served elsewhere (external)", {"fields": ("external_base_url", "external_api_key"), "classes": ("collapse",)}),
    )

    @admin.display(description="served")
    def served_at(self, obj: Model) -> str:
        return "external" if obj.is_external else "here"

    @admin.display(description="status")
    def status(self, obj: Model) -> str:
        state = getattr(obj, "fleet_state", None)
        if state is None:
            return "-"
        return f"{state.desired} desired — {state.reason}"[:200]


@admin.register(ClusterSettings)
class ClusterSettingsAdmin(admin.ModelAdmin):
    """The singleton. Stopping and starting go through confirmation pages (the flag is
    live: stopping frees every GPU); the ``stop_cluster``/``start_cluster`` callables are
    injected by ``fleet`` (catalog imports nothing from it)."""

    list_display = ("__str__", "stopped", "time_zone", "default_idle_timeout_s", "cold_start_timeout_s")
    readonly_fields = ("stopped", "stopped_at", "stopped_by")
    change_form_template = "admin/catalog/clustersettings/change_form.html"
    stop_cluster = None
    start_cluster = None

    def get_urls(self):
        from django.urls import path

        return [
            path("stop/", self.admin_site.admin_view(self.stop_view), name="cluster-stop"),
            path("start/", self.admin_site.admin_view(self.start_view), name="cluster-start"),
        ] + super().get_urls()

    def _confirm(self, request, title, explanation, button, action, danger):
        from django.http import HttpResponseRedirect
        from django.template.response import TemplateResponse

        back = "../1/change/"
        if not self.has_change_permission(request):
            from django.core.exceptions import PermissionDenied

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
            request, "Stop the cluster",
            "Every replica will drain and stop, freeing every GPU, and /v1/ will answer 503 system_stopped "
            "until the cluster is started again. No model's definition changes.",
            "Yes, stop the cluster", lambda r: type(self).stop_cluster(r.user.get_username()), True)

    def start_view(self, request):
        ClusterSettings.get_solo()
        return self._confirm(
            request, "Start the cluster", "Models will be placed again as the catalog asks.",
            "Start", lambda r: type(self).start_cluster(), False)

    def has_add_permission(self, request) -> bool:
        return not ClusterSettings.objects.exists()

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
