"""``llmgw keys create|list|revoke``: API keys for /v1/."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from catalog.models import Model
from gateway.models import ApiKey
from llmgw.cli.output import FAILED, OK, USAGE, console, table, write_json

HELP = "Manage API keys for /v1/: create (prints the key once), list, revoke. Exit 0 ok, 1 not found, 2 bad usage."


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=["create", "list", "revoke"])
    parser.add_argument("name", nargs="?", help="create: a name for the key; revoke: its name or prefix")
    parser.add_argument("--models", default="", help="create: comma-separated models the key may use (default: all)")
    parser.add_argument("--expires-days", type=float, default=None, help="create: days until it expires")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(options, stdout, stderr) -> int:
    action, name = options["action"], options["name"]
    if action == "create":
        if not name:
            stderr.write("keys create needs a NAME\n")
            return USAGE
        if options["expires_days"] is not None and options["expires_days"] <= 0:
            stderr.write("--expires-days must be positive\n")
            return USAGE
        if any(k.state == ApiKey.State.ACTIVE for k in ApiKey.objects.filter(name=name)):
            stderr.write(f"an active key named {name!r} exists; revoke it first or choose another name\n")
            return FAILED
        expires = timezone.now() + timedelta(days=options["expires_days"]) if options["expires_days"] else None
        models = [m.strip() for m in options["models"].split(",") if m.strip()]
        try:
            key, clear = ApiKey.create_key(name, models, expires)
        except Model.DoesNotExist as exc:
            stderr.write(f"{exc.args[0] if exc.args else exc}\n")
            return FAILED
        if options["json"]:
            write_json(stdout, {"name": key.name, "prefix": key.prefix, "key": clear, "models": models or "all",
                                "expires_at": key.expires_at})
        else:
            stdout.write(f"created key {key.name}: {clear}\n(shown once; store it now)\n")
        return OK
    if action == "list":
        keys = list(ApiKey.objects.prefetch_related("allowed_models"))
        rows = [{"name": k.name, "prefix": k.prefix, "state": k.state,
                 "models": [m.name for m in k.allowed_models.all()] or "all",
                 "expires_at": k.expires_at, "created_at": k.created_at} for k in keys]
        if options["json"]:
            write_json(stdout, rows)
        else:
            console(stdout).print(table("API keys", ["name", "prefix", "state", "models", "expires"],
                                        [[r["name"], r["prefix"] + "…", r["state"],
                                          r["models"] if r["models"] == "all" else ", ".join(r["models"]),
                                          r["expires_at"] or "never"] for r in rows]))
        return OK
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
                stdout.write(f"{key.name} ({key.prefix}…) was already revoked, at {already[key.pk]:%Y-%m-%d %H:%M:%S %Z}\n")
            else:
                stdout.write(f"revoked {key.name} ({key.prefix}…)\n")
    return OK
