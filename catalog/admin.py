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
    list_display = ("__str__", "stopped", "time_zone", "default_idle_timeout_s", "cold_start_timeout_s")

    def has_add_permission(self, request) -> bool:
        return not ClusterSettings.objects.exists()

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
