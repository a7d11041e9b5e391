"""``llmgw teams create|list|show|set|delete|budget``: teams of API keys, their limits,
priority, fair-share weight and model budgets."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Count

from gateway import tenant_usage
from gateway.models import Priority, Team
import llmgw.cli.limit_options as lo
from llmgw.cli.output import FAILED, OK, USAGE, console, print_table, table, write_json

HELP = ("Manage teams of API keys: create, list, show (members, usage now), set (limits, priority, weight; "
        "'none' clears a limit), delete (its keys stay, without a team), budget (tokens for one model). "
        "Exit 0 ok, 1 no such team (or, for create, one of that name exists), 2 bad usage (a bad value, an "
        "unknown model).")


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=["create", "list", "show", "set", "delete", "budget"],
                        help="create, list, show, set (limits, weight), delete or budget (per model) a team")
    parser.add_argument("name", nargs="?", help="the team's name (all but list)")
    lo.add_limit_arguments(parser)
    parser.add_argument("--weight", default=None,
                        help="share of the tokens when a model is full and teams wait (relative; default 1)")
    parser.add_argument("--model", default=None, help="budget: the model the budget is for")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(options, stdout, stderr) -> int:
    action, name = options["action"], options["name"]
    try:
        if action == "list":
            return _list(options, stdout)
        if not name:
            raise lo.UsageError(f"teams {action} needs the team's NAME")
        if action == "create":
            return _create(name, options, stdout, stderr)
        team = Team.objects.filter(name=name).first()
        if team is None:
            stderr.write(f"no team called {name!r}\n")
            return FAILED
        if action == "show":
            return _show(team, options, stdout)
        if action == "set":
            return _set(team, options, stdout)
        if action == "budget":
            return _budget(team, options, stdout)
        return _delete(team, options, stdout)
    except lo.UsageError as exc:
        stderr.write(f"{exc}\n")
        return USAGE


def _weight(options) -> dict:
    text = options.get("weight")
    if text is None:
        return {}
    try:
        return {"weight": float(text)}
    except ValueError:
        raise lo.UsageError(f"--weight must be a number, not {text!r}") from None


def _changes(options) -> dict:
    return {**lo.limits_given(options), **lo.priority_given(options, clearable=False), **_weight(options)}


def team_json(team: Team, usage: dict | None = None) -> dict:
    """A team for scripts (``--json``)."""
    members = team.members_count if hasattr(team, "members_count") else team.keys.count()
    out = {"name": team.name, "priority": Priority(team.priority).label, "weight": team.weight,
           "limits": lo.limits_json(team), "model_budgets": lo.budgets_of(team), "members": members}
    if usage is not None:
        out["usage"] = usage
    return out


def _line(team: Team) -> str:
    line = (f"priority {Priority(team.priority).label}, weight {team.weight:g}, "
            f"limits {tenant_usage.limits_text(team.limit_fields())}")
    budgets = lo.budgets_text(team)
    return line + (f", budgets {budgets}" if budgets else "")


def _create(name: str, options, stdout, stderr) -> int:
    if options.get("model"):
        raise lo.UsageError("--model is for `teams budget`")
    changes = _changes(options)
    if Team.objects.filter(name=name).exists():
        stderr.write(f"a team named {name!r} exists (`llmgw teams set {name} …` changes it)\n")
        return FAILED
    team = Team(name=name, **changes)
    lo.checked(team)
    team.save()
    if options["json"]:
        write_json(stdout, team_json(team))
    else:
        stdout.write(f"created team {team.name}: {_line(team)}\n")
    return OK


def _list(options, stdout) -> int:
    teams = list(Team.objects.annotate(members_count=Count("keys")))
    found = tenant_usage.usages(("team", t) for t in teams)
    if options["json"]:
        write_json(stdout, [team_json(t, u) for t, u in zip(teams, found)])
        return OK
    out = console(stdout)
    print_table(out, "teams", ["name", "priority", "weight", "members", "limits", "budgets", "usage now"],
                [[t.name, Priority(t.priority).label, f"{t.weight:g}", t.members_count,
                      tenant_usage.limits_text(t.limit_fields()), lo.budgets_text(t), lo.usage_text(u)]
                 for t, u in zip(teams, found)],
                "none yet: `llmgw teams create NAME` makes one")
    caption = lo.usage_caption(found)
    if caption:
        out.print(caption)
    return OK


def _show(team: Team, options, stdout) -> int:
    found = tenant_usage.usage("team", team)
    keys = list(team.keys.order_by("name"))
    if options["json"]:
        write_json(stdout, {**team_json(team, found), "keys": [{"name": k.name, "prefix": k.prefix,
                                                                 "state": k.state} for k in keys]})
        return OK
    out = console(stdout)
    out.print(f"team {team.name}: {_line(team)}")
    print_table(out, "keys", ["name", "prefix", "state"], [[k.name, k.prefix + "…", k.state] for k in keys],
                f"none in this team yet (`llmgw keys set KEY --team {team.name}` adds one)")
    rows = lo.usage_rows(found)
    if not rows:
        out.print("no limits of its own: its keys' limits alone apply")
        return OK
    out.print(table("usage now", ["limit", "model", "used", "of", "remaining", "resets at"], rows))
    out.print(lo.usage_caption([found]))
    return OK


def _set(team: Team, options, stdout) -> int:
    if options.get("model"):
        raise lo.UsageError("--model is for `teams budget`")
    changes = _changes(options)
    if not changes:
        raise lo.UsageError("teams set needs something to set: --priority, --weight, --rpm, --tpm, --concurrency, "
                            "--tokens-per-day or --tokens-per-month")
    for name, value in changes.items():
        setattr(team, name, value)
    lo.checked(team)
    team.save(update_fields=[*changes, "updated_at"])
    if options["json"]:
        write_json(stdout, team_json(team))
    else:
        stdout.write(f"updated team {team.name}: {_line(team)}\n")
    return OK


def _budget(team: Team, options, stdout) -> int:
    with transaction.atomic():
        budget = lo.set_budget(team, options)
    if options["json"]:
        write_json(stdout, {"name": team.name, "model_budgets": lo.budgets_of(team)})
    elif budget is None:
        stdout.write(f"removed the budget of team {team.name} for {options['model']}\n")
    else:
        stdout.write(f"team {team.name}: budget for {budget.model.name}: {lo.budget_text(budget)}\n")
    return OK


def _delete(team: Team, options, stdout) -> int:
    members = list(team.keys.values_list("name", flat=True))
    team.delete()
    if options["json"]:
        write_json(stdout, {"name": team.name, "deleted": True, "keys_without_team": members})
    else:
        stdout.write(f"deleted team {team.name}"
                     + (f"; {len(members)} key(s) now have no team (only their own limits apply): "
                        + ", ".join(members) if members else "") + "\n")
    return OK
