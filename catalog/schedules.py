"""Schedule windows in the cluster's time zone, as a person reading the schedule means them.

A window has weekdays, a local start and end time (end before start: it crosses midnight,
the end falling on the next day), a min and an optional max. Edges: start inclusive, end
exclusive. DST (docs/architecture.md, "Decisions": schedules and DST): a window starting (or
ending) in a skipped hour begins (or ends) at the first valid instant after it; in a repeated
hour the first occurrence counts. Pure functions; no ORM.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_SHORTHANDS = {"daily": DAYS, "weekdays": DAYS[:5], "weekends": DAYS[5:]}


def parse_weekdays(text: str) -> tuple[int, ...]:
    """``"mon,wed,fri"``, ``"mon-fri"``, ``"daily"``, ``"weekdays"``, ``"weekends"`` → sorted
    weekday numbers (Monday 0). Raises ValueError naming what was not understood."""
    days: set[int] = set()
    for part in (p.strip().lower() for p in (text or "").split(",")):
        if not part:
            continue
        if part in _SHORTHANDS:
            days.update(DAYS.index(d) for d in _SHORTHANDS[part])
        elif "-" in part:
            first, _, last = part.partition("-")
            if first not in DAYS or last not in DAYS:
                raise ValueError(f"'{part}' is not a range of days like mon-fri")
            i, j = DAYS.index(first), DAYS.index(last)
            days.update(range(i, j + 1) if i <= j else list(range(i, 7)) + list(range(0, j + 1)))
        elif part in DAYS:
            days.add(DAYS.index(part))
        else:
            raise ValueError(f"'{part}' is not a day (use mon, tue, … sun, mon-fri, daily, weekdays, weekends)")
    if not days:
        raise ValueError("name at least one day")
    return tuple(sorted(days))


@dataclass(frozen=True)
class Window:
    """One schedule window. ``weekdays``: Monday 0 … Sunday 6, the days it *starts* on."""

    weekdays: tuple[int, ...]
    start: time
    end: time
    min_replicas: int
    max_replicas: int | None = None
    id: int | None = None

    @property
    def crosses_midnight(self) -> bool:
        return self.end <= self.start


def _first_instant_at_or_after(day: date, wall: time, tz: ZoneInfo) -> datetime:
    """The first UTC instant at which the local clock on ``day`` reads ``wall`` or later.

    Ordinary times map one to one; a time in a repeated hour takes its first occurrence; a
    time in a skipped hour maps to the end of the gap.
    """
    local = datetime.combine(day, wall, tzinfo=tz)  # fold=0: first occurrence
    first = local.astimezone(timezone.utc)
    if first.astimezone(tz).replace(tzinfo=None) == local.replace(tzinfo=None):
        return first
    # Skipped: search between the two readings of the offset for the gap's end.
    a = int(local.replace(fold=1).astimezone(timezone.utc).timestamp())
    b = int(first.timestamp())
    low, high = min(a, b), max(a, b)
    target = local.replace(tzinfo=None)

    def reached(ts: int) -> bool:
        return datetime.fromtimestamp(ts, tz).replace(tzinfo=None) >= target

    while high - low > 1:
        mid = (low + high) // 2
        if reached(mid):
            high = mid
        else:
            low = mid
    return datetime.fromtimestamp(high, timezone.utc)


def window_interval(window: Window, start_day: date, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """UTC [start, end) of ``window`` when it starts on local ``start_day``."""
    end_day = start_day + timedelta(days=1) if window.crosses_midnight else start_day
    return (_first_instant_at_or_after(start_day, window.start, tz),
            _first_instant_at_or_after(end_day, window.end, tz))


def active_window(windows: list[Window] | tuple[Window, ...], now: datetime, tz_name: str) -> Window | None:
    """The window in force at ``now`` (aware), or None. Windows do not overlap (validated),
    so at most one applies; if bad data lets two apply, the one with the higher min wins."""
    tz = ZoneInfo(tz_name)
    today = now.astimezone(tz).date()
    found = []
    for window in windows:
        for day in (today - timedelta(days=1), today):
            if day.weekday() not in window.weekdays:
                continue
            start, end = window_interval(window, day, tz)
            if start <= now < end:
                found.append(window)
    return max(found, key=lambda w: w.min_replicas) if found else None


def next_start(windows: list[Window] | tuple[Window, ...], now: datetime, tz_name: str,
               within: timedelta = timedelta(days=8)) -> tuple[datetime, Window] | None:
    """The first instant after ``now`` (aware) at which one of ``windows`` starts, and that
    window, looking no further than ``within``; None if none starts by then. The same
    instants :func:`active_window` uses — a start in a skipped hour is the end of the gap,
    in a repeated hour the first occurrence — so pre-warming ahead of it (issue 18) agrees
    with the window's own edges."""
    tz = ZoneInfo(tz_name)
    today = now.astimezone(tz).date()
    best: tuple[datetime, Window] | None = None
    for offset in range(-1, within.days + 2):
        day = today + timedelta(days=offset)
        for window in windows:
            if day.weekday() not in window.weekdays:
                continue
            start, _ = window_interval(window, day, tz)
            if now < start <= now + within and (best is None or start < best[0]):
                best = (start, window)
    return best


def starts_between(windows: list[Window] | tuple[Window, ...], now: datetime, until: datetime,
                   tz_name: str) -> list[tuple[datetime, Window]]:
    """Every (start instant, window) with ``now < start <= until``, earliest first: the
    windows a pre-warm lead reaching ``until`` may bring forward, a higher one after a lower
    one included. Instants as :func:`next_start`'s."""
    tz = ZoneInfo(tz_name)
    found = []
    for offset in range(-1, (until - now).days + 2):
        day = now.astimezone(tz).date() + timedelta(days=offset)
        for window in windows:
            if day.weekday() in window.weekdays:
                start, _ = window_interval(window, day, tz)
                if now < start <= until:
                    found.append((start, window))
    return sorted(found, key=lambda sw: (sw[0], -sw[1].min_replicas))


def _week_minutes(window: Window) -> list[tuple[int, int]]:
    """The window as [start, end) minute ranges of a week (Monday 00:00 = 0), wall clock."""
    s = window.start.hour * 60 + window.start.minute
    e = window.end.hour * 60 + window.end.minute
    week = 7 * 1440
    spans = []
    for day in window.weekdays:
        a = day * 1440 + s
        b = day * 1440 + e + (1440 if window.crosses_midnight else 0)
        if b <= week:
            spans.append((a, b))
        else:
            spans += [(a, week), (0, b - week)]
    return spans


def overlapping(windows: list[Window]) -> list[tuple[Window, Window]]:
    """Pairs of windows that share a moment of the week (wall clock)."""
    pairs = []
    for i, a in enumerate(windows):
        for b in windows[i + 1:]:
            if any(x0 < y1 and y0 < x1 for x0, x1 in _week_minutes(a) for y0, y1 in _week_minutes(b)):
                pairs.append((a, b))
    return pairs


def describe(window: Window) -> str:
    days = ",".join(DAYS[d] for d in window.weekdays)
    top = f", max {window.max_replicas}" if window.max_replicas else ""
    return f"{days} {window.start:%H:%M}–{window.end:%H:%M} (min {window.min_replicas}{top})"
