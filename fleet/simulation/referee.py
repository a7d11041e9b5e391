"""The simulator as a referee (issue 18): one trace, one fleet, every policy.

:func:`referee` runs the same trace through llmgw with all its rules, llmgw without its
arrival profiles (what predictive warmth costs and buys), llmgw as it was without any of
them (reactive: no pre-warm, no prediction, no ramp), a static fleet sized for the peak, and the peers' policies (:mod:`fleet.simulation.peers`: Ollama/llama-swap-like,
Kubernetes HPA+KEDA-like), and :func:`policy_rows` and :func:`plot_policies` put them side
by side: GPU-hours, SLO attainment, TTFT, held and rejected requests, scale steps and
oscillations, and the GPUs each held over time.

Everything shares the trace, the catalog as the operator wrote it (each policy reads it
with its own means: :meth:`~fleet.simulation.peers.Controller.prepare`), the fleet (the
static baseline grows its own, as it always has), the latency model and the shell: the
same engines, gateway and report path. ``history`` — requests before the trace, from which
llmgw's on-demand models learn their arrival profiles — is read by llmgw with all its
rules only; nothing else here learns.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fleet.simulation import baseline as static_baseline
from fleet.simulation.catalog import AgentSpec, Catalog
from fleet.simulation.config import SimConfig
from fleet.simulation.engine import Simulator
from fleet.simulation.peers import PEERS
from fleet.simulation.report import Report, build_report
from fleet.simulation.traces import Trace

#: The policies, in the order they are run and shown.
POLICIES = ("llmgw", "llmgw-no-prediction", "llmgw-reactive", "static", "ollama", "hpa")
LABELS = {
    "llmgw": "llmgw",
    "llmgw-no-prediction": "llmgw, no prediction",
    "llmgw-reactive": "llmgw, reactive",
    "static": "static, sized for the peak",
    "ollama": "Ollama/llama-swap-like",
    "hpa": "Kubernetes HPA+KEDA-like",
}
DESCRIPTIONS = {
    "llmgw": "all rules: schedules placed ahead by measured cold starts, on-demand models kept warm on "
             "learned arrival profiles, load scaling ahead of a rising load",
    "llmgw-no-prediction": "llmgw with pre-warm and the ramp but no arrival profiles: on-demand models start "
                           "when asked for",
    "llmgw-reactive": "llmgw without pre-warm, prediction or the ramp (as it was before they were built): on "
                      "demand, schedules at their start, load scaling on queues",
    "static": "every model at the replicas its own peak needs (70% of its slots), never stopped; the fleet "
              "grows until they fit",
    "ollama": "load on request, unload after keep_alive (the idle timeout), least recently used unloaded when "
              "full; no schedules, no scaling; kept-running models pinned at their peak's count",
    "hpa": "replicas from utilisation (target 70%, HPA's default windows), from zero and back with KEDA "
           "(cooldown: the idle timeout), schedules as cron floors at their start; no eviction",
}


@dataclass
class Entry:
    """One policy's run: its key (:data:`POLICIES`), label and report."""

    key: str
    label: str
    report: Report
    cpu_s: float = 0.0


def reactive(config: SimConfig) -> SimConfig:
    """``config`` with every warm-before-demand rule off (llmgw as it was before)."""
    return replace(config, prewarm_windows=False, predictive_warmth=False, ramp_scaling=False)


def referee(catalog: Catalog, fleet: tuple[AgentSpec, ...], trace: Trace, config: SimConfig = SimConfig(),
            history: Trace | None = None, policies: Sequence[str] = POLICIES,
            progress: Callable[[str], None] | None = None) -> list[Entry]:
    """Run ``trace`` through each of ``policies`` (keys of :data:`POLICIES`), in order;
    ``progress`` is told each policy's label as it starts. Raises ValueError for an unknown
    key."""
    import time  # lazy: only for the CPU figures

    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)} (known: {', '.join(POLICIES)})")
    plain = reactive(config)
    out = []
    for key in policies:
        label = LABELS[key]
        if progress:
            progress(label)
        began = time.process_time()
        if key == "llmgw":
            report = build_report(Simulator(catalog, fleet, trace, config, label, history=history).run())
        elif key == "llmgw-no-prediction":
            report = build_report(Simulator(catalog, fleet, trace, replace(config, predictive_warmth=False),
                                            label).run())
        elif key == "llmgw-reactive":
            report = build_report(Simulator(catalog, fleet, trace, plain, label).run())
        elif key == "static":
            report = static_baseline(catalog, fleet, trace, plain)
            report.data["label"] = label
        else:
            controller = PEERS[key]()
            prepared = controller.prepare(catalog, trace)
            report = build_report(Simulator(prepared, fleet, trace, plain, label, controller=controller).run())
        out.append(Entry(key, label, report, time.process_time() - began))
    return out


#: (totals key, label, kind) of the policies' table: kind "%" for shares.
ROWS = [
    ("gpu_hours", "GPU-hours", ""), ("slo_attainment", "SLO attainment", "%"),
    ("ttft_p50_ms", "TTFT p50 (ms)", ""), ("ttft_p95_ms", "TTFT p95 (ms)", ""),
    ("held", "held for a cold start", ""), ("rejected", "rejected (unservable, timed out)", ""),
    ("scale_steps", "scale steps", ""), ("oscillations", "oscillations", ""),
    ("peak_gpus", "peak GPUs held", ""), ("placements", "placements", ""), ("evictions", "evictions", ""),
]


def totals(entry: Entry) -> dict:
    """The entry's totals with ``rejected`` (unservable + timed out) added."""
    t = dict(entry.report.totals)
    t["rejected"] = t["rejected_unservable"] + t["rejected_timeout"]
    return t


def policy_rows(entries: Sequence[Entry]) -> list[dict]:
    """One JSON-ready row per policy: key, label, what it does, fleet, and the table's figures."""
    rows = []
    for e in entries:
        t = totals(e)
        rows.append({"policy": e.key, "label": e.label, "rules": DESCRIPTIONS[e.key],
                     "fleet": e.report.data["fleet"]["summary"], **{k: t[k] for k, _, _ in ROWS}})
    return rows


def ahead(ours: Entry, other: Entry) -> dict:
    """Whether ``ours`` is ahead of ``other`` on both axes: fewer GPU-hours *and* a higher
    SLO attainment; with the two differences."""
    a, b = totals(ours), totals(other)
    fewer = a["gpu_hours"] < b["gpu_hours"]
    better = (a["slo_attainment"] or 0) > (b["slo_attainment"] or 0)
    return {"other": other.key, "gpu_hours_ratio": round(a["gpu_hours"] / b["gpu_hours"], 4) if b["gpu_hours"] else None,
            "slo_points": round(((a["slo_attainment"] or 0) - (b["slo_attainment"] or 0)) * 100, 3),
            "fewer_gpu_hours": fewer, "higher_slo": better, "ahead_on_both": fewer and better}


def _steps(timeline: list[tuple[float, int]], end: float) -> tuple[np.ndarray, np.ndarray]:
    t = np.array([p[0] for p in timeline] + [end]) / 3600.0
    y = np.array([p[1] for p in timeline] + [timeline[-1][1]])
    return t, y


def plot_policies(entries: Sequence[Entry], path: str | Path) -> Path:
    """Save a PNG of the GPUs each policy held over time (top) and its SLO attainment per
    hour (bottom); returns the path. matplotlib's Agg canvas, no display."""
    # lazy: matplotlib takes a second to import and only plotting needs it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    first = entries[0].report
    end = first.data["duration_s"]
    fig = Figure(figsize=(11, 7.5), dpi=100)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1.4, 1]})
    styles = {"llmgw": ("tab:blue", "-", 2.0), "llmgw-no-prediction": ("tab:purple", (0, (4, 2)), 1.0),
              "llmgw-reactive": ("tab:cyan", (0, (1, 2)), 1.2),
              "static": ("tab:gray", "--", 1.0), "ollama": ("tab:orange", "-", 1.0), "hpa": ("tab:green", "-", 1.0)}
    fleet_gpus = first.data["fleet"]["gpus"]
    top = fleet_gpus * 1.25
    for e in entries:
        color, style, width = styles.get(e.key, ("black", "-", 1.0))
        t, y = _steps(e.report.gpu_timeline, end)
        t_ = totals(e)
        above = f" (up to {int(y.max())}, above the chart)" if y.max() > top else ""
        ax1.step(t, np.minimum(y, top), where="post", color=color, linestyle=style, linewidth=width,
                 label=f"{e.label}: {t_['gpu_hours']:,.0f} GPU-h, SLO {t_['slo_attainment'] or 0:.2%}{above}")
        hours, attained = e.report.data.get("slo_by_hour", ([], []))
        if hours:
            ax2.plot(np.array(hours) + 0.5, np.array(attained) * 100, color=color, linestyle=style,
                     linewidth=width, marker=".")
    ax1.axhline(fleet_gpus, color="tab:red", linewidth=0.8, linestyle=":", label=f"the fleet: {fleet_gpus} GPUs")
    ax1.set_ylim(0, top * 1.02)
    ax1.set_ylabel("GPUs held")
    ax1.legend(loc="upper left", fontsize=7)
    ax1.set_title(textwrap.shorten(first.data["trace"]["description"], 140), fontsize=9)
    ax2.set_ylabel("SLO attainment per hour (%)")
    ax2.set_xlabel("hours since the trace's start")
    fig.tight_layout()
    fig.savefig(path)
    return path
