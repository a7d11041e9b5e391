"""``llmgw keys create|list|set|budget|revoke``: API keys for /v1/, their team, priority,
limits and model budgets."""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from catalog.models import Model
from gateway import tenant_usage
from gateway.models import ApiKey, Priority
import llmgw.cli.limit_options as lo
from llmgw.cli.output import FAILED, OK, USAGE, console, print_table, when, write_json

HELP = ("Manage API keys for /v1/: create (prints the key once), list (team, limits, usage now), set (team, "
        "priority, limits; 'none' clears one), budget (tokens for one model), revoke. "
        "Exit 0 ok, 1 not found, 2 bad usage (a bad value, an unknown team or model).")


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=["create", "list", "set", "budget", "revoke"],
                        help="create, list, set (limits, team), budget (per model) or revoke a key")
    parser.add_argument("name", nargs="?", help="create: a name for the key; set, budget, revoke: its name or prefix")
    parser.add_argument("--models", default="", help="create: comma-separated models the key may use (default: all)")
    parser.add_argument("--expires-days", type=float, default=None, help="create: days until it expires")
    parser.add_argument("--team", default=None, help="create, set: the team whose limits apply too ('none': no team)")
    lo.add_limit_arguments(parser)
    parser.add_argument("--model", default=None, help="budget: the model the budget is for")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(options, stdout, stderr) -> int:
    action = options["action"]
    try:
        if action == "create":
            return _create(options, stdout, stderr)
        if action == "list":
            return _list(options, stdout)
        if action in ("set", "budget"):
            key = _find(options["name"], action, stderr)
            if not isinstance(key, ApiKey):
                return key
            return _set(key, options, stdout) if action == "set" else _budget(key, options, stdout)
    except lo.UsageError as exc:
        stderr.write(f"{exc}\n")
        return USAGE
    return _revoke(options, stdout, stderr)


def _team_option(options, clearable: bool) -> dict:
    text = options.get("team")
    if text is None:
        return {}
    if clearable and text.strip().lower() == lo.NONE:
        return {"team": None}
    return {"team": lo.team_named(text)}


def _create(options, stdout, stderr) -> int:
    name = options["name"]
    if not name:
        stderr.write("keys create needs a NAME\n")
        return USAGE
    if options["expires_days"] is not None and options["expires_days"] <= 0:
        stderr.write("--expires-days must be positive\n")
        return USAGE
    if options.get("model"):
        stderr.write("--model is for `keys budget`; `keys create` takes --models (the models the key may use)\n")
        return USAGE
    team = _team_option(options, clearable=False)
    limits = lo.limits_given(options)
    priority = lo.priority_given(options, clearable=False)
    if any(k.state == ApiKey.State.ACTIVE for k in ApiKey.objects.filter(name=name)):
        stderr.write(f"an active key named {name!r} exists; revoke it first or choose another name\n")
        return FAILED
    expires = timezone.now() + timedelta(days=options["expires_days"]) if options["expires_days"] else None
    models = [m.strip() for m in options["models"].split(",") if m.strip()]
    try:
        key, clear = ApiKey.create_key(name, models, expires, **team, **priority, **limits)
    except Model.DoesNotExist as exc:
        stderr.write(f"{exc.args[0] if exc.args else exc}\n")
        return FAILED
    except ValidationError as exc:  # a limit out of range (0, negative, too large)
        stderr.write(f"{' '.join(exc.messages)}\n")
        return USAGE
    if options["json"]:
        write_json(stdout, {"name": key.name, "prefix": key.prefix, "key": clear, "models": models or "all",
                            "expires_at": key.expires_at, **_tenancy_json(key)})
    else:
        stdout.write(f"created key {key.name}: {clear}\n(shown once; store it now)\n")
        stdout.write(f"{_tenancy_line(key)}\n")
    return OK


def _tenancy_json(key: ApiKey) -> dict:
    return {"team": key.team.name if key.team else None,
            "priority": None if key.priority is None else Priority(key.priority).label,
            "limits": lo.limits_json(key), "model_budgets": lo.budgets_of(key)}


def _tenancy_line(key: ApiKey) -> str:
    priority = Priority(key.priority).label if key.priority is not None else "the team's" if key.team else "normal"
    line = (f"team {key.team.name if key.team else '—'}, priority {priority}, "
            f"limits {tenant_usage.limits_text(key.limit_fields())}")
    budgets = lo.budgets_text(key)
    return line + (f", budgets {budgets}" if budgets else "")


def _list(options, stdout) -> int:
    keys = list(ApiKey.objects.select_related("team").prefetch_related("allowed_models"))
    found = tenant_usage.usages(("key", k) for k in keys)
    rows = [{"name": k.name, "prefix": k.prefix, "state": k.state,
             "models": [m.name for m in k.allowed_models.all()] or "all",
             "expires_at": k.expires_at, "created_at": k.created_at, **_tenancy_json(k), "usage": u}
            for k, u in zip(keys, found)]
    if options["json"]:
        write_json(stdout, rows)
        return OK
    out = console(stdout)
    print_table(out, "API keys", ["name", "prefix", "state", "team", "priority", "limits", "usage now", "models",
                                  "expires"],
                [[r["name"], r["prefix"] + "…", r["state"], r["team"] or "—",
                      r["priority"] or ("team's" if r["team"] else "normal"),
                      tenant_usage.limits_text(r["limits"]), lo.usage_text(r["usage"]),
                      r["models"] if r["models"] == "all" else ", ".join(r["models"]),
                      when(r["expires_at"], none="never")] for r in rows],
                "none yet: `llmgw keys create NAME` makes one")
    caption = lo.usage_caption(found)
    if caption:
        out.print(caption)
    return OK


def _find(name: str | None, action: str, stderr) -> ApiKey | int:
    """The one key ``name`` names (its name — the active one if several share it — or the
    start of its prefix), else the exit code, having said why."""
    if not name:
        stderr.write(f"keys {action} needs the key's NAME or prefix\n")
        return USAGE
    keys = list(ApiKey.objects.filter(name=name).select_related("team"))
    if len(keys) > 1:
        keys = [k for k in keys if k.state == ApiKey.State.ACTIVE] or keys
    if not keys:
        keys = list(ApiKey.objects.filter(prefix__startswith=name.rstrip("…")).select_related("team"))
    if not keys:
        stderr.write(f"no key named or prefixed {name!r}\n")
        return FAILED
    if len(keys) > 1:
        stderr.write(f"{name!r} names {len(keys)} keys (" + ", ".join(f"{k.name} {k.prefix}…" for k in keys[:5])
                     + (", …" if len(keys) > 5 else "") + "); give more of its prefix\n")
        return USAGE
    return keys[0]


def _set(key: ApiKey, options, stdout) -> int:
    changes = {**_team_option(options, clearable=True), **lo.priority_given(options, clearable=True),
               **lo.limits_given(options)}
    if not changes:
        raise lo.UsageError("keys set needs something to set: --team, --priority, --rpm, --tpm, --concurrency, "
                            "--tokens-per-day or --tokens-per-month")
    for name, value in changes.items():
        setattr(key, name, value)
    lo.checked(key)
    key.save(update_fields=[*changes, "updated_at"])
    if options["json"]:
        write_json(stdout, {"name": key.name, "prefix": key.prefix, **_tenancy_json(key)})
    else:
        stdout.write(f"updated key {key.name} ({key.prefix}…): {_tenancy_line(key)}\n")
    return OK


def _budget(key: ApiKey, options, stdout) -> int:
    with transaction.atomic():
        budget = lo.set_budget(key, options)
    if options["json"]:
        write_json(stdout, {"name": key.name, "prefix": key.prefix, "model_budgets": lo.budgets_of(key)})
    elif budget is None:
        stdout.write(f"removed the budget of key {key.name} for {options['model']}\n")
    else:
        stdout.write(f"key {key.name}: budget for {budget.model.name}: {lo.budget_text(budget)}\n")
    return OK


def _revoke(options, stdout, stderr) -> int:
    name = options["name"]
    if not name:
        stderr.write("keys revoke needs the key's NAME or prefix\n")
        return USAGE
    keys = list(ApiKey.objects.filter(name=name))
    if not keys:
        keys = list(ApiKey.objects.filter(prefix__startswith=name.rstrip("…")))
        if len(keys) > 1:  # "llmgw" would revoke every key
            stderr.write(f"{name!r} is the start of {len(keys)} keys' prefixes ("
                         + ", ".join(f"{k.name} {k.prefix}…" for k in keys[:5]) + (", …" if len(keys) > 5 else "")
                         + "); give a key's name or more of its prefix\n")
            return USAGE
    if not keys:
        stderr.write(f"no key named or prefixed {name!r}\n")
        return FAILED
    already = {k.pk: k.revoked_at for k in keys if k.revoked_at}
    for key in keys:
        key.revoke()
    if options["json"]:
        write_json(stdout, [{"name": k.name, "prefix": k.prefix, "state": k.state,
                             "already_revoked": k.pk in already} for k in keys])
    else:
        for key in keys:
            if key.pk in already:
                stdout.write(f"{key.name} ({key.prefix}…) was already revoked, at {when(already[key.pk])}\n")
            else:
                stdout.write(f"revoked {key.name} ({key.prefix}…)\n")
    return OK
