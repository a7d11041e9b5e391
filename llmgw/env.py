"""Typed readers for ``LLMGW_*`` environment variables.

Every setting of llmgw comes from the environment through these helpers, so a bad value is
reported with the variable's name instead of surfacing later as a stack trace.
"""

from __future__ import annotations

import os

PREFIX = "LLMGW_"


class ConfigError(ValueError):
    """An environment variable holds a value that cannot be used."""


def _raw(name: str) -> str | None:
    value = os.environ.get(PREFIX + name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_str(name: str, default: str) -> str:
    """``LLMGW_<name>`` as a string, or ``default`` when unset or empty."""
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    """``LLMGW_<name>`` as a boolean: 1/true/yes/on or 0/false/no/off.

    Raises ConfigError for anything else.
    """
    value = _raw(name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{PREFIX}{name}={value!r} is not a boolean (use true or false)")


def env_int(name: str, default: int, minimum: int | None = None) -> int:
    """``LLMGW_<name>`` as an integer; ConfigError if unparsable or below ``minimum``."""
    value = _raw(name)
    if value is None:
        return default
    try:
        parsed = int(value)
    except ValueError:
        raise ConfigError(f"{PREFIX}{name}={value!r} is not an integer") from None
    if minimum is not None and parsed < minimum:
        raise ConfigError(f"{PREFIX}{name}={parsed} must be at least {minimum}")
    return parsed


_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration_s(text: str) -> float:
    """Parse ``"250ms"``, ``"5s"``, ``"10m"``, ``"1h"``, ``"30d"`` or a bare number of seconds.

    Returns seconds as a float; raises ValueError for anything else or a negative value.
    """
    text = text.strip().lower()
    for unit in sorted(_UNITS_S, key=len, reverse=True):
        if text.endswith(unit) and text[: -len(unit)].strip():
            number = text[: -len(unit)].strip()
            seconds = float(number) * _UNITS_S[unit]
            break
    else:
        seconds = float(text)
    if seconds < 0:
        raise ValueError("negative duration")
    return seconds


def env_duration_s(name: str, default_s: float) -> float:
    """``LLMGW_<name>`` as a duration in seconds (see :func:`parse_duration_s`)."""
    value = _raw(name)
    if value is None:
        return default_s
    try:
        return parse_duration_s(value)
    except ValueError:
        raise ConfigError(
            f"{PREFIX}{name}={value!r} is not a duration (examples: 500ms, 5s, 10m, 1h, 30d)"
        ) from None
