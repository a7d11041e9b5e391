"""Why a model has the replicas it has: demand, idleness, windows, scaling, failures.

Plain data for ``llmgw explain``, the REST API and the dashboard.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from django.utils import timezone

from catalog.models import Benchmark, ClusterSettings, Model, limits_info
from catalog.schedules import active_window, describe, next_start
from fleet.models import ModelState, QueueReport, Replica, ScalingEvent
from fleet.ops import cluster as read
from fleet.planning import routing, warmth
from fleet.planning.scaling import RAMP_COLD_START_FACTOR, RAMP_TARGET, ScalingPolicy, Trend, ramp_applies
from fleet.protocol import error_summary
from fleet.states import ReplicaState

#: An agent's own cold-start estimate is shown when it differs from the model's by this share
#: or more, from at least this many of its starts.
AGENT_DIFFERS = 0.25
AGENT_MIN_STARTS = 3


def _ago(when):
    if when is None:
        return None
    return round((timezone.now() - when).total_seconds(), 1)


def _bound_in_words() -> str:
    """The load bound of ``fleet.planning.routing`` (``load_slack``) in words."""
    slack = routing.load_slack(0)
    words = f"unless that one already runs {slack} more requests than the least loaded"
    if routing.BOUND_FACTOR > 0:
        # load_slack grows past BOUND_SLACK once ⌈factor · least⌉ does: least > slack / factor.
        past = math.floor(routing.BOUND_SLACK / routing.BOUND_FACTOR)
        words += f" ({routing.BOUND_FACTOR:.0%} more once the least loaded runs over {past})"
    # The order is the key's rendezvous order, the same in every web process.
    return words + ": then it spills to the next replica in the key's order"


def routing_info(model: Model) -> dict:
    """How the gateway chooses among ``model``'s replicas (``fleet.planning.routing``),
    JSON-ready: ``policy`` (the catalog's ``routing_policy``), ``applies`` (False for an
    external model: its requests go to its base URL, there is nothing to choose) and
    ``text``, the rule in a sentence with the load bound's figures from
    ``routing.load_slack``. A stored value that is no policy routes as least-loaded (as
    ``routing.choose`` does), and the text says so."""
    policy = model.routing_policy
    if model.is_external:
        text = "does not apply — an external model: every request goes to its base URL"
    elif policy == routing.PREFIX_AFFINITY:
        text = ("prefix-affinity — a prompt goes to the replica that most likely holds its prefix in its cache, "
                f"{_bound_in_words()}; a prompt too short to have a prefix goes by its session "
                "(X-Session-Id, else user) if it has one, else least-loaded")
    elif policy == routing.SESSION:
        text = ("session — one session's requests stay on one replica (by X-Session-Id, else user, else the "
                f"prompt's prefix), {_bound_in_words()}")
    elif policy == routing.LEAST_LOADED:
        text = "least-loaded — each request goes to the replica with the fewest requests in flight (ties take turns)"
    else:
        text = f"least-loaded — {policy!r} is no routing policy, so the fewest requests in flight decide"
    return {"policy": policy, "applies": not model.is_external, "text": text}


def cold_start_info(model: Model, cluster: ClusterSettings) -> dict:
    """The model's measured cold start on its profile (docs/architecture.md, R11),
    JSON-ready: ``estimate_s`` (p90 of recent starts, else the cluster's default),
    ``samples`` (0: the default), ``text``, and ``by_agent``: agents whose own p90 (from
    :data:`AGENT_MIN_STARTS` starts or more) differs by :data:`AGENT_DIFFERS` or more."""
    rows = list(Replica.objects.filter(model=model, profile_id=model.profile_id, cold_start_s__isnull=False)
                .order_by("-id").values_list("agent__name", "cold_start_s")[:200])
    start = warmth.cold_start([seconds for _, seconds in rows], float(cluster.default_cold_start_s))
    per_agent: dict[str, list[float]] = defaultdict(list)
    for agent, seconds in rows:
        if len(per_agent[agent]) < warmth.RECENT_STARTS:
            per_agent[agent].append(seconds)
    by_agent = []
    for agent, starts in sorted(per_agent.items()):
        own = warmth.cold_start(starts, start.estimate_s)
        if own.samples >= AGENT_MIN_STARTS and abs(own.estimate_s - start.estimate_s) >= AGENT_DIFFERS * start.estimate_s:
            by_agent.append({"agent": agent, "estimate_s": own.estimate_s, "samples": own.samples,
                             "text": own.words()})
    return {"estimate_s": start.estimate_s, "samples": start.samples, "measured": start.measured,
            "text": start.words(), "lead_s": round(warmth.lead_s(start), 1), "by_agent": by_agent}


def warmth_info(model: Model, state: ModelState | None, cluster: ClusterSettings, windows: list) -> dict:
    """Warm before demand for ``model`` (docs/architecture.md, R11), JSON-ready:
    ``cold_start`` (:func:`cold_start_info`); ``now``, what the last pass kept warm ahead of
    demand and why ("" for nothing) and whether its replica is ``speculative``; ``prewarm``
    (the next window, when its replicas are placed); ``prediction`` (the hours it is usually
    asked for, and the run that holds now, if any); ``ramp`` (whether load scaling steps
    ahead of a rising load for it, and the load's trend). Each part says when the cluster
    has the rule switched off."""
    now = timezone.now()
    tz = ZoneInfo(cluster.time_zone)
    start_info = cold_start_info(model, cluster)
    start = warmth.ColdStart(start_info["estimate_s"], start_info["samples"])
    lead = warmth.lead_s(start)
    upcoming = next_start(windows, now, cluster.time_zone) if windows else None
    prewarm = {"enabled": cluster.prewarm_windows, "next_window": None, "starts_at": None, "placed_from": None}
    if upcoming:
        prewarm.update(next_window=describe(upcoming[1]), starts_at=upcoming[0].isoformat(),
                       placed_from=(upcoming[0] - timedelta(seconds=lead)).isoformat() if cluster.prewarm_windows
                       else None)
    profile = warmth.ArrivalProfile.from_json(state.arrivals) if state else warmth.ArrivalProfile()
    current = None
    if model.on_demand and cluster.predictive_warmth:
        idle = float(model.idle_timeout_s or cluster.default_idle_timeout_s)
        found = warmth.predict(profile, now, tz, lead, idle)
        current = found.words if found else None
    prediction = {"enabled": cluster.predictive_warmth, "applies": model.on_demand and not model.is_external,
                  "usually_asked": warmth.describe_profile(profile) or None,
                  "weeks_observed": round(max(profile.seen), 1) if not profile.empty else 0.0, "now": current}
    scaling = ScalingPolicy(scale_up_after_s=float(cluster.scale_up_after_s), ramp=cluster.ramp_scaling)
    trend = Trend.from_json(state.trend) if state else None
    applies = ramp_applies(start.estimate_s, scaling)
    if not cluster.ramp_scaling:
        text = "off for this cluster"
    elif applies:
        text = (f"on: a replica takes {start.words()}, at least {RAMP_COLD_START_FACTOR:g} × the "
                f"{cluster.scale_up_after_s} s scale-up delay, so a load rising towards {RAMP_TARGET:.0%} of its "
                "replicas' capacity within a cold start adds one ahead of the queue")
    else:
        text = (f"does not apply: a replica takes {start.words()}, under {RAMP_COLD_START_FACTOR:g} × the "
                f"{cluster.scale_up_after_s} s scale-up delay (scaling on the queue is soon enough)")
    ramp = {"enabled": cluster.ramp_scaling, "applies": applies, "text": text,
            "trend": ({"in_flight": round(trend.level, 1), "per_min": round(trend.slope_per_s * 60, 2),
                       "at": trend.at.isoformat(), "rising_since": trend.rising_since.isoformat()
                       if trend.rising_since else None} if trend is not None else None)}
    return {"cold_start": start_info, "now": state.warm_ahead if state else "",
            "speculative": bool(state and state.speculative), "prewarm": prewarm, "prediction": prediction,
            "ramp": ramp}


def _second(when: datetime | None) -> str | None:
    """An instant as ISO 8601 to the second (what people read), None for none."""
    return when.replace(microsecond=0).isoformat() if when else None


def last_failure(model: Model, at: read.Moment) -> dict | None:
    """The model's newest failed replica while it still matters, JSON-ready: ``line``, the
    meaningful line of its error (``fleet.protocol.error_summary``: the agent's words and
    the log line that names the trouble, not the log's last line), ``at`` (when it failed,
    ISO 8601 to the second), ``replica`` (its id), ``agent`` (its agent's name) and ``log``
    (the whole error: the agent's words and the engine's last log lines). None when no
    replica of it failed, or once the model is healthy again: a replica became ready after
    the failure and is ready now, on an agent heard from."""
    failed = (Replica.objects.filter(model=model, state=ReplicaState.FAILED.value).select_related("agent")
              .order_by("-state_changed_at", "-id").first())
    if failed is None:
        return None
    healed = (Replica.objects.ready().filter(model=model, agent__in=at.heard_agents(),
                                             ready_at__gt=failed.state_changed_at).exists())
    if healed:
        return None
    return {"line": error_summary(failed.error) or "failed (no error reported)", "at": _second(failed.state_changed_at),
            "replica": failed.pk, "agent": failed.agent.name, "log": failed.error}


def explain_model(model: Model) -> dict:
    """Everything known about why ``model`` runs what it runs (JSON-ready; times ISO 8601,
    durations in seconds). ``queued_at_gateway``: requests waiting in the web processes'
    admission queues for it, as the reconciler counts them (fresh ``QueueReport`` rows).
    ``routing``: its routing policy and the rule in words (:func:`routing_info`). Each
    replica says whether it is ``outdated`` (docs/architecture.md, R10) and, in ``note``,
    "outdated, being replaced". ``ready``, the replicas' states and ``reason`` before any
    pass are the read model's (``fleet.ops.cluster``), as in ``status`` and the dashboard."""
    at = read.moment()
    state = ModelState.objects.filter(model=model).first()
    replicas = list(model.replicas.select_related("agent").order_by("-id")[:20])
    hashes = read.spec_hashes([model.pk])
    shown = {r.pk: at.replica_state(r) for r in replicas}
    used = [r.last_used_at for r in replicas if r.last_used_at]
    last_used = max(used) if used else None
    cluster = ClusterSettings.get_solo()
    windows = [w.as_window() for w in model.schedule_windows.all()]
    window = active_window(windows, timezone.now(), cluster.time_zone) if windows else None
    bench = Benchmark.objects.filter(model=model, profile_id=model.profile_id).first()
    events = list(ScalingEvent.objects.filter(model=model)[:5])
    failure = last_failure(model, at)
    stopped_since = timezone.now() - read.RECENTLY_STOPPED
    stopped = [r for r in replicas if shown[r.pk] == ReplicaState.STOPPED and r.state_changed_at >= stopped_since]
    return {
        "model": model.name,
        "schedule": [describe(w) for w in windows],
        "window_now": describe(window) if window else None,
        "load_extra_replicas": state.extra_replicas if state else 0,
        "measured_per_replica": bench.max_concurrency if bench else None,
        "observed_per_replica": state.observed_per_replica if state else None,
        "queued_at_gateway": QueueReport.objects.filter(model=model).fresh(timezone.now()).waiting_by_model().get(
            model.pk, 0),
        "scaling_events": [{"at": e.at.isoformat(), "from": e.from_replicas, "to": e.to_replicas, "why": e.reason}
                           for e in events],
        # The meaningful line of the newest failure, when it failed and its whole error; all
        # None once the model is healthy again (a replica ready since).
        "last_failure": failure["line"] if failure else None,
        "last_failure_at": failure["at"] if failure else None,
        "last_failure_replica": failure["replica"] if failure else None,
        "last_failure_log": failure["log"] if failure else None,
        "on_demand": model.on_demand,
        "external": model.is_external,
        # Without {api_key} its engines serve anyone who reaches their ports (docs/architecture.md,
        # "Security": engine keys).
        "engine_protected": model.profile.protects_engine if model.profile_id and not model.is_external else None,
        "limits": limits_info(model),  # token limits in force and served endpoints
        "routing": routing_info(model),
        # Warm before demand (R11): cold starts, pre-warm, prediction, the ramp.
        "warmth": warmth_info(model, state, cluster, windows) if not model.is_external else None,
        "min_replicas": model.min_replicas,
        "max_replicas": model.max_replicas,
        "desired": state.desired if state else 0,
        "ready": read.ready_by_model(at, [model.pk]).get(model.pk, 0),
        "wanted_at": state.wanted_at.isoformat() if state and state.wanted_at else None,
        "last_used_at": last_used.isoformat() if last_used else None,
        "idle_for_s": _ago(last_used),
        "unservable": bool(state and state.unservable),
        "reason": read.model_reason(state),
        "replicas": [
            {"id": r.pk, "agent": r.agent.name, "state": shown[r.pk].value, "port": r.port, "reason": r.reason,
             "error": error_summary(r.error), "outdated": read.replica_outdated(r, hashes),
             "note": read.replica_note(r, hashes)}
            for r in replicas if shown[r.pk] != ReplicaState.STOPPED
        ],
        # Stopped within read.RECENTLY_STOPPED, with why: the planner's reason and, for an engine
        # its agent stopped on its own after a restart, the agent's words.
        "recently_stopped": [
            {"id": r.pk, "agent": r.agent.name, "stopped_at": r.state_changed_at.isoformat(), "reason": r.reason}
            for r in stopped[:5]
        ],
    }


def _when(iso: str | None, none: str = "—") -> str:
    """An ISO instant from :func:`explain_model` for people, to the second, in UTC, as the
    CLI writes every time (``llmgw.cli.output.when``): ``2026-12-04 18:23:33 UTC``; ``none``
    for None or ""."""
    if not iso:
        return none
    value = datetime.fromisoformat(iso)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


#: How many of the failed engine's last log lines :func:`explain_text` shows.
FAILURE_LOG_LINES = 15


def explain_text(info: dict) -> str:
    """:func:`explain_model`'s answer for people, as ``llmgw explain`` prints it and the
    model's admin page shows it: one line a fact, times to the second, newline-terminated."""
    out: list[str] = []
    window = f"; the window in force: {info['window_now']}" if info.get("window_now") else ""
    out.append(f"{info['model']}: {info['ready']} ready of {info['desired']} desired"
               f" (min {info['min_replicas']}, max {info['max_replicas']}{', on demand' if info['on_demand'] else ''}"
               f"{window})")
    out.append(f"  why:         {info['reason']}")
    out.append(f"  limits:      {info['limits']['text']}")
    out.append(f"  endpoints:   {', '.join(info['limits']['served_endpoints'])}")
    out.append(f"  routing:     {info['routing']['text']}")
    if info.get("engine_protected") is False:
        out.append("  UNPROTECTED: its profile starts engines without {api_key}: anyone who reaches an engine's"
                   " port can use it around the gateway")
    if info["on_demand"]:
        out.append(f"  wanted at:   {_when(info['wanted_at'], none='not wanted (no request within its idle timeout)')}")
    idle = "never used" if info["idle_for_s"] is None else f"idle for {info['idle_for_s']:.0f} s"
    out.append(f"  last used:   {_when(info['last_used_at'])} ({idle})")
    if info["schedule"]:
        out.append(f"  schedule:    {'; '.join(info['schedule'])} — now: {info['window_now'] or 'outside every window'}")
    if info["measured_per_replica"]:
        out.append(f"  measured:    {info['measured_per_replica']} concurrent per replica within its SLO")
    elif info["observed_per_replica"]:
        out.append(f"  capacity:    {info['observed_per_replica']} running per replica while requests queued"
                   " (learned; a benchmark would measure it)")
    warm = info.get("warmth")
    if warm:
        cold = warm["cold_start"]
        agents = "; ".join(f"{a['agent']}: {a['text']}" for a in cold["by_agent"])
        out.append(f"  cold start:  {cold['text']}" + (f" (differs on {agents})" if agents else ""))
        if warm["now"]:
            out.append(f"  warm ahead:  {warm['now']}" + (" — on free room only, evicted first" if warm["speculative"]
                                                         else ""))
        pre = warm["prewarm"]
        if pre["next_window"]:
            when = (f"placed from {_when(pre['placed_from'])} ({cold['lead_s']:.0f} s ahead)" if pre["enabled"]
                    else "pre-warm off for this cluster: placed at its start")
            out.append(f"  next window: {pre['next_window']} at {_when(pre['starts_at'])}, {when}")
        else:
            out.append("  pre-warm:    no schedule window to place ahead of"
                       + ("" if pre["enabled"] else " (and off for this cluster)"))
        pred = warm["prediction"]
        if not pred["applies"]:
            out.append("  predicted:   only for on-demand models (this one runs its min)")
        elif not pred["enabled"]:
            out.append("  predicted:   off for this cluster")
        else:
            usual = pred["usually_asked"] or (f"no habit yet ({pred['weeks_observed']:g} weeks observed; "
                                              "an hour asked for four weeks running is one)")
            out.append(f"  usually:     {usual}")
            if pred["now"]:
                out.append(f"  predicted:   {pred['now']}")
        out.append(f"  ramp:        {warm['ramp']['text']}")
    for e in info["scaling_events"]:
        out.append(f"  scaled:      {_when(e['at'])} {e['from']} → {e['to']}: {e['why']}")
    if info["last_failure"]:
        out.append(f"  last failure: {_when(info.get('last_failure_at'))} (replica {info.get('last_failure_replica')}):"
                   f" {info['last_failure']}")
        log = (info.get("last_failure_log") or "").splitlines()[1:]  # the first line is in the line above
        out.extend("    " + line for line in log[-FAILURE_LOG_LINES:] if line.strip())
    for r in info["replicas"]:
        out.append(f"  replica {r['id']:>5} on {r['agent']:<16} {r['state']:<11} "
                   + (f"[{r['note']}] " if r.get("note") else "") + r["reason"]
                   + (f" — {r['error']}" if r["error"] else ""))
    for r in info.get("recently_stopped", []):
        out.append(f"  stopped {r['id']:>5} on {r['agent']:<16} {_when(r['stopped_at'])}: {r['reason']}")
    return "\n".join(out) + "\n"
