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
    if settings.LLMGW_AGENT_ROUTE_GRACE_S < 2 * settings.LLMGW_HEARTBEAT_INTERVAL_S:
        problems.append(Warning(
            f"LLMGW_AGENT_ROUTE_GRACE ({settings.LLMGW_AGENT_ROUTE_GRACE_S:g} s) is shorter than two agent heartbeats "
            f"(LLMGW_HEARTBEAT_INTERVAL, {settings.LLMGW_HEARTBEAT_INTERVAL_S:g} s): the replicas of a healthy agent "
            "would drop out of routing between its heartbeats and requests get 503 'agent silent'.",
            hint="Raise LLMGW_AGENT_ROUTE_GRACE, or set LLMGW_HEARTBEAT_INTERVAL to the agents' --heartbeat-s if "
                 "they heartbeat faster.", id="llmgw.W003"))
    if settings.LLMGW_LEADER_LEASE_S < 2 * settings.LLMGW_LEADER_RENEW_S:
        problems.append(Error(
            "LLMGW_LEADER_LEASE must be at least twice LLMGW_LEADER_RENEW, or one slow renewal hands the lease "
            "to a standby while the leader lives.", id="llmgw.E005"))
    if settings.DATABASE_URL and not settings.LLMGW_SECRET_KEY_SET:
        problems.append(Error(
            "Production mode (LLMGW_DATABASE_URL) needs LLMGW_SECRET_KEY: every control plane of the cluster must "
            "share one secret, or workers reject the tasks other machines' web processes sign (BadSignature) and "
            "admin sessions do not carry across web processes.",
            hint="Make one with `python -c 'import secrets; print(secrets.token_urlsafe(50))'` and put the same "
                 "LLMGW_SECRET_KEY=... in /etc/llmgw/llmgw.env (mode 600) on every control-plane machine.",
            id="llmgw.E004"))
    if not settings.LLMGW_GATEWAY_AUTH:
        problems.append(Warning("LLMGW_GATEWAY_AUTH is off: /v1/ serves anyone who can reach it.", id="llmgw.W002"))
    return problems
