"""Reports from simulation runs: per model and in total, a baseline comparison, a plot.

A report's ``data`` is plain JSON (``--json``): the same trace, catalog, fleet and config
give the same ``data``, byte for byte. Wall-clock timings live outside it (``wall_s``).
Times are seconds of simulated time from the trace's start unless a key says otherwise.

With a trace that carries prefixes (:mod:`fleet.simulation.traces`, issue 17) — and only
then, so a report without them is as it always was — ``data["trace"]["prefixes"]`` counts
the distinct prefix ids, ``totals`` and every model row that routed requests with a prefix gain
``prefix_requests`` (requests routed to a replica with a prefix), ``prefix_hits`` (those
whose replica had it cached), ``prefix_hit_rate`` (hits / prefix_requests, None without
any) and ``prefill_tokens_saved`` (the prefix tokens of the hits: prefill skipped), and a
model row also its ``routing_policy`` and ``prefix_cache_slots``.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fleet.simulation.catalog import describe_fleet
from fleet.simulation.engine import RawResult


@dataclass
class Report:
    data: dict
    #: (t_s, GPUs held) at every change, and (t_s, replicas placing/starting/ready) per model.
    gpu_timeline: list[tuple[float, int]] = field(default_factory=list)
    replica_timelines: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    wall_s: float = 0.0
    plan_wall_s: float = 0.0

    @property
    def totals(self) -> dict:
        return self.data["totals"]

    def model(self, name: str) -> dict:
        """The row of model ``name`` (KeyError if it had neither requests nor replicas)."""
        for row in self.data["models"]:
            if row["name"] == name:
                return row
        raise KeyError(name)


def _pct(values: np.ndarray, q: float, scale: float = 1.0, digits: int = 1) -> float | None:
    return None if len(values) == 0 else round(float(np.percentile(values, q)) * scale, digits)


def _share(part: int, whole: int) -> float | None:
    return None if whole == 0 else round(part / whole, 6)


def build_report(raw: RawResult) -> Report:
    """Summarise one run (see the module docstring for units)."""
    sim = raw.sim
    hours = 1 / 3600.0
    rows = []
    all_ttft = []
    all_hold: list[float] = []
    steps = []
    tot = dict.fromkeys(("requests", "served", "held", "rejected_unservable", "rejected_timeout", "cut_off",
                         "slo_met", "placements", "evictions", "idle_stops", "scale_downs", "oscillations"), 0)
    gpu_s = replica_s = 0.0
    prefixed = sim.trace.has_prefixes
    pre_tot = dict.fromkeys(("prefix_requests", "prefix_hits", "prefill_tokens_saved"), 0)
    for m in sim.models:
        ttft = np.frombuffer(m.ttft, dtype=np.float64) if len(m.ttft) else np.empty(0)
        hold = np.asarray(m.hold_s, dtype=np.float64)
        all_ttft.append(ttft)
        all_hold += m.hold_s
        counts = {"requests": m.requests, "served": m.served, "held": m.held_count,
                  "rejected_unservable": m.rejected_unservable, "rejected_timeout": m.rejected_timeout,
                  "cut_off": m.cut_off, "slo_met": m.slo_met, "placements": m.placements,
                  "evictions": m.evictions, "idle_stops": m.idle_stops, "scale_downs": m.scale_downs,
                  "oscillations": m.oscillations}
        for k, v in counts.items():
            tot[k] += v
        gpu_s += m.gpu_s
        replica_s += m.replica_s
        for t, before, after, why in m.steps:
            steps.append({"t_s": round(t, 3), "model": m.spec.name, "from": before, "to": after, "why": why})
        if not m.requests and not m.placements:
            continue
        p95 = _pct(ttft, 95, 1000)
        rows.append({
            "name": m.spec.name,
            "on_demand": m.spec.on_demand,
            **{k: v for k, v in counts.items() if k != "slo_met"},
            "hold_p50_s": _pct(hold, 50), "hold_max_s": round(float(hold.max()), 1) if len(hold) else None,
            "ttft_p50_ms": _pct(ttft, 50, 1000), "ttft_p95_ms": p95,
            "slo_ttft_ms": m.spec.latency.slo_ttft_ms,
            "p95_within_slo": None if p95 is None else p95 <= m.spec.latency.slo_ttft_ms,
            "slo_attainment": _share(m.slo_met, m.requests),
            "gpu_hours": round(m.gpu_s * hours, 3),
            "max_replicas": m.max_active,
            "scale_steps": len(m.steps),
        })
        if prefixed and m.prefix_routed:
            rows[-1].update(_prefix_counts(m.prefix_routed, m.prefix_hits, m.prefill_tokens_saved),
                            routing_policy=m.spec.routing_policy, prefix_cache_slots=m.spec.prefix_cache_slots)
            pre_tot["prefix_requests"] += m.prefix_routed
            pre_tot["prefix_hits"] += m.prefix_hits
            pre_tot["prefill_tokens_saved"] += m.prefill_tokens_saved
    rows.sort(key=lambda r: (-r["requests"], r["name"]))
    steps.sort(key=lambda s: (s["t_s"], s["model"]))
    ttft = np.concatenate(all_ttft) if all_ttft else np.empty(0)
    hold = np.asarray(all_hold, dtype=np.float64)
    slo_met = tot.pop("slo_met")
    totals = {
        **tot,
        "unfinished": sim.unfinished,
        "unknown_model": sim.unknown_model,
        "after_end": sim.after_end,
        "hold_p50_s": _pct(hold, 50), "hold_p95_s": _pct(hold, 95),
        "hold_max_s": round(float(hold.max()), 1) if len(hold) else None,
        "ttft_p50_ms": _pct(ttft, 50, 1000), "ttft_p95_ms": _pct(ttft, 95, 1000),
        "slo_attainment": _share(slo_met, tot["requests"]),
        "gpu_hours": round(gpu_s * hours, 3),
        "replica_hours": round(replica_s * hours, 3),
        "peak_gpus": max(n for _, n in sim.gpu_timeline),
        "scale_steps": len(steps),
        "scale_ups": sum(1 for s in steps if s["to"] > s["from"]),
        "passes": sim.passes,
        "mean_models_per_pass": round(sim.pass_models / sim.passes, 2) if sim.passes else 0,
    }
    if prefixed:
        totals.update(_prefix_counts(*pre_tot.values()))
    gpus = sum(a.gpus for a in sim.fleet)
    arrived = np.bincount((sim.trace.t_s[sim.trace.t_s <= sim.end] // 3600).astype(np.int64),
                          minlength=len(sim.met_by_hour))
    hours = [h for h in range(len(arrived)) if arrived[h]]
    data = {
        "label": sim.label,
        "trace": {"description": sim.trace.description, "requests": len(sim.trace),
                  "start": sim.start.isoformat(), "models": len(sim.trace.names),
                  **({"prefixes": len(sim.trace.prefix_ids)} if prefixed else {})},
        "catalog": {"models": len(sim.models), "on_demand": sum(1 for m in sim.models if m.spec.on_demand),
                    "with_windows": sum(1 for m in sim.models if m.spec.windows),
                    "time_zone": sim.tz},
        "fleet": {"agents": len(sim.fleet), "gpus": gpus, "summary": describe_fleet(sim.fleet)},
        "duration_s": sim.end,
        "reconcile_interval_s": sim.config.reconcile_interval_s,
        "totals": totals,
        "models": rows,
        "scale_steps": steps,
        "evictions_and_idle_stops": [e for e in sim.events if e["kind"] != "surplus"],
        # (hours since the start, share of that hour's arrivals that met their SLO)
        "slo_by_hour": [hours, [round(sim.met_by_hour[h] / int(arrived[h]), 6) for h in hours]],
    }
    return Report(
        data=data,
        gpu_timeline=list(sim.gpu_timeline),
        replica_timelines={m.spec.name: list(m.timeline) for m in sim.models if m.placements},
        wall_s=raw.wall_s,
        plan_wall_s=sim.plan_wall_s,
    )


def _prefix_counts(routed: int, hits: int, saved_tokens: int) -> dict:
    """The prefix-cache keys of a row or the totals (module docstring)."""
    return {"prefix_requests": routed, "prefix_hits": hits, "prefix_hit_rate": _share(hits, routed),
            "prefill_tokens_saved": saved_tokens}


def compare(ours: Report, baseline: Report, same_within: float = 0.005) -> dict:
    """How ``ours`` stands against ``baseline`` on GPU-hours and SLO attainment, with a
    sentence for people: attainments within ``same_within`` (half a point) count as the
    same. On a fleet without GPUs GPU-hours do not apply: the cost compared is replica-hours
    on CPUs, and the sentence says so (``"unit"``: ``"GPU-hours"`` or ``"CPU replica-hours"``)."""
    a, b = ours.totals, baseline.totals
    ga, gb = a["gpu_hours"], b["gpu_hours"]
    sa, sb = a["slo_attainment"] or 0.0, b["slo_attainment"] or 0.0
    cpu_only = ours.data["fleet"].get("gpus") == 0 and baseline.data["fleet"].get("gpus") == 0
    unit = "CPU replica-hours" if cpu_only else "GPU-hours"
    ca, cb = (a["replica_hours"], b["replica_hours"]) if cpu_only else (ga, gb)
    saved = (1 - ca / cb) if cb else 0.0
    gpus = f"{abs(saved) * 100:.0f}% {'fewer' if saved >= 0 else 'more'} {unit} ({ca:,.0f} vs {cb:,.0f})"
    if cpu_only:
        gpus += " (the fleet has no GPUs: GPU-hours do not apply)"
    if abs(sa - sb) <= same_within:
        sentence = f"about the same SLO attainment ({sa:.1%} vs {sb:.1%}) with {gpus}"
    else:
        sentence = (f"{gpus} for {abs(sa - sb) * 100:.1f} points {'higher' if sa > sb else 'lower'} SLO attainment "
                    f"({sa:.1%} vs {sb:.1%})")
    return {
        "unit": unit, "cost": ca, "baseline_cost": cb, "cost_saved": round(saved, 4),
        "gpu_hours": ga, "baseline_gpu_hours": gb,
        "gpu_hours_saved": None if cpu_only else round(saved, 4),
        "slo_attainment": sa, "baseline_slo_attainment": sb, "attainment_delta": round(sa - sb, 6),
        "baseline_fleet": baseline.data["fleet"]["summary"],
        "sentence": f"{ours.data['label']} vs {baseline.data['label']}: {sentence}",
    }


def _steps(timeline: list[tuple[float, int]], end: float) -> tuple[np.ndarray, np.ndarray]:
    t = np.array([p[0] for p in timeline] + [end]) / 3600.0
    y = np.array([p[1] for p in timeline] + [timeline[-1][1]])
    return t, y


def plot(report: Report, path: str | Path, baseline: Report | None = None, top: int = 8) -> Path:
    """Save a PNG: GPUs held over time (and the baseline's), and replicas over time of the
    ``top`` models by requests. Returns the path. Uses matplotlib's Agg canvas directly
    (no pyplot, no display)."""
    # lazy: matplotlib takes a second to import and only plot() draws.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    end = report.data["duration_s"]
    fig = Figure(figsize=(11, 7.5), dpi=100)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 1.3]})
    t, y = _steps(report.gpu_timeline, end)
    ax1.step(t, y, where="post", label=f"{report.data['label']} ({report.totals['gpu_hours']:,.0f} GPU-h)",
             color="tab:blue")
    if baseline is not None:
        tb, yb = _steps(baseline.gpu_timeline, end)
        ax1.step(tb, yb, where="post", color="tab:gray", linestyle="--",
                 label=f"{baseline.data['label']} ({baseline.totals['gpu_hours']:,.0f} GPU-h)")
    ax1.axhline(report.data["fleet"]["gpus"], color="tab:red", linewidth=0.8, linestyle=":",
                label=f"fleet: {report.data['fleet']['gpus']} GPUs")
    ax1.set_ylabel("GPUs held")
    ax1.legend(loc="upper left", fontsize=8)
    ax1.set_title(f"{textwrap.shorten(report.data['trace']['description'], 140)}\n"
                  f"SLO attainment {report.totals['slo_attainment'] or 0:.1%}"
                  + (f" (baseline {baseline.totals['slo_attainment'] or 0:.1%})" if baseline else ""),
                  fontsize=9)
    names = [row["name"] for row in report.data["models"] if row["name"] in report.replica_timelines][:top]
    for name in names:
        tm, ym = _steps(report.replica_timelines[name], end)
        ax2.step(tm, ym, where="post", label=name, linewidth=1)
    others = [n for n in report.replica_timelines if n not in names]
    if others:
        deltas: dict[float, int] = {}
        for n in others:
            previous = 0
            for when, v in report.replica_timelines[n]:
                deltas[when] = deltas.get(when, 0) + v - previous
                previous = v
        points = sorted(deltas)
        total = np.cumsum([deltas[p] for p in points]).tolist()
        to, yo = _steps(list(zip(points, total)), end)
        ax2.step(to, yo, where="post", color="black", linewidth=1, alpha=0.6,
                 label=f"{len(others)} other models (sum)")
    ax2.set_ylabel("replicas")
    ax2.set_xlabel("hours since the trace's start")
    ax2.legend(loc="upper left", fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path)
    return path

