"""The admin's charts (``/admin/dashboard/charts/``): requests, tokens and TTFT p95 per model,
per API key or per team, and GPU memory and utilisation per agent, over a chosen period, as plain data
that the page draws with Chart.js (``fleet/static/fleet/vendor/chart.js/``) and
``charts/data/`` answers as JSON.

Where the figures come from:

* **Usage** — the gateway's usage records (one row per ``/v1/`` request). ``fleet`` does not
  import ``gateway`` (docs/architecture.md, "Dependency direction"): the URL map, which may
  import anything, hands the records' queryset to the views, and :func:`usage_charts` reads
  it by field name (``at``, ``model_name``, ``key_id``, ``key__name``, ``team_id``,
  ``prompt_tokens``, ``completion_tokens``, ``ttft_ms``); teams' names come the same way
  (a queryset of the gateway's teams). A model name that is in no catalog model's name or
  aliases (a client's ``gpt-4o`` that got 404) is counted in one "unknown model" series, as
  /metrics counts it under "unknown": a client cannot add series to the charts.
* **GPUs** — ``fleet.models.GpuSample``, the agents' periodic per-GPU readings, kept as long
  as usage records (``ClusterSettings.history_retention_days``).

How it is computed: the period is cut into buckets of a size that gives 60–120 points
(:data:`PERIODS`). Counting and summing happen in the database, grouped by bucket number
(:class:`EpochBucket`, seconds since the epoch divided by the bucket size, on SQLite and
PostgreSQL) and by series, so a query returns at most buckets × (:data:`TOP_SERIES` + 1)
rows whatever the traffic. Series are bounded: the :data:`TOP_SERIES` models (or keys, or
agents) with the most requests (GPU memory) in the period, the rest summed as one "other"
series. TTFT p95 is computed here over the records' ``ttft_ms`` (nearest rank), on at most
:data:`TTFT_SAMPLE_MAX` records of the period: with more, every k-th by id (a uniform sample,
k = ceil(count / max)). GPU series are per agent: memory used is the sum over its GPUs of
each GPU's mean in the bucket (GiB), utilisation the mean over its GPUs (%); a bucket with no
reading is a gap, never a zero.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo

from django.db.models import Avg, Case, Count, F, Max, Q, QuerySet, Sum, Value, When
from django.db.models.expressions import Func
from django.db.models.fields import BigIntegerField, IntegerField
from django.db.models.functions import Coalesce
from django.db.utils import NotSupportedError

from fleet.models import GpuSample

#: How many series a chart draws by name; the rest are summed as "other".
TOP_SERIES = 8
#: At most this many records go into the TTFT p95s of one page (a uniform sample beyond).
TTFT_SAMPLE_MAX = 50_000
#: Labels longer than this are cut (a model name can be anything a client sent).
LABEL_MAX_CHARS = 40
BY_MODEL, BY_KEY, BY_TEAM = "model", "key", "team"
BY = (BY_MODEL, BY_KEY, BY_TEAM)
#: The series of records whose model is in no catalog model's name or aliases.
UNKNOWN_MODEL = "unknown model"
DEFAULT_PERIOD = "24h"
MIB_PER_GIB = 1024


class UnknownChoice(ValueError):
    """A period or grouping the charts do not offer; the message names the ones they do."""


@dataclass(frozen=True)
class Period:
    """A span the page offers: ``seconds`` long, cut into buckets of ``bucket_s`` seconds,
    labelled on the x axis with ``label_format`` (strftime, cluster time zone)."""

    key: str
    title: str
    seconds: int
    bucket_s: int
    label_format: str

    @property
    def points(self) -> int:
        """How many buckets the period has."""
        return self.seconds // self.bucket_s

    @property
    def bucket_words(self) -> str:
        """The bucket size in words: "1 min", "15 min", "2 h"."""
        if self.bucket_s % 3600 == 0:
            return f"{self.bucket_s // 3600} h"
        return f"{self.bucket_s // 60} min"


PERIODS: tuple[Period, ...] = (
    Period("1h", "last hour", 3600, 60, "%H:%M"),
    Period("6h", "last 6 hours", 6 * 3600, 5 * 60, "%H:%M"),
    Period("24h", "last 24 hours", 24 * 3600, 15 * 60, "%a %H:%M"),
    Period("7d", "last 7 days", 7 * 86400, 2 * 3600, "%a %d %H:%M"),
    Period("30d", "last 30 days", 30 * 86400, 6 * 3600, "%b %d %H:%M"),
)
_PERIODS = {p.key: p for p in PERIODS}


def period(key: str | None) -> Period:
    """The period named ``key`` (``1h``, ``6h``, ``24h``, ``7d``, ``30d``; None or empty: the
    default, 24 h). Raises :class:`UnknownChoice` for any other."""
    if not key:
        return _PERIODS[DEFAULT_PERIOD]
    try:
        return _PERIODS[key]
    except KeyError:
        raise UnknownChoice(f"Unknown period {key[:40]!r}: choose one of {', '.join(_PERIODS)}.") from None


def grouping(by: str | None) -> str:
    """``model`` (the default, for None or empty), ``key`` or ``team``; :class:`UnknownChoice` else."""
    if not by:
        return BY_MODEL
    if by not in BY:
        raise UnknownChoice(f"Unknown grouping {by[:40]!r}: choose one of {', '.join(BY)}.")
    return by


# --- Pure parts -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """The buckets of a period ending now: ``points`` buckets of ``bucket_s`` seconds from
    ``start`` (aligned on multiples of the bucket size since the epoch; the last one holds
    now)."""

    start: datetime
    bucket_s: int
    points: int

    @property
    def end(self) -> datetime:
        return self.start + timedelta(seconds=self.bucket_s * self.points)

    @property
    def first_bucket(self) -> int:
        """The bucket number (seconds since the epoch // bucket size) of the first bucket."""
        return int(self.start.timestamp()) // self.bucket_s

    def starts(self) -> list[datetime]:
        """Each bucket's start, oldest first."""
        return [self.start + timedelta(seconds=self.bucket_s * i) for i in range(self.points)]


def window(p: Period, now: datetime) -> Window:
    """The buckets of ``p`` up to ``now`` (aware): the last bucket is the one ``now`` falls in."""
    last = int(now.timestamp()) // p.bucket_s
    first = last - p.points + 1
    return Window(datetime.fromtimestamp(first * p.bucket_s, tz=UTC), p.bucket_s, p.points)


def axis_labels(w: Window, label_format: str, tz: tzinfo) -> list[str]:
    """The x axis: each bucket's start in the cluster's time zone."""
    return [start.astimezone(tz).strftime(label_format) for start in w.starts()]


def short_label(text: str, max_chars: int = LABEL_MAX_CHARS) -> str:
    """``text`` on one line, cut to ``max_chars`` with an ellipsis (escaping is the page's
    job: labels reach it through ``json_script`` and are drawn on a canvas, never as HTML)."""
    text = " ".join(str(text).split())
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def top(totals: dict, n: int | None = None) -> list:
    """The ``n`` (default :data:`TOP_SERIES`) keys of ``totals`` with the highest values,
    highest first (ties by key, as text, so the order is stable)."""
    n = TOP_SERIES if n is None else n
    return [k for k, _ in sorted(totals.items(), key=lambda kv: (-kv[1], str(kv[0])))[:n]]


def p95(values: Sequence[float]) -> float | None:
    """The 95th percentile of ``values`` by nearest rank (a value that was measured, never
    an interpolation); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass(frozen=True)
class Series:
    """One line of a chart: its label and one value per bucket (None: nothing measured)."""

    label: str
    data: list[float | None]


@dataclass(frozen=True)
class Chart:
    """One chart: ``series`` over ``labels`` (the x axis), values in ``unit``. ``empty`` is
    the sentence the page shows instead of blank axes when there is nothing to draw."""

    id: str
    title: str
    unit: str
    labels: list[str]
    series: list[Series] = field(default_factory=list)
    empty: str | None = None
    note: str = ""

    def as_json(self) -> dict:
        """The chart as JSON-able data (what ``charts/data/`` answers and the page draws)."""
        return {"id": self.id, "title": self.title, "unit": self.unit, "labels": self.labels, "note": self.note,
                "empty": self.empty, "series": [{"label": s.label, "data": s.data} for s in self.series]}


def fold(rows: Iterable[tuple[int, int, float | None]], points: int, count: int, zero: float | None = 0
         ) -> list[list[float | None]]:
    """Values per series and bucket from ``(bucket offset, series index, value)`` rows:
    ``count`` lists of ``points`` values, ``zero`` where no row falls; rows outside the
    window are dropped, rows for the same cell are summed, None values are skipped."""
    grid: list[list[float | None]] = [[zero] * points for _ in range(count)]
    for offset, index, value in rows:
        if value is None or not (0 <= offset < points and 0 <= index < count):
            continue
        cell = grid[index][offset]
        grid[index][offset] = value if cell is None else cell + value
    return grid


# --- The database -----------------------------------------------------------------------------


class EpochBucket(Func):
    """A datetime column's bucket number: whole seconds since the epoch (UTC) divided by
    ``bucket_s``, rounded down — on SQLite and PostgreSQL, the two databases llmgw runs on."""

    output_field = BigIntegerField()

    def __init__(self, expression, bucket_s: int, **extra) -> None:
        if int(bucket_s) <= 0:
            raise ValueError("bucket_s must be a positive number of seconds")
        self.bucket_s = int(bucket_s)
        super().__init__(expression, **extra)

    def as_sql(self, compiler, connection, **extra):
        raise NotSupportedError(f"EpochBucket supports SQLite and PostgreSQL, not {connection.vendor}")

    def as_sqlite(self, compiler, connection, **extra):
        # Django stores aware datetimes on SQLite as UTC text, which strftime('%s') reads.
        # '%%%%s': the template's formatting makes it '%%s', the driver's a literal '%s'.
        template = f"(CAST(strftime('%%%%s', %(expressions)s) AS INTEGER) / {self.bucket_s})"
        return super().as_sql(compiler, connection, template=template, **extra)

    def as_postgresql(self, compiler, connection, **extra):
        template = f"FLOOR(EXTRACT(EPOCH FROM %(expressions)s) / {self.bucket_s})::bigint"
        return super().as_sql(compiler, connection, template=template, **extra)


class _Unknown:
    """The "unknown model" series among chosen values (names outside ``known``)."""

    def __init__(self, known: frozenset[str]) -> None:
        self.known = known


def _series_index(field_name: str, chosen: Sequence) -> Case:
    """0..len(chosen)-1 for a row whose ``field_name`` is one of ``chosen`` (None matches
    a null; an :class:`_Unknown` every value outside its ``known``), -1 (other) for the rest."""

    def match(value) -> Q:
        if isinstance(value, _Unknown):
            if not value.known:  # an empty catalog: every name (an empty IN would match nothing)
                return Q(pk__isnull=False)
            return ~Q(**{f"{field_name}__in": value.known}) | Q(**{f"{field_name}__isnull": True})
        return Q(**({f"{field_name}__isnull": True} if value is None else {field_name: value}))

    whens = [When(match(value), then=Value(i)) for i, value in enumerate(chosen)]
    return Case(*whens, default=Value(-1), output_field=IntegerField())


def _labels(chosen: list, names: dict, others: int) -> list[str]:
    labels = [short_label(names.get(value, value)) for value in chosen]
    return labels + ([f"other ({others} more)"] if others else [])


def usage_charts(records: QuerySet, p: Period, by: str, now: datetime, tz: tzinfo,
                 catalog_names: Iterable[str] | None = None, teams: QuerySet | None = None) -> list[Chart]:
    """Requests, tokens (prompt + completion) and TTFT p95 (ms) per bucket of ``p`` ending
    at ``now``, one series per model (``by="model"``), per API key (``by="key"``; records
    with no key, from a gateway without keys or a key since deleted, are "no key") or per
    team (``by="team"``; records of keys without a team are "no team", of a team since
    deleted "team #id (deleted)"): the :data:`TOP_SERIES` with the most requests, and
    "other". ``records`` is the gateway's usage records (any queryset with their fields);
    ``catalog_names`` every catalog model's name and aliases: per model, records of any
    other name are one :data:`UNKNOWN_MODEL` series (None: no folding); ``teams`` the
    gateway's teams (``pk``, ``name``), for their names. A few queries and a bounded sample."""
    w = window(p, now)
    labels = axis_labels(w, p.label_format, tz)
    rows = records.filter(at__gte=w.start, at__lt=w.end)
    group = {BY_MODEL: "model_name", BY_KEY: "key_id", BY_TEAM: "team_id"}[by]
    tokens = Coalesce(F("prompt_tokens"), 0) + Coalesce(F("completion_tokens"), 0)
    names: dict = {}
    totals: dict = {}
    if by == BY_MODEL:
        known = None if catalog_names is None else frozenset(catalog_names)
        unknown = _Unknown(known) if known is not None else None
        for row in rows.values("model_name").annotate(n=Count("id")).order_by():
            name = row["model_name"] if known is None or row["model_name"] in known else unknown
            totals[name] = totals.get(name, 0) + row["n"]
        if unknown is not None:
            names[unknown] = UNKNOWN_MODEL
    elif by == BY_TEAM:
        for row in rows.values("team_id").annotate(n=Count("id")).order_by():
            totals[row["team_id"]] = row["n"]
        found = dict(teams.filter(pk__in=[t for t in totals if t is not None]).values_list("pk", "name")
                     ) if teams is not None else {}
        for team_id in totals:
            names[team_id] = ("no team" if team_id is None
                              else found.get(team_id, f"team #{team_id}" + (" (deleted)" if teams is not None else "")))
    else:
        for row in rows.values("key_id", "key__name", "key__prefix").annotate(n=Count("id")).order_by():
            totals[row["key_id"]] = totals.get(row["key_id"], 0) + row["n"]
            names[row["key_id"]] = ("no key" if row["key_id"] is None
                                    else f"{row['key__name']} ({row['key__prefix']}…)")
    words = f"per {by}"
    charts = [Chart("requests", f"Requests {words}", "requests", labels,
                    note=f"requests per {p.bucket_words}, every status"),
              Chart("tokens", f"Tokens {words}", "tokens", labels,
                    note=f"prompt + completion tokens per {p.bucket_words}"),
              Chart("ttft", f"TTFT p95 {words}", "ms", labels,
                    note=f"time to the first token, 95th percentile per {p.bucket_words}")]
    if not totals:
        empty = f"No requests in the {p.title}."
        return [Chart(c.id, c.title, c.unit, labels, empty=empty, note=c.note) for c in charts]

    chosen = top(totals)
    others = len(totals) - len(chosen)
    count = len(chosen) + (1 if others else 0)
    series_labels = _labels(chosen, names, others)
    index = _series_index(group, chosen)
    bucketed = rows.annotate(b=EpochBucket("at", p.bucket_s), s=index)

    def where(i: int) -> int:
        return i if i >= 0 else len(chosen)

    first = w.first_bucket
    counts = list(bucketed.values("b", "s").annotate(n=Count("id"), t=Sum(tokens)).order_by())
    requests = fold(((r["b"] - first, where(r["s"]), r["n"]) for r in counts), w.points, count)
    token_grid = fold(((r["b"] - first, where(r["s"]), r["t"] or 0) for r in counts), w.points, count)

    timed = bucketed.filter(ttft_ms__isnull=False)
    measured = timed.count()
    note = charts[2].note
    if measured > TTFT_SAMPLE_MAX:
        every = math.ceil(measured / TTFT_SAMPLE_MAX)
        timed = timed.annotate(pick=F("id") % every).filter(pick=0)
        note += f"; over every {every}th of {measured:,} records"
    samples: dict[tuple[int, int], list[float]] = defaultdict(list)
    for b, s, ttft in timed.values_list("b", "s", "ttft_ms").order_by():
        samples[(b - first, where(s))].append(ttft)
    ttft_grid = fold(((o, i, _round(p95(v))) for (o, i), v in samples.items()), w.points, count, zero=None)

    charts[0] = Chart("requests", charts[0].title, "requests", labels, _as_series(series_labels, requests),
                      note=charts[0].note)
    charts[1] = Chart("tokens", charts[1].title, "tokens", labels, _as_series(series_labels, token_grid),
                      note=charts[1].note)
    charts[2] = Chart("ttft", charts[2].title, "ms", labels, _as_series(series_labels, ttft_grid), note=note,
                      empty=None if samples else f"No request sent a first token in the {p.title}.")
    return charts


def gpu_charts(p: Period, now: datetime, tz: tzinfo, samples: QuerySet | None = None) -> list[Chart]:
    """GPU memory used (GiB, the sum over an agent's GPUs) and utilisation (%, the mean over
    its GPUs) per agent and bucket of ``p`` ending at ``now``: the :data:`TOP_SERIES` agents
    using the most memory and "other". A bucket with no reading is None (a gap). ``samples``
    defaults to every ``GpuSample``. Two queries; rows ≤ buckets × GPUs of the fleet."""
    w = window(p, now)
    labels = axis_labels(w, p.label_format, tz)
    rows = (samples if samples is not None else GpuSample.objects.all()).filter(at__gte=w.start, at__lt=w.end)
    charts = [Chart("gpu-memory", "GPU memory used per agent", "GiB", labels,
                    note=f"sum over the agent's GPUs of each one's mean per {p.bucket_words}"),
              Chart("gpu-utilisation", "GPU utilisation per agent", "%", labels,
                    note=f"mean over the agent's GPUs per {p.bucket_words}")]
    totals: dict[str, float] = {}
    shape: dict[str, tuple[int, int]] = {}
    for row in rows.values("agent_name").annotate(used=Sum("memory_used_mib"), gpus=Count("index", distinct=True),
                                                  total=Max("memory_total_mib")).order_by():
        totals[row["agent_name"]] = row["used"] or 0
        shape[row["agent_name"]] = (row["gpus"], row["total"] or 0)
    if not totals:
        empty = (f"No GPU readings in the {p.title}. Agents on GPU machines send one every few seconds; "
                 "CPU-only machines send none.")
        return [Chart(c.id, c.title, c.unit, labels, empty=empty, note=c.note) for c in charts]

    chosen = top(totals)
    others = len(totals) - len(chosen)
    count = len(chosen) + (1 if others else 0)
    names = {name: f"{name} ({shape[name][0]}× {shape[name][1] / MIB_PER_GIB:.0f} GiB)" for name in chosen}
    series_labels = _labels(chosen, names, others)
    position = {name: i for i, name in enumerate(chosen)}
    first = w.first_bucket
    memory: dict[tuple[int, int], float] = defaultdict(float)
    utilisation: dict[tuple[int, int], list[float]] = defaultdict(list)
    per_gpu = (rows.annotate(b=EpochBucket("at", p.bucket_s)).values("b", "agent_name", "index")
               .annotate(used=Avg("memory_used_mib"), util=Avg("utilisation_pct")).order_by())
    for row in per_gpu:
        cell = (row["b"] - first, position.get(row["agent_name"], len(chosen)))
        memory[cell] += (row["used"] or 0) / MIB_PER_GIB
        if row["util"] is not None:
            utilisation[cell].append(row["util"])
    memory_grid = fold(((o, i, _round(v)) for (o, i), v in memory.items()), w.points, count, zero=None)
    util_grid = fold(((o, i, _round(sum(v) / len(v))) for (o, i), v in utilisation.items()), w.points, count,
                     zero=None)
    return [Chart(charts[0].id, charts[0].title, "GiB", labels, _as_series(series_labels, memory_grid),
                  note=charts[0].note),
            Chart(charts[1].id, charts[1].title, "%", labels, _as_series(series_labels, util_grid),
                  note=charts[1].note,
                  empty=None if utilisation else f"No agent reported GPU utilisation in the {p.title}.")]


def _as_series(labels: list[str], grid: list[list[float | None]]) -> list[Series]:
    return [Series(label, values) for label, values in zip(labels, grid)]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
