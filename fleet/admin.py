from django.contrib import admin

from fleet.models import Agent, Gpu, ModelState, Replica, ScalingEvent


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    readonly_fields = ("index", "uuid", "name", "memory_total_mib", "memory_used_mib")
    can_delete = False


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ("name", "connected", "cordoned", "address", "cpu_cores", "memory_mib", "gpu_count", "last_seen_at", "version")
    list_filter = ("connected", "cordoned")
    search_fields = ("name", "address")
    readonly_fields = ("token_prefix", "connected", "connected_since", "last_seen_at", "version", "address",
                       "cpu_cores", "memory_mib", "generation", "session")
    exclude = ("token_sha256",)
    inlines = [GpuInline]
    actions = ["cordon", "uncordon", "drain"]

    @admin.display(description="GPUs")
    def gpu_count(self, obj: Agent) -> int:
        return obj.gpus.count()

    @admin.action(description="Cordon (place nothing new)")
    def cordon(self, request, queryset):
        n = queryset.update(cordoned=True)
        self.message_user(request, f"{n} agent(s) cordoned.")

    @admin.action(description="Uncordon")
    def uncordon(self, request, queryset):
        n = queryset.update(cordoned=False)
        self.message_user(request, f"{n} agent(s) uncordoned.")

    @admin.action(description="Drain (cordon and move replicas to other agents)")
    def drain(self, request, queryset):
        from fleet.operations import drain_agent

        moved = sum(drain_agent(agent, request.user.get_username()) for agent in queryset)
        self.message_user(request, f"{queryset.count()} agent(s) drained: {moved} replica(s) moving away.")


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = ("id", "model", "agent", "state", "port", "gpu_indices", "state_changed_at", "last_used_at", "reason")
    list_filter = ("state", "agent", "model")
    list_select_related = ("model", "agent")
    # Not the engine key: only the gateway and the replica's agent may know it.
    readonly_fields = [f.name for f in Replica._meta.fields if f.name != "engine_key"]

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


# The cluster-settings admin (catalog) stops and starts through fleet's operations.
def _wire_cluster_admin() -> None:
    from catalog.admin import ClusterSettingsAdmin
    from fleet.operations import start_cluster, stop_cluster

    ClusterSettingsAdmin.stop_cluster = staticmethod(stop_cluster)
    ClusterSettingsAdmin.start_cluster = staticmethod(start_cluster)


_wire_cluster_admin()
