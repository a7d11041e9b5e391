"""System checks: configuration mistakes reported by name when a process starts."""

from django.conf import settings
from django.core.checks import Error, Warning, register


@register()
def llmgw_settings(app_configs, **kwargs):
    problems = []
    q = settings.Q_CLUSTER
    if q.get("retry", 0) <= q.get("timeout", 0):
        problems.append(Error("Q_CLUSTER retry must exceed timeout, or a slow task runs twice.", id="llmgw.E001"))
    for name in ("RECONCILE_INTERVAL", "WATCH_INTERVAL", "WATCH_FAST_INTERVAL", "HEARTBEAT_INTERVAL",
                 "USAGE_FLUSH_INTERVAL"):
        if getattr(settings, f"LLMGW_{name}_S") < 0.01:
            problems.append(Error(f"LLMGW_{name} must be at least 10ms.", id="llmgw.E003"))
    if settings.LLMGW_DRAIN_GRACE_S <= 0:
        problems.append(Error("LLMGW_DRAIN_GRACE must be positive.", id="llmgw.E002"))
    if settings.LLMGW_AGENT_ROUTE_GRACE_S > settings.LLMGW_AGENT_LOST_AFTER_S:
        problems.append(Warning(
            "LLMGW_AGENT_ROUTE_GRACE is longer than LLMGW_AGENT_LOST_AFTER: replicas of a silent agent would stay "
            "routable after they are declared lost.", id="llmgw.W001"))
    if not settings.LLMGW_GATEWAY_AUTH:
        problems.append(Warning("LLMGW_GATEWAY_AUTH is off: /v1/ serves anyone who can reach it.", id="llmgw.W002"))
    return problems
