"""``llmgw changes``: what changed in the cluster lately (``llmgw.changes``), newest first."""

from __future__ import annotations

from rich.markup import escape

from llmgw import changes as timeline
from llmgw.cli.output import OK, USAGE, console, print_table, when, write_json

HELP = ("What changed lately, newest first: operators' acts from the CLI, dashboard and REST API (stop, start, "
        "cordon, drain, evict, restarts), admin edits, scaling steps, failed replicas, keys, teams, agents and "
        "models added. Exit 0, 2 for a bad --since or --kind.")


def add_arguments(parser) -> None:
    parser.add_argument("--since", default="24h", help="how far back: a number and s, m, h or d (default 24h)")
    parser.add_argument("--kind", default="", help=f"only these kinds, comma-separated: {', '.join(timeline.KINDS)}")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(options, stdout, stderr) -> int:
    try:
        since = timeline.parse_since(options["since"])
    except ValueError as exc:
        stderr.write(f"--since: {exc}\n")
        return USAGE
    kinds = frozenset(k.strip() for k in options["kind"].split(",") if k.strip()) or None
    unknown = sorted((kinds or set()) - set(timeline.KINDS))
    if unknown:
        stderr.write(f"--kind: unknown {', '.join(unknown)} (kinds: {', '.join(timeline.KINDS)})\n")
        return USAGE
    period = timeline.recent(since, kinds=kinds)
    if options["json"]:
        write_json(stdout, {"since": period.since.isoformat(), "truncated": period.truncated,
                            "changes": [c.as_json() for c in period.changes]})
        return OK
    out = console(stdout)
    # Names are operators' and clients' words: never rich markup.
    rows = [[when(c.at), c.kind, escape(c.who) or "—", escape(c.what), escape(c.detail)] for c in period.changes]
    print_table(out, f"Changes since {when(period.since)}", ["at", "kind", "who", "what", "detail"], rows,
                empty="nothing changed.")
    if period.truncated:
        out.print(f"(more than {timeline.PER_SOURCE} of one kind: the oldest are left out; narrow --since or --kind)")
    return OK
