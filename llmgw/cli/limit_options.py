"""What ``llmgw keys`` and ``llmgw teams`` share: the limit options (``--rpm N``, ``none``
clears), priority, team and model look-ups, model budgets, and usage for tables and JSON.

Bad values are reported as :class:`UsageError` (exit 2, bad usage) with a message naming the
option; the commands print it."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from catalog.models import Model
from gateway import tenant_usage
from gateway.models import LIMIT_FIELDS, ModelBudget, Priority, Team
from llmgw.cli.output import when

#: Option → the limit field it sets.
LIMIT_OPTIONS = {"rpm": "requests_per_minute", "tpm": "tokens_per_minute", "concurrency": "max_concurrent_requests",
                 "tokens_per_day": "tokens_per_day", "tokens_per_month": "tokens_per_month"}
PRIORITIES = {label: value for value, label in Priority.choices}
NONE = "none"


class UsageError(Exception):
    """A bad option value or an unknown name given as an option (exit 2)."""


def add_limit_arguments(parser) -> None:
    """``--rpm --tpm --concurrency --tokens-per-day --tokens-per-month --priority``."""
    parser.add_argument("--rpm", default=None, help="requests per minute (a number, or 'none' for no limit)")
    parser.add_argument("--tpm", default=None, help="prompt + completion tokens per minute ('none': no limit)")
    parser.add_argument("--concurrency", default=None, help="requests at once ('none': no limit)")
    parser.add_argument("--tokens-per-day", default=None, help="token budget per UTC day ('none': no limit)")
    parser.add_argument("--tokens-per-month", default=None, help="token budget per UTC month ('none': no limit)")
    parser.add_argument("--priority", default=None, help="priority class: low, normal or high")


def count(option: str, text: str) -> int | None:
    """An option's limit: a whole number ≥ 1, or None for ``none``. UsageError otherwise."""
    if text.strip().lower() == NONE:
        return None
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--{option.replace('_', '-')} must be a whole number or 'none', not {text!r}") from None
    if value < 1:
        raise UsageError(f"--{option.replace('_', '-')} must be at least 1 (or 'none' for no limit)")
    return value


def limits_given(options) -> dict[str, int | None]:
    """The limit fields the options set (those given), by field name."""
    return {field: count(option, options[option]) for option, field in LIMIT_OPTIONS.items()
            if options.get(option) is not None}


def priority_given(options, clearable: bool) -> dict[str, int | None]:
    """``{"priority": value}`` when ``--priority`` is given (``none`` clears it where
    ``clearable``: a key then follows its team), else ``{}``."""
    text = options.get("priority")
    if text is None:
        return {}
    text = text.strip().lower()
    if clearable and text == NONE:
        return {"priority": None}
    if text not in PRIORITIES:
        extra = " or 'none' (the team's)" if clearable else ""
        raise UsageError(f"--priority must be low, normal or high{extra}, not {text!r}")
    return {"priority": PRIORITIES[text]}


def team_named(name: str) -> Team:
    try:
        return Team.objects.get(name=name)
    except Team.DoesNotExist:
        known = ", ".join(Team.objects.values_list("name", flat=True)[:10]) or "none yet"
        raise UsageError(f"no team called {name!r} (teams: {known}; `llmgw teams create NAME` makes one)") from None


def model_named(name: str) -> Model:
    model = Model.resolve(name)
    if model is None:
        raise UsageError(f"no model called {name!r} in the catalog")
    return model


def checked(obj) -> None:
    """The model's own validation (``full_clean``), its messages as a UsageError naming the fields."""
    try:
        obj.full_clean()
    except ValidationError as exc:
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"": exc.messages}
        raise UsageError("; ".join(f"{name}: {' '.join(msgs)}" if name else " ".join(msgs)
                                   for name, msgs in detail.items())) from None


def set_budget(owner, options) -> ModelBudget | None:
    """``… budget OWNER --model M --tokens-per-day N --tokens-per-month N``: set (or, with
    both ``none``, remove) ``owner``'s budget for the model; an option not given keeps its
    value. Returns the budget, None when removed."""
    if not options.get("model"):
        raise UsageError("budget needs --model NAME")
    model = model_named(options["model"])
    given = {field: count(field, options[field]) for field in ("tokens_per_day", "tokens_per_month")
             if options.get(field) is not None}
    if not given:
        raise UsageError("budget needs --tokens-per-day and/or --tokens-per-month (a number, or 'none')")
    owner_field = "team" if isinstance(owner, Team) else "key"
    current = ModelBudget.objects.filter(**{owner_field: owner}, model=model).first()
    values = {"tokens_per_day": current.tokens_per_day if current else None,
              "tokens_per_month": current.tokens_per_month if current else None, **given}
    return ModelBudget.set_for(owner, model, values["tokens_per_day"], values["tokens_per_month"])


def budget_text(budget: ModelBudget) -> str:
    """One budget's limits in a line: ``1,000 tokens/day, 20,000 tokens/month``."""
    return tenant_usage.limits_text({"tokens_per_day": budget.tokens_per_day,
                                     "tokens_per_month": budget.tokens_per_month})


def budgets_of(owner) -> dict[str, dict[str, int | None]]:
    """``{model name: {"tokens_per_day", "tokens_per_month"}}`` for JSON."""
    return {b.model.name: {"tokens_per_day": b.tokens_per_day, "tokens_per_month": b.tokens_per_month}
            for b in owner.model_budgets.select_related("model").order_by("model__name")}


def budgets_text(owner) -> str:
    """A subject's model budgets in one line: ``chat: 1,000 tokens/day``."""
    parts = []
    for name, values in budgets_of(owner).items():
        limits = tenant_usage.limits_text(values)
        parts.append(f"{name}: {limits}")
    return "; ".join(parts)


def limits_json(obj) -> dict[str, int | None]:
    return {name: getattr(obj, name) for name in LIMIT_FIELDS}


def usage_text(found: dict) -> str:
    """A usage (``tenant_usage.usage``) in one cell: ``RPM 3/10, TPM 200/1,000``; requests
    at once that only the web process knows are ``—``; no limits: ``no limits`` (a
    blank cell read as "not measured yet")."""
    parts = []
    for name, entry in found["limits"].items():
        used = "—" if entry["used"] is None else f"{entry['used']:,}"
        parts.append(f"{tenant_usage.SHORT_NAMES[name]} {used}/{entry['limit']:,}")
    for model, budgets in found["model_budgets"].items():
        for name, entry in budgets.items():
            parts.append(f"{model} {tenant_usage.SHORT_NAMES[name]} {entry['used']:,}/{entry['limit']:,}")
    return ", ".join(parts) or "no limits"


def usage_caption(found: list[dict]) -> str:
    """The line under a table of usages: where the numbers come from, and what ``—`` means."""
    if not found:
        return ""
    source = found[0]["source"]
    line = f"usage from {source}"
    if found[0].get("note"):
        line += f" ({found[0]['note']})"
    if any(e["used"] is None for f in found for e in f["limits"].values()):
        line += f"; requests at once: {tenant_usage.CONCURRENCY_ELSEWHERE}"
    return line


def usage_rows(found: dict) -> list[list]:
    """One subject's usage as table rows: limit, model, used, of, remaining, resets at."""
    rows = []
    for name, entry in found["limits"].items():
        rows.append(_row(name, "every model", entry))
    for model, budgets in found["model_budgets"].items():
        for name, entry in budgets.items():
            rows.append(_row(name, model, entry))
    return rows


def _row(name: str, model: str, entry: dict) -> list:
    used = tenant_usage.CONCURRENCY_ELSEWHERE if entry["used"] is None else f"{entry['used']:,}"
    remaining = "—" if entry["remaining"] is None else f"{entry['remaining']:,}"
    return [name.replace("_", " "), model, used, f"{entry['limit']:,}", remaining, when(entry["resets_at"])]
