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


#: The largest value a 64-bit signed column holds (a Django ``BigAutoField`` id).
INT64_MAX = 2**63 - 1


def id_from_text(text: str, maximum: int = INT64_MAX) -> int | None:
    """A row id written in a query string: ASCII digits only (``str.isdigit`` also takes
    "²" and Arabic-Indic digits, which ``int`` then refuses or reads), ``0..maximum``;
    None for anything else. Raises nothing."""
    if not text or not text.isascii() or not text.isdigit():
        return None
    number = int(text)
    return number if number <= maximum else None
