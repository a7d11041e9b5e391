"""Integers from untrusted JSON (agents' reports, engines' usage, request bodies): one rule
for what counts as one. Python's ``json`` decodes ``true``/``false`` as ``bool``, a subclass
of ``int``, so ``isinstance(value, int)`` alone would count ``true`` as 1.
"""

from __future__ import annotations

#: The largest value a 32-bit signed column holds (PostgreSQL ``integer``).
INT32_MAX = 2**31 - 1


def is_int(value: object) -> bool:
    """Whether ``value`` is an integer as JSON decodes one: an ``int``, never a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def count_or_none(value: object, maximum: int = INT32_MAX, *, strict: bool = True) -> int | None:
    """``value`` as a count in ``0..maximum``, or None for anything else: a bool, a number
    out of range, or (``strict``) anything but an int. With ``strict=False`` whatever
    ``int()`` reads counts too (a float, truncated: engines' gauges are floats; a numeric
    string), for fields that are skipped rather than refused (an agent's report: a bad
    field never fails the whole report). Raises nothing."""
    if isinstance(value, bool):
        return None
    if strict and not isinstance(value, int):
        return None
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return None
    return number if 0 <= number <= maximum else None
