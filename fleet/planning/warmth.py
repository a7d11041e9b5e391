"""Warm before demand: pure rules on an injected clock (docs/architecture.md, "Warm before
demand"; issue 18).

Three things make a replica ready before the request that needs it, instead of a cold
start after it:

* **Measured cold starts.** Every replica's placement → ready time is recorded;
  :func:`cold_start` turns the recent ones into one robust figure, the 90th percentile of
  the last :data:`RECENT_STARTS` (a slow first download or one slow machine moves it, a
  single outlier does not run it away). Without any measurement the cluster's default
  stands in and says so. :func:`lead_s` adds the margin that pre-warming places ahead by.
* **Schedule pre-warm.** A window's min is meant to be *ready* at the window's start, so
  its replicas are placed ``lead_s`` ahead (:func:`window_ahead`). Only a rise is brought
  forward: a window whose min is lower than what holds now waits for its start. The
  instant a window starts — DST gaps and repeats, windows past midnight — is
  ``catalog.schedules``' (``next_window_start``); this module only subtracts.
* **Predictive warmth.** Each on-demand model keeps an hour-of-week profile of when it was
  asked for (:class:`ArrivalProfile`): per local hour of the week, how often — recent weeks
  weighing more (:data:`DECAY` per week) — that hour saw a request. An hour asked for in
  most recent weeks (:func:`likely`) is *likely*; from ``lead_s`` before a run of likely
  hours until its end plus the model's idle timeout, :func:`predict` says the model should
  be warm ("usually asked for on weekdays 09–10; warm until 10:15"). The planner keeps such
  a replica only on capacity nobody else wants, places it after every wanted model, never
  evicts for it and evicts it first (``fleet.planning.planner``, R11).

Nothing here reads a clock or a database: ``now`` and the data come in, plain values go out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

#: The recent starts a cold-start estimate is taken from, newest first, and its quantile.
RECENT_STARTS = 20
COLD_START_QUANTILE = 0.9
#: Pre-warm margin on top of the estimate: a quarter of it, at least this many seconds
#: (a pass interval or two, the agent's acknowledgement, the readiness poll).
MARGIN_SHARE = 0.25
MARGIN_MIN_S = 20.0

#: Hours of the week (Monday 00:00–01:00 local is slot 0).
SLOTS = 168
#: What one week's observation of an hour weighs a week later (the profile forgets slowly:
#: a habit of four weeks ago counts a quarter of last week's).
DECAY = 0.7
#: An hour is likely when its weighted share of weeks asked is at least this, counting one
#: extra week not asked (a prior): a habit is an hour asked for four weeks running (0.72;
#: three are 0.69). Less is too easily chance: a model asked in a fifth of its office
#: hours at random has three weeks running in one slot of a hundred or so — across a long
#: tail of models, hours of GPUs kept warm for nobody (the simulated day showed it).
LIKELY_SHARE = 0.7
PRIOR_WEEKS = 1.0
#: How many closed hours one observation may fill in (a worker down for longer than a week
#: loses the hours before the last week, which a week's cycle would overwrite anyway).
MAX_CLOSE = SLOTS
#: How far a run of likely hours is followed each way from now (hours): a model likely at
#: every hour would otherwise cost a week of look-ups each way at every pass; the run is
#: looked at again at the next pass, so a longer one only reads as "from … to …" a day off.
MAX_RUN_HOURS = 24


# --- Cold starts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ColdStart:
    """Placement → ready, in seconds, for one model on its profile: ``estimate_s`` is the
    90th percentile of the ``samples`` most recent measured starts, or (``samples`` 0) the
    cluster's default for a model never started yet."""

    estimate_s: float
    samples: int = 0

    @property
    def measured(self) -> bool:
        return self.samples > 0

    def words(self) -> str:
        """"about 150 s (p90 of 12 starts)", "about 120 s (not measured yet: the default)"."""
        how = (f"p90 of {self.samples} start{'s' if self.samples != 1 else ''}" if self.measured
               else "not measured yet: the default")
        return f"about {_fmt_s(self.estimate_s)} ({how})"


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by linear interpolation between order
    statistics (numpy's default), without numpy. Raises ValueError when empty."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def cold_start(recent_s: Sequence[float], default_s: float) -> ColdStart:
    """The estimate from ``recent_s`` — measured placement → ready durations in seconds,
    newest first (only the first :data:`RECENT_STARTS` count; negative or non-finite ones
    are ignored) — or ``default_s`` when there are none."""
    usable = [float(s) for s in recent_s[:RECENT_STARTS] if s is not None and math.isfinite(s) and s >= 0]
    if not usable:
        return ColdStart(float(default_s), 0)
    return ColdStart(round(quantile(usable, COLD_START_QUANTILE), 1), len(usable))


def lead_s(start: ColdStart) -> float:
    """How far ahead of the moment a replica must be ready it is placed: the estimate plus
    a margin (:data:`MARGIN_SHARE` of it, at least :data:`MARGIN_MIN_S`), in seconds."""
    return start.estimate_s + max(MARGIN_MIN_S, MARGIN_SHARE * start.estimate_s)


# --- Schedule pre-warm ----------------------------------------------------------------------


@dataclass(frozen=True)
class UpcomingWindow:
    """The next schedule window to start after now: when (aware), its min and max, and
    how people read it ("mon-fri 08:00–19:00 (min 2)")."""

    starts_at: datetime
    min_replicas: int
    max_replicas: int | None = None
    label: str = ""


@dataclass(frozen=True)
class Ahead:
    """A floor (and ceiling) brought forward: the upcoming window's, in force from
    ``since`` (its start minus the lead), and why in words."""

    min_replicas: int
    max_replicas: int
    since: datetime
    words: str


def window_ahead(upcoming: UpcomingWindow | None, floor_now: int, ceiling_now: int, model_max: int,
                 start: ColdStart, now: datetime) -> Ahead | None:
    """The upcoming window's terms if they apply early at ``now``: it starts within
    :func:`lead_s` and raises the floor above ``floor_now`` (the window in force, else the
    model's own min). The ceiling is the larger of the one in force (``ceiling_now``) and
    the window's (its max, else ``model_max``), so bringing a window forward never caps a
    load already scaled up. None otherwise."""
    if upcoming is None or upcoming.min_replicas <= floor_now:
        return None
    lead = lead_s(start)
    since = upcoming.starts_at - timedelta(seconds=lead)
    if not since <= now < upcoming.starts_at:
        return None
    top = max(ceiling_now, upcoming.max_replicas or model_max, upcoming.min_replicas)
    words = (f"pre-warm: window {upcoming.label or 'next'} starts in {_fmt_s((upcoming.starts_at - now).total_seconds())}"
             f"; a replica takes {start.words()}, placed {_fmt_s(lead)} ahead")
    return Ahead(upcoming.min_replicas, top, since, words)


# --- Arrival profiles ------------------------------------------------------------------------


def epoch_hour(when: datetime) -> int:
    """Hours since the Unix epoch of an aware instant (the profile's clock of record)."""
    return math.floor(when.timestamp() / 3600)


def slot_of(hour: int, tz: ZoneInfo) -> int:
    """The local hour-of-week slot (0..167, Monday 00:00 = 0) of epoch hour ``hour``, read
    at its middle (a time zone half an hour off UTC lands in one local hour)."""
    local = datetime.fromtimestamp(hour * 3600 + 1800, tz)
    return local.weekday() * 24 + local.hour


@dataclass(frozen=True)
class ArrivalProfile:
    """When a model is asked for, by local hour of the week (:data:`SLOTS` slots).

    ``asked[s]`` and ``seen[s]`` are the decayed counts of weeks in which hour-slot ``s``
    had a request, and of weeks it was observed at all; each time an hour ends (is
    *closed*), its slot decays by :data:`DECAY` and adds 1 to ``seen`` and 1 or 0 to
    ``asked``. ``open_hour`` (epoch hours) is the hour still running, ``open_asked`` whether
    it has had a request. Stored as JSON in ``ModelState.arrivals`` (:meth:`as_json`)."""

    asked: tuple[float, ...] = (0.0,) * SLOTS
    seen: tuple[float, ...] = (0.0,) * SLOTS
    open_hour: int | None = None
    open_asked: bool = False

    def share(self, slot: int) -> float:
        """The weighted share of weeks slot ``slot`` was asked in, with one unasked week
        as a prior (so a slot never seen is 0, one week asked 0.5, four running 0.72)."""
        return self.asked[slot] / (self.seen[slot] + PRIOR_WEEKS)

    def weeks_seen(self, slot: int) -> float:
        return self.seen[slot]

    @property
    def empty(self) -> bool:
        return not any(self.seen)

    def as_json(self) -> dict:
        """JSON-ready (four decimals: enough for shares, small on disk)."""
        return {"v": 1, "asked": [round(x, 4) for x in self.asked], "seen": [round(x, 4) for x in self.seen],
                "open_hour": self.open_hour, "open_asked": self.open_asked}

    @classmethod
    def from_json(cls, data: object) -> ArrivalProfile:
        """The profile stored by :meth:`as_json`; an empty profile for anything else (a
        damaged or foreign value must not stop a pass)."""
        if not isinstance(data, dict):
            return cls()
        asked, seen = data.get("asked"), data.get("seen")
        if not (isinstance(asked, list) and isinstance(seen, list) and len(asked) == len(seen) == SLOTS):
            return cls()
        try:
            a = tuple(max(0.0, float(x)) for x in asked)
            s = tuple(max(0.0, float(x)) for x in seen)
            hour = data.get("open_hour")
            hour = int(hour) if hour is not None else None
        except (TypeError, ValueError, OverflowError):
            return cls()
        if not all(math.isfinite(x) for x in a + s):
            return cls()
        return cls(a, s, hour, bool(data.get("open_asked")))


def observe(profile: ArrivalProfile, now: datetime, last_asked_at: datetime | None, tz: ZoneInfo) -> ArrivalProfile:
    """The profile after looking at the model at ``now``, its latest request at
    ``last_asked_at`` (None: never). Hours that ended since the last look are closed — an
    hour counts as asked if the open one had a request or ``last_asked_at`` falls in it —
    and the hour of ``now`` is opened. Looking often (every pass) sees every hour; a gap
    (a worker down) credits only the hour of the latest request. Returns ``profile`` itself
    when nothing changed (callers store only a changed one)."""
    hour = epoch_hour(now)
    asked_hour = epoch_hour(last_asked_at) if last_asked_at is not None else None
    if profile.open_hour is None or profile.open_hour > hour + 1:
        # Never looked at, or an open hour in the future (a clock set back, a damaged row):
        # open this one, or the profile would wait for that hour and learn nothing until then.
        return ArrivalProfile(profile.asked, profile.seen, hour, asked_hour == hour)
    if hour <= profile.open_hour:
        if asked_hour == profile.open_hour and not profile.open_asked:
            return ArrivalProfile(profile.asked, profile.seen, profile.open_hour, True)
        return profile
    asked, seen = list(profile.asked), list(profile.seen)
    first = max(profile.open_hour, hour - MAX_CLOSE)
    for h in range(first, hour):
        slot = slot_of(h, tz)
        was_asked = (profile.open_asked and h == profile.open_hour) or asked_hour == h
        asked[slot] = asked[slot] * DECAY + (1.0 if was_asked else 0.0)
        seen[slot] = seen[slot] * DECAY + 1.0
    return ArrivalProfile(tuple(asked), tuple(seen), hour, asked_hour == hour)


def learn(profile: ArrivalProfile, asked_at: Sequence[datetime], until: datetime, tz: ZoneInfo) -> ArrivalProfile:
    """The profile after requests at ``asked_at`` (any order) and every hour up to
    ``until`` closed in between: what :func:`observe` at every pass would have built. For
    replaying history (the simulator's, or an import) in one call."""
    hours = sorted({epoch_hour(t) for t in asked_at})
    for h in hours:
        at = datetime.fromtimestamp(h * 3600, UTC)
        profile = observe(profile, at, at, tz)
    return observe(profile, until, None, tz)


def likely(profile: ArrivalProfile, slot: int) -> bool:
    """Slot ``slot`` is asked for in most recent weeks (:data:`LIKELY_SHARE`, with the
    prior): four weeks running are a habit, three are not yet."""
    return profile.share(slot) >= LIKELY_SHARE


@dataclass(frozen=True)
class Prediction:
    """A run of likely hours around now: warm from ``warm_from`` (its first hour's start
    minus the lead) until just before ``until`` (its last hour's end plus the model's idle
    timeout), and why in words."""

    warm_from: datetime
    run_end: datetime
    until: datetime
    words: str


_DAY_NAMES = ("Mondays", "Tuesdays", "Wednesdays", "Thursdays", "Fridays", "Saturdays", "Sundays")


def _days_words(profile: ArrivalProfile, hour_of_day: int) -> str:
    days = [d for d in range(7) if likely(profile, d * 24 + hour_of_day)]
    if len(days) == 7:
        return "every day"
    if days == [0, 1, 2, 3, 4]:
        return "on weekdays"
    if days == [5, 6]:
        return "on weekends"
    return "on " + ", ".join(_DAY_NAMES[d] for d in days) if days else "this hour"


def predict(profile: ArrivalProfile | None, now: datetime, tz: ZoneInfo, lead: float,
            idle_timeout_s: float) -> Prediction | None:
    """The run of likely hours that should keep the model warm at ``now``, if any: from
    ``lead`` seconds before its first hour until its last hour's end plus
    ``idle_timeout_s`` — the idle timeout counting from the run's end as it would from a
    last request. Runs are contiguous likely hours (at most a week); the one found is the
    latest whose warm span holds ``now``; a run is followed at most :data:`MAX_RUN_HOURS`
    each way from now."""
    if profile is None or profile.empty:
        return None
    # Hours whose run could hold now: from the idle timeout (and the hour) back, to the lead ahead.
    first = epoch_hour(now - timedelta(seconds=idle_timeout_s)) - 1
    last = epoch_hour(now + timedelta(seconds=lead))
    found: Prediction | None = None
    h = first
    while h <= last:
        if not likely(profile, slot_of(h, tz)):
            h += 1
            continue
        start = h
        # Back to where this run begins (it may have begun before the scan did).
        while start > first - MAX_RUN_HOURS and likely(profile, slot_of(start - 1, tz)):
            start -= 1
        end = h + 1
        while end < last + MAX_RUN_HOURS and likely(profile, slot_of(end, tz)):
            end += 1
        begin_at = datetime.fromtimestamp(start * 3600, UTC)
        run_end = datetime.fromtimestamp(end * 3600, UTC)
        warm_from = begin_at - timedelta(seconds=lead)
        until = run_end + timedelta(seconds=idle_timeout_s)
        if warm_from <= now < until:
            # Named by their slots' local hours, as describe_profile does (a zone half an hour
            # off UTC reads each hour at its middle).
            first_slot = slot_of(start, tz)
            hour_from, hour_to = first_slot % 24, (first_slot + end - start) % 24
            span = (f"{hour_from:02d}–{hour_to:02d}" if end - start < 24
                    else "around the clock" if end - start >= 2 * MAX_RUN_HOURS
                    else f"from {_DAY_NAMES[first_slot // 24][:3]} {hour_from:02d}:00 for {end - start} hours")
            found = Prediction(warm_from, run_end, until, (
                f"usually asked for {_days_words(profile, hour_from)} {span}; "
                f"warm until {until.astimezone(tz):%H:%M}"))
        h = end
    return found


def describe_profile(profile: ArrivalProfile | None) -> str:
    """The likely hours of ``profile`` for people: "weekdays 09–11; Saturdays 10–12", or ""
    when none is likely yet. Days with the same runs of hours are named together."""
    if profile is None or profile.empty:
        return ""
    runs_by_day = []
    for day in range(7):
        runs, start = [], None
        for hour in range(25):
            on = hour < 24 and likely(profile, day * 24 + hour)
            if on and start is None:
                start = hour
            elif not on and start is not None:
                runs.append((start, hour))
                start = None
        runs_by_day.append(tuple(runs))
    groups: dict[tuple, list[int]] = {}
    for day, runs in enumerate(runs_by_day):
        if runs:
            groups.setdefault(runs, []).append(day)
    parts = []
    for runs, days in groups.items():
        if days == list(range(7)):
            who = "every day"
        elif days == [0, 1, 2, 3, 4]:
            who = "weekdays"
        elif days == [5, 6]:
            who = "weekends"
        else:
            who = ", ".join(_DAY_NAMES[d] for d in days)
        hours = ", ".join("all day" if (a, b) == (0, 24) else f"{a:02d}–{b:02d}" for a, b in runs)
        parts.append(f"{who} {hours}")
    return "; ".join(parts)


def _fmt_s(seconds: float) -> str:
    """Seconds to ten minutes (a cold start of 150 s is not "2 min"), then minutes, hours."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
