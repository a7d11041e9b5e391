"""Request traces for the fleet simulator: the file format, readers, writers and generators.

A trace is a list of requests, each ``(t_s, model, prompt_tokens, output_tokens)``:
``t_s`` seconds since the trace's start (floats, not necessarily sorted in a file; sorted
once read), ``model`` a catalog name, token counts as integers. A trace also knows the wall
clock instant of ``t_s = 0`` (``start``, aware), so schedule windows line up.

**Prefixes (optional, issue 17).** A request may also carry ``prefix_id`` — a name for the
shared start of its prompt (a tenant's system prompt, a few-shot header, a document asked
about again), any non-empty string — and ``prefix_tokens``, that prefix's length in tokens
(an integer, 0 ≤ ``prefix_tokens`` ≤ ``prompt_tokens``). Both or neither: a request with
neither has no prefix worth caching. The simulator keeps prefixes in per-replica caches
and routes by them (:mod:`fleet.simulation.prefixes`). A trace without the two fields reads
and simulates exactly as before.

File formats (``.gz`` after either suffix is read and written compressed):

* **JSONL** (``.jsonl``): an optional first line ``{"trace": 1, "start": "<ISO 8601>"}``,
  then one object per request::

      {"t_s": 12.5, "model": "llama-3-8b", "prompt_tokens": 512, "output_tokens": 128}
      {"t_s": 13.0, "model": "llama-3-8b", "prompt_tokens": 900, "output_tokens": 64,
       "prefix_id": "tenant-7-system", "prefix_tokens": 700}

* **CSV** (``.csv``): optional ``# start=<ISO 8601>`` comment lines, then the header
  ``t_s,model,prompt_tokens,output_tokens`` and one row per request; with prefixes, two
  more columns ``prefix_id,prefix_tokens``, both empty on a row without a prefix.

* **Usage records** (the gateway's ``UsageRecord`` rows, exported; replayed as a trace):
  JSONL or CSV rows with an absolute time ``at`` (ISO 8601, or Unix seconds; ``timestamp``,
  ``started_at`` and ``created`` are accepted too), ``model`` (or ``model_name``),
  ``prompt_tokens``, ``completion_tokens`` (or ``output_tokens``) and optionally
  ``total_ms``: ``at`` is when the answer ended, so with ``total_ms`` the request arrived that
  much earlier. Times become ``t_s`` from the earliest arrival, which becomes the trace's
  start. :func:`read_trace` recognises them by the missing ``t_s`` column;
  :func:`from_usage` takes the rows straight from the database.

A malformed row is refused with one line naming the file, its line number and the request's
number (``day.csv:7: request 5: ...``): a missing or unreadable field, ``t_s`` negative, not
finite or past a year (:data:`MAX_SPAN_S`), an instant outside 1970–2200, JSON nested
deeper than Python reads, a CSV field over the csv module's limit, a token count outside 0 to :data:`MAX_TOKENS` (int32), a CSV row with more
fields than the header, a string that is not Unicode text (JSON's lone ``\\ud800``), bytes
that are not UTF-8.

Generators (all deterministic for a given ``seed``): :func:`diurnal` (a working day with
office hours), :func:`bursts` (sudden crowds on a few models), :func:`long_tail` (many
rarely used models, visited in short sessions), :func:`constant_rate` (evenly spaced, for
tests) and :func:`merge`. Pure numpy and the standard library; no Django.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np

#: The default instant of ``t_s = 0``: a Monday, midnight UTC (a working day follows).
DEFAULT_START = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
COLUMNS = ("t_s", "model", "prompt_tokens", "output_tokens")
#: The optional per-request prefix columns (module docstring).
PREFIX_COLUMNS = ("prefix_id", "prefix_tokens")
#: ``Trace.prefix`` of a request without a prefix.
NO_PREFIX = -1
#: The most tokens a request's prompt or answer may have: token counts are int32 columns.
MAX_TOKENS = 2**31 - 1
#: The longest trace the simulator replays: a year and a day, in seconds from its start
#: (``t_s``; usage records: their span). A longer one is refused, not run for hours.
MAX_SPAN_S = 366 * 86400
#: The instants a trace may name (its ``start``, a usage record's time): Unix time's start
#: to the year 2200; anything else is a typo or a hostile file, refused in words.
EARLIEST, LATEST = datetime(1970, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC)
_TIME_KEYS = ("at", "timestamp", "started_at", "created")


@dataclass
class Trace:
    """Requests in arrival order, column-wise (numpy arrays of equal length).

    ``t_s``: float64 seconds since ``start``, sorted; ``model``: int32 indices into
    ``names``; ``prompt_tokens`` / ``output_tokens``: int32.

    Prefixes (optional; None when the trace has none, see the module docstring):
    ``prefix``: int32 indices into ``prefix_ids`` (:data:`NO_PREFIX` for a request without
    one); ``prefix_tokens``: int32, the prefix's length in tokens (0 without one). Raises
    ValueError for columns of different lengths, times that are negative or not finite,
    negative token counts, a prefix longer than its prompt, an index
    outside ``prefix_ids``, or a model name or prefix id that is not Unicode text (a lone
    surrogate: UTF-8 cannot encode it, so it could be neither hashed nor written).
    """

    t_s: np.ndarray
    model: np.ndarray
    names: list[str]
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    start: datetime = DEFAULT_START
    description: str = ""
    prefix: np.ndarray | None = None
    prefix_tokens: np.ndarray | None = None
    prefix_ids: list[str] = field(default_factory=list)
    _sorted: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self.t_s = np.asarray(self.t_s, dtype=np.float64)
        self.model = np.asarray(self.model, dtype=np.int32)
        self.prompt_tokens = np.asarray(self.prompt_tokens, dtype=np.int32)
        self.output_tokens = np.asarray(self.output_tokens, dtype=np.int32)
        if not (len(self.t_s) == len(self.model) == len(self.prompt_tokens) == len(self.output_tokens)):
            raise ValueError("trace columns have different lengths")
        if len(self.t_s) and (np.any(self.t_s < 0) or not np.all(np.isfinite(self.t_s))):
            raise ValueError("trace times must be finite and >= 0 seconds")
        if len(self.t_s) and (self.prompt_tokens.min() < 0 or self.output_tokens.min() < 0):
            raise ValueError("a trace's token counts must be >= 0")
        for what, texts in (("model name", self.names), ("prefix id", self.prefix_ids)):
            for text in texts:
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError(f"a trace's {what} must be Unicode text, not {text!r} (a lone surrogate)") from None
        columns = ["t_s", "model", "prompt_tokens", "output_tokens"]
        if (self.prefix is None) != (self.prefix_tokens is None):
            raise ValueError("a trace's prefix and prefix_tokens come together")
        if self.prefix is not None:
            self.prefix = np.asarray(self.prefix, dtype=np.int32)
            self.prefix_tokens = np.asarray(self.prefix_tokens, dtype=np.int32)
            if not (len(self.prefix) == len(self.prefix_tokens) == len(self.t_s)):
                raise ValueError("trace columns have different lengths")
            if len(self.prefix) and (self.prefix.min() < NO_PREFIX or self.prefix.max() >= len(self.prefix_ids)):
                raise ValueError("a trace's prefix indices must point into prefix_ids (or be -1)")
            if np.any(self.prefix_tokens < 0) or np.any(self.prefix_tokens > self.prompt_tokens):
                raise ValueError("a prefix's tokens must be between 0 and its prompt's tokens")
            columns += ["prefix", "prefix_tokens"]
        if not self._sorted:
            order = np.argsort(self.t_s, kind="stable")
            if np.any(order != np.arange(len(order))):
                for name in columns:
                    setattr(self, name, getattr(self, name)[order])
            self._sorted = True

    @property
    def has_prefixes(self) -> bool:
        """Whether the trace carries prefix columns (even if no request has a prefix)."""
        return self.prefix is not None

    def __len__(self) -> int:
        return len(self.t_s)

    @property
    def duration_s(self) -> float:
        """Time of the last arrival (seconds), 0 for an empty trace."""
        return float(self.t_s[-1]) if len(self.t_s) else 0.0

    def counts(self) -> dict[str, int]:
        """Requests per model name."""
        per = np.bincount(self.model, minlength=len(self.names))
        return {name: int(n) for name, n in zip(self.names, per) if n}

    def rows(self) -> Iterable[tuple[float, str, int, int]]:
        """``(t_s, model name, prompt_tokens, output_tokens)`` per request, in time order."""
        names = self.names
        for t, m, p, o in zip(self.t_s.tolist(), self.model.tolist(),
                              self.prompt_tokens.tolist(), self.output_tokens.tolist()):
            yield t, names[m], p, o

    def prefix_rows(self) -> Iterable[tuple[float, str, int, int, str | None, int]]:
        """:meth:`rows` with ``(prefix_id or None, prefix_tokens)`` added; (None, 0) for
        every request of a trace without prefixes."""
        n = len(self)
        pre = self.prefix.tolist() if self.prefix is not None else [NO_PREFIX] * n
        toks = self.prefix_tokens.tolist() if self.prefix_tokens is not None else [0] * n
        ids = self.prefix_ids
        for (t, m, p, o), x, k in zip(self.rows(), pre, toks):
            yield t, m, p, o, (ids[x] if x != NO_PREFIX else None), k


def from_rows(rows: Iterable[Sequence], start: datetime = DEFAULT_START, description: str = "") -> Trace:
    """A trace from ``(t_s, model, prompt_tokens, output_tokens)`` rows, in any order, or
    ``(t_s, model, prompt_tokens, output_tokens, prefix_id, prefix_tokens)`` rows (prefix_id
    None or "" for a request without a prefix, then prefix_tokens is ignored). The trace has
    prefix columns when any row has six fields. Raises ValueError as :class:`Trace` does."""
    index: dict[str, int] = {}
    prefixes: dict[str, int] = {}
    t_s, model, prompt, output, prefix, prefix_tokens = [], [], [], [], [], []
    with_prefixes = False
    for row in rows:
        t, name, p, o = row[:4]
        t_s.append(float(t))
        model.append(index.setdefault(str(name), len(index)))
        prompt.append(int(p))
        output.append(int(o))
        pid = row[4] if len(row) > 4 else None
        if len(row) > 4:
            with_prefixes = True
        if pid is None or pid == "":
            prefix.append(NO_PREFIX)
            prefix_tokens.append(0)
        else:
            prefix.append(prefixes.setdefault(str(pid), len(prefixes)))
            prefix_tokens.append(int(row[5]))
    try:
        counts = [np.array(column, dtype=np.int32) for column in (prompt, output, prefix_tokens)]
    except OverflowError:
        raise ValueError(f"token counts must be between 0 and {MAX_TOKENS:,} (int32)") from None
    return Trace(np.array(t_s, dtype=np.float64), np.array(model, dtype=np.int32), list(index),
                 counts[0], counts[1], start, description,
                 np.array(prefix, dtype=np.int32) if with_prefixes else None,
                 counts[2] if with_prefixes else None, list(prefixes))


def merge(*traces: Trace, description: str = "") -> Trace:
    """One trace holding every request of ``traces`` (which must share a start), by time."""
    if not traces:
        raise ValueError("merge() needs at least one trace")
    start = traces[0].start
    index: dict[str, int] = {}
    prefixes: dict[str, int] = {}
    with_prefixes = any(tr.has_prefixes for tr in traces)
    parts = []
    for tr in traces:
        if tr.start != start:
            raise ValueError("traces to merge must share their start instant")
        remap = np.array([index.setdefault(n, len(index)) for n in tr.names] or [0], dtype=np.int32)
        part = [tr.t_s, remap[tr.model] if len(tr) else tr.model, tr.prompt_tokens, tr.output_tokens]
        if with_prefixes:
            if tr.prefix is None:
                part += [np.full(len(tr), NO_PREFIX, dtype=np.int32), np.zeros(len(tr), dtype=np.int32)]
            else:
                # One slot more, at the end, so that NO_PREFIX (-1) maps to itself.
                pmap = np.array([prefixes.setdefault(x, len(prefixes)) for x in tr.prefix_ids] + [NO_PREFIX],
                                dtype=np.int32)
                part += [pmap[tr.prefix], tr.prefix_tokens]
        parts.append(part)
    cat = [np.concatenate([p[i] for p in parts]) for i in range(len(parts[0]))]
    return Trace(cat[0], cat[1], list(index), cat[2], cat[3], start,
                 description or " + ".join(t.description for t in traces if t.description),
                 cat[4] if with_prefixes else None, cat[5] if with_prefixes else None, list(prefixes))


# --- Files ---------------------------------------------------------------------------------


def _open_text(path: Path, mode: str):
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, mode + "b"), encoding="utf-8", newline="")
    return open(path, mode, encoding="utf-8", newline="")


def _kind(path: Path) -> str:
    name = path.name.removesuffix(".gz")
    if name.endswith(".csv"):
        return "csv"
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    raise ValueError(f"{path}: unknown trace format (use .jsonl or .csv, optionally .gz)")


def write_trace(trace: Trace, path: str | Path) -> Path:
    """Write ``trace`` as JSONL or CSV (by suffix) with its start instant; returns the path."""
    path = Path(path)
    kind = _kind(path)
    with _open_text(path, "w") as f:
        if kind == "jsonl":
            f.write(json.dumps({"trace": 1, "start": trace.start.isoformat(), "description": trace.description}) + "\n")
            quoted = [json.dumps(n) for n in trace.names]
            if not trace.has_prefixes:
                f.writelines(
                    f'{{"t_s": {t:.6f}, "model": {quoted[m]}, "prompt_tokens": {p}, "output_tokens": {o}}}\n'
                    for t, m, p, o in zip(trace.t_s.tolist(), trace.model.tolist(),
                                          trace.prompt_tokens.tolist(), trace.output_tokens.tolist())
                )
            else:
                f.writelines(
                    f'{{"t_s": {t:.6f}, "model": {json.dumps(m)}, "prompt_tokens": {p}, "output_tokens": {o}'
                    + ("" if pid is None else f', "prefix_id": {json.dumps(pid)}, "prefix_tokens": {k}') + "}\n"
                    for t, m, p, o, pid, k in trace.prefix_rows()
                )
        else:
            f.write(f"# start={trace.start.isoformat()}\n")
            writer = csv.writer(f, lineterminator="\n")
            if not trace.has_prefixes:
                writer.writerow(COLUMNS)
                names = trace.names
                writer.writerows(
                    (f"{t:.6f}", names[m], p, o)
                    for t, m, p, o in zip(trace.t_s.tolist(), trace.model.tolist(),
                                          trace.prompt_tokens.tolist(), trace.output_tokens.tolist())
                )
            else:
                writer.writerow(COLUMNS + PREFIX_COLUMNS)
                writer.writerows((f"{t:.6f}", m, p, o, "" if pid is None else pid, "" if pid is None else k)
                                 for t, m, p, o, pid, k in trace.prefix_rows())
    return path


def _parse_instant(value) -> datetime:
    """An ISO 8601 instant (naive: UTC) or Unix seconds, between :data:`EARLIEST` and
    :data:`LATEST`; ValueError in words for anything else (never Python's own message)."""
    words = f"an ISO 8601 instant or Unix seconds between 1970 and 2200, not {value!r}"
    try:
        if isinstance(value, (int, float)) or (isinstance(value, str) and value.replace(".", "", 1).isdigit()):
            when = datetime.fromtimestamp(float(value), UTC)
        else:
            when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
            when = when if when.tzinfo else when.replace(tzinfo=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        raise ValueError(words) from None
    if not EARLIEST <= when < LATEST:
        raise ValueError(words)
    return when


def _read_text(path: Path) -> io.StringIO:
    """The file's text (gunzipped for ``.gz``), to read line by line as a file opened with
    ``newline=""`` reads; ValueError naming the line for bytes that are not UTF-8."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise ValueError(f"{path}: not a whole gzip file ({exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text ({exc.reason}: {data[exc.start:exc.end]!r})") from None
    return io.StringIO(text, newline="")


def _lone_surrogate(row: dict) -> str | None:
    """What is wrong with the first key or string value of ``row`` that is no Unicode text
    (a lone surrogate such as JSON's ``"\\ud800"``, which UTF-8 cannot encode), or None."""
    for key, value in row.items():
        for text in (key, value):
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    return f"{key!r} is not Unicode text (a lone surrogate in {text!r})"
    return None


def _records(path: Path) -> tuple[dict, list[dict], list[int]]:
    """(header, rows as dicts, each row's line number in the file) of a JSONL or CSV file.
    ValueError, naming the line, for bytes that are not UTF-8 or JSON, a line that is not
    an object, or a string that is not Unicode text (a lone surrogate)."""
    header: dict = {}
    rows: list[dict] = []
    numbers: list[int] = []
    with _read_text(path) as f:
        if _kind(path) == "jsonl":
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
                except RecursionError:
                    raise ValueError(f"{path}:{number}: not JSON this reader takes: nested too deeply") from None
                if not isinstance(obj, dict):
                    raise ValueError(f"{path}:{number}: expected an object")
                # Only a \u escape makes a lone surrogate (UTF-8 text has none): skip the walk without one.
                escaped = "\\u" in line
                if "model" not in obj and not rows:
                    problem = escaped and _lone_surrogate(obj)
                    if problem:
                        raise ValueError(f"{path}:{number}: header: {problem}")
                    header = obj
                    continue
                problem = escaped and _lone_surrogate(obj)
                if problem:
                    what = "request" if "t_s" in (rows[0] if rows else obj) else "record"
                    raise ValueError(f"{path}:{number}: {what} {len(rows) + 1}: {problem}")
                rows.append(obj)
                numbers.append(number)
        else:
            lines, physical = [], []
            for number, line in enumerate(f, 1):
                if line.startswith("#"):
                    key, _, value = line[1:].strip().partition("=")
                    header[key.strip()] = value.strip()
                else:
                    lines.append(line)
                    physical.append(number)
            reader = csv.DictReader(lines)
            rows_read = iter(reader)
            while True:
                try:
                    row = next(rows_read)
                except StopIteration:
                    break
                except csv.Error as exc:  # a field over the csv module's size limit, a NUL byte
                    # line_num counts the lines parsed whole: the bad one is the next.
                    where = physical[min(reader.line_num, len(physical) - 1)] if physical else 1
                    raise ValueError(f"{path}:{where}: not CSV this reader takes: {exc}") from None
                number = physical[reader.line_num - 1]
                if None in row:  # DictReader's restkey: fields beyond the header's columns
                    columns = reader.fieldnames or []
                    what = "request" if "t_s" in columns else "record"
                    extra = len(row[None])
                    raise ValueError(f"{path}:{number}: {what} {len(rows) + 1}: {extra} more field"
                                     f"{'s' if extra != 1 else ''} than the header's {len(columns)} columns "
                                     f"({','.join(columns)})")
                rows.append(row)
                numbers.append(number)
    return header, rows, numbers


def _prefix_of(row: dict, prompt_tokens: int, from_json: bool) -> tuple[str | None, int]:
    """A row's ``(prefix_id, prefix_tokens)``, (None, 0) without a prefix; ValueError saying
    what is wrong (both or neither; a non-empty string; an integer within the prompt)."""
    pid, tokens = row.get("prefix_id"), row.get("prefix_tokens")
    if pid in (None, "") and tokens in (None, ""):
        return None, 0
    if pid in (None, "") or tokens in (None, ""):
        raise ValueError("prefix_id and prefix_tokens come together (give both or neither)")
    if not isinstance(pid, str):
        raise ValueError(f"prefix_id must be a string, not {pid!r}")
    if from_json and (isinstance(tokens, bool) or not isinstance(tokens, int)):
        raise ValueError(f"prefix_tokens must be an integer, not {tokens!r}")
    try:
        count = int(tokens)
    except ValueError:
        raise ValueError(f"prefix_tokens must be an integer, not {tokens!r}") from None
    if not 0 <= count <= prompt_tokens:
        raise ValueError(f"prefix_tokens ({count}) must be between 0 and prompt_tokens ({prompt_tokens})")
    return pid, count


def read_trace(path: str | Path) -> Trace:
    """Read a trace file, or a usage-record export (see the module docstring); with the
    optional ``prefix_id`` / ``prefix_tokens`` fields the trace has prefixes.

    Raises ValueError, one line naming the file, the line and the request, for a malformed row."""
    path = Path(path)
    header, rows, numbers = _records(path)
    if rows and "t_s" not in rows[0]:
        return _from_usage_rows(path, rows, numbers)
    try:
        start = _parse_instant(header["start"]) if header.get("start") else DEFAULT_START
    except ValueError as exc:
        raise ValueError(f"{path}: header: start must be {str(exc)}") from None
    from_json = _kind(path) == "jsonl"
    with_prefixes = any(k in row for row in rows for k in PREFIX_COLUMNS) if from_json else (
        bool(rows) and any(k in rows[0] for k in PREFIX_COLUMNS))

    def parsed():
        for number, (line, row) in enumerate(zip(numbers, rows), 1):
            try:
                t, model = _number(row, "t_s", "a number of seconds"), _name(row, "model")
                prompt, output = _whole(row, "prompt_tokens"), _whole(row, "output_tokens")
            except ValueError as exc:
                raise ValueError(f"{path}:{line}: request {number}: {exc}") from None
            problem = _out_of_range(t=t, prompt_tokens=prompt, output_tokens=output)
            if problem:
                raise ValueError(f"{path}:{line}: request {number}: {problem}")
            if not with_prefixes:
                yield t, model, prompt, output
                continue
            try:
                pid, tokens = _prefix_of(row, prompt, from_json)
            except ValueError as exc:
                raise ValueError(f"{path}:{line}: request {number}: {exc}") from None
            yield t, model, prompt, output, pid, tokens

    return from_rows(parsed(), start, str(header.get("description") or path.name))


def _out_of_range(t: float | None = None, **tokens: int | None) -> str | None:
    """What is out of range in a row's ``t`` (seconds: finite, ≥ 0) and token counts (0 to
    :data:`MAX_TOKENS`, None: not given), or None."""
    if t is not None and not (math.isfinite(t) and 0 <= t <= MAX_SPAN_S):
        return f"t_s ({t:g}) must be between 0 and {MAX_SPAN_S:,} seconds (the simulator replays a year at most)"
    for key, count in tokens.items():
        if count is not None and not 0 <= count <= MAX_TOKENS:
            return f"{key} ({count:,}) must be between 0 and {MAX_TOKENS:,}"
    return None


def _from_usage_rows(path: Path, rows: list[dict], numbers: list[int]) -> Trace:
    records = []
    for number, (line, row) in enumerate(zip(numbers, rows), 1):
        try:
            key = next((k for k in _TIME_KEYS if row.get(k) not in (None, "")), None)
            if key is None:
                raise _missing("at", _USAGE_NEEDS)
            try:
                at = _parse_instant(row[key])
            except ValueError as exc:
                raise ValueError(f"{key} must be {exc}") from None
            model = _name(row, "model" if row.get("model") not in (None, "") else "model_name", _USAGE_NEEDS)
            out_key = "completion_tokens" if "completion_tokens" in row else "output_tokens"
            total = row.get("total_ms")
            record = (at, model, _whole(row, "prompt_tokens", optional=True), _whole(row, out_key, optional=True),
                      _number(row, "total_ms", "a finite number of milliseconds", finite=True) if total not in (None, "") else None)
        except ValueError as exc:
            raise ValueError(f"{path}:{line}: record {number}: {exc}") from None
        problem = _out_of_range(prompt_tokens=record[2], completion_tokens=record[3])
        if record[4] is not None and not 0 <= record[4] <= MAX_SPAN_S * 1000:
            problem = f"total_ms ({record[4]:g}) must be between 0 and {MAX_SPAN_S * 1000:,}"
        if problem:
            raise ValueError(f"{path}:{line}: record {number}: {problem}")
        records.append(record)
    if records:
        first = min(range(len(records)), key=lambda k: records[k][0] - timedelta(milliseconds=records[k][4] or 0))
        last = max(range(len(records)), key=lambda k: records[k][0])
        span_s = (records[last][0] - records[first][0]).total_seconds() + (records[first][4] or 0) / 1000
        if span_s > MAX_SPAN_S:
            raise ValueError(f"{path}:{numbers[last]}: record {last + 1}: the records span {span_s / 86400:,.0f} days "
                             f"(from line {numbers[first]}); the simulator replays a year at most")
    return from_usage(records, f"usage records replayed from {path.name}")


#: What a usage record needs, for the message on one that lacks it.
_USAGE_NEEDS = "at (or timestamp), model (or model_name), prompt_tokens, completion_tokens"


def _missing(key: str, needs: str | None = None) -> ValueError:
    return ValueError(f"{key} is missing (a {'usage record' if needs else 'request'} needs "
                      f"{needs or ', '.join(COLUMNS)})")


def _number(row: dict, key: str, what: str, finite: bool = False) -> float:
    """``row[key]`` as a float (a JSON number or a CSV field; ``finite``: not inf or nan);
    ValueError saying what is wrong in words (missing, not a number), never Python's own
    message."""
    value = row.get(key)
    if value is None or value == "":
        raise _missing(key)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{key} must be {what}, not {value!r}")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise ValueError(f"{key} must be {what}, not {value!r}") from None
    if finite and not math.isfinite(number):
        raise ValueError(f"{key} must be {what}, not {value!r}")
    return number


def _whole(row: dict, key: str, optional: bool = False) -> int | None:
    """``row[key]`` as a whole number (``12``, ``12.0``; not ``1.5``, ``true`` or ``"ten"``);
    None for a missing one when ``optional``; ValueError in words otherwise."""
    value = row.get(key)
    if value is None or value == "":
        if optional:
            return None
        raise _missing(key)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{key} must be a whole number, not {value!r}")
    if isinstance(value, int):
        return value
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise ValueError(f"{key} must be a whole number, not {value!r}") from None
    if not (math.isfinite(number) and number.is_integer()):
        raise ValueError(f"{key} must be a whole number, not {value!r}")
    return int(number)


def _name(row: dict, key: str, needs: str | None = None) -> str:
    """``row[key]`` as a model name: a non-empty string; ValueError in words otherwise."""
    value = row.get(key)
    if value is None or value == "":
        raise _missing(key, needs)
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string (a catalog name), not {value!r}")
    return value


def from_usage(records: Iterable[tuple[datetime, str, int | None, int | None, float | None]],
               description: str = "usage records") -> Trace:
    """A trace from usage records as the gateway stores them (``gateway.models.UsageRecord``):
    ``(at, model, prompt_tokens, completion_tokens, total_ms)``. ``at`` is when the answer
    ended, so a request arrived ``total_ms`` earlier (when known). Token counts the record
    lacks (a request answered with an error) are the model's median over its records that
    have them (else 256 prompt, 128 output). The earliest arrival becomes the start."""
    rows = []
    known: dict[str, tuple[list[int], list[int]]] = {}
    for at, model, prompt, output, total_ms in records:
        arrived = at - timedelta(milliseconds=total_ms) if total_ms else at
        rows.append((arrived, model, prompt, output))
        seen = known.setdefault(model, ([], []))
        if prompt is not None:
            seen[0].append(prompt)
        if output is not None:
            seen[1].append(output)
    if not rows:
        return from_rows([], DEFAULT_START, description)
    medians = {m: (int(np.median(p)) if p else 256, int(np.median(o)) if o else 128) for m, (p, o) in known.items()}
    start = min(r[0] for r in rows)
    return from_rows((((at - start).total_seconds(), m, medians[m][0] if p is None else p,
                       medians[m][1] if o is None else o) for at, m, p, o in rows), start, description)


# --- Generators ----------------------------------------------------------------------------


def zipf_weights(n: int, s: float = 1.1) -> np.ndarray:
    """Popularity of ``n`` models by rank (rank 1 first), ∝ 1/rank^s, summing to 1."""
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return w / w.sum()


def office_hours_rate(local_hours: np.ndarray, weekdays: np.ndarray, office: tuple[float, float] = (9.0, 18.0),
                      night: float = 0.1, ramp_h: float = 1.0, weekends: float | None = None) -> np.ndarray:
    """Relative arrival rate (1 = office-hours peak) at local hours of day ``local_hours``
    (0–24, floats) on ``weekdays`` (Monday 0): ``night`` outside office hours, raised-cosine
    ramps of ``ramp_h`` hours around ``office = (start, end)``, a 20% dip over lunch. On
    Saturday and Sunday the whole day runs at ``weekends`` (default: ``night``)."""
    start, end = office
    h = np.asarray(local_hours, dtype=np.float64)
    up = np.clip((h - (start - ramp_h / 2)) / ramp_h, 0, 1)
    down = np.clip(((end + ramp_h / 2) - h) / ramp_h, 0, 1)
    bump = (0.5 - 0.5 * np.cos(np.pi * up)) * (0.5 - 0.5 * np.cos(np.pi * down))
    lunch = 1.0 - 0.2 * np.exp(-(((h - 12.75) / 0.6) ** 2))
    rate = night + (1.0 - night) * bump * lunch
    weekend_level = night if weekends is None else weekends
    return np.where(np.asarray(weekdays) >= 5, weekend_level, rate)


def _bin_hours(start: datetime, n_bins: int, bin_s: float, tz: str) -> tuple[np.ndarray, np.ndarray]:
    """Local hour of day and weekday at the middle of each ``bin_s`` bin from ``start``."""
    zone = ZoneInfo(tz)
    hours = np.empty(n_bins)
    days = np.empty(n_bins, dtype=np.int8)
    for i in range(n_bins):
        local = (start + timedelta(seconds=(i + 0.5) * bin_s)).astimezone(zone)
        hours[i] = local.hour + local.minute / 60 + local.second / 3600
        days[i] = local.weekday()
    return hours, days


def _arrivals(rng: np.random.Generator, n: int, rate: np.ndarray, bin_s: float) -> np.ndarray:
    """``n`` arrival times (seconds, sorted) with density ∝ ``rate`` per bin of ``bin_s``."""
    p = rate / rate.sum()
    per_bin = rng.multinomial(n, p)
    starts = np.repeat(np.arange(len(rate), dtype=np.float64) * bin_s, per_bin)
    return np.sort(starts + rng.random(n) * bin_s)


def _tokens(rng: np.random.Generator, n: int, median: float, sigma: float, low: int, high: int) -> np.ndarray:
    return np.clip(np.rint(rng.lognormal(math.log(median), sigma, n)), low, high).astype(np.int32)


def diurnal(names: Sequence[str], requests: int, *, seed: int = 0, weights: Sequence[float] | None = None,
            days: float = 1.0, office: tuple[float, float] = (9.0, 18.0), night: float = 0.1,
            tz: str = "UTC", start: datetime = DEFAULT_START, prompt_median: float = 600,
            output_median: float = 180, sigma: float = 0.9) -> Trace:
    """``requests`` requests over ``days`` days following office hours (see
    :func:`office_hours_rate`), each for a model drawn by ``weights`` (default Zipf 1.1 by
    the order of ``names``). Token counts are log-normal around the medians (clipped to
    1–32,768 prompt, 1–4,096 output)."""
    rng = np.random.default_rng(seed)
    bin_s = 60.0
    n_bins = max(1, int(round(days * 86400 / bin_s)))
    hours, weekdays = _bin_hours(start, n_bins, bin_s, tz)
    rate = office_hours_rate(hours, weekdays, office, night)
    p = np.asarray(weights, dtype=np.float64) if weights is not None else zipf_weights(len(names))
    t = _arrivals(rng, requests, rate, bin_s)
    model = rng.choice(len(names), size=requests, p=p / p.sum()).astype(np.int32)
    return Trace(t, model, list(names), _tokens(rng, requests, prompt_median, sigma, 1, 32768),
                 _tokens(rng, requests, output_median, sigma, 1, 4096), start,
                 f"diurnal: {requests} requests over {days:g} day(s), office hours {office[0]:g}–{office[1]:g} {tz}",
                 _sorted=True)


def bursts(names: Sequence[str], *, seed: int = 0, count: int = 10, size: int = 200, length_s: float = 60.0,
           duration_s: float = 86400.0, start: datetime = DEFAULT_START, prompt_median: float = 600,
           output_median: float = 180, sigma: float = 0.9) -> Trace:
    """``count`` bursts at uniformly random times within ``duration_s``, each of ``size``
    requests spread evenly at random over ``length_s`` seconds, for one model drawn
    uniformly from ``names`` (a batch job, a demo, a new integration going live)."""
    rng = np.random.default_rng(seed)
    at = np.sort(rng.random(count) * max(duration_s - length_s, 0.0))
    which = rng.integers(0, len(names), count)
    t = (np.repeat(at, size) + rng.random(count * size) * length_s)
    model = np.repeat(which, size).astype(np.int32)
    n = count * size
    return Trace(t, model, list(names), _tokens(rng, n, prompt_median, sigma, 1, 32768),
                 _tokens(rng, n, output_median, sigma, 1, 4096), start,
                 f"bursts: {count} × {size} requests in {length_s:g} s")


def long_tail(names: Sequence[str], *, seed: int = 0, sessions_per_day: float = 3.0, requests_per_session: float = 4.0,
              think_s: float = 40.0, days: float = 1.0, office: tuple[float, float] = (9.0, 18.0), night: float = 0.1,
              tz: str = "UTC", start: datetime = DEFAULT_START, prompt_median: float = 800,
              output_median: float = 250, sigma: float = 0.9) -> Trace:
    """Rarely used models: each model in ``names`` gets a Poisson number of sessions
    (mean ``sessions_per_day`` per day, at office-hours-weighted times); a session is
    1 + Poisson(``requests_per_session`` − 1) requests, ``think_s`` apart on average
    (exponential gaps) — someone trying a model with a few questions."""
    rng = np.random.default_rng(seed)
    bin_s = 60.0
    n_bins = max(1, int(round(days * 86400 / bin_s)))
    hours, weekdays = _bin_hours(start, n_bins, bin_s, tz)
    rate = office_hours_rate(hours, weekdays, office, night)
    n_sessions = rng.poisson(sessions_per_day * days, len(names))
    total = int(n_sessions.sum())
    session_start = _arrivals(rng, total, rate, bin_s)
    rng.shuffle(session_start)
    session_model = np.repeat(np.arange(len(names), dtype=np.int32), n_sessions)
    sizes = 1 + rng.poisson(max(requests_per_session - 1, 0.0), total)
    n = int(sizes.sum())
    firsts = np.cumsum(sizes) - sizes
    gaps = rng.exponential(think_s, n)
    gaps[firsts] = 0.0  # the first request of a session starts it
    elapsed = np.cumsum(gaps)
    within = elapsed - np.repeat(elapsed[firsts], sizes)
    t = np.repeat(session_start, sizes) + within
    return Trace(t, np.repeat(session_model, sizes), list(names), _tokens(rng, n, prompt_median, sigma, 1, 32768),
                 _tokens(rng, n, output_median, sigma, 1, 4096), start,
                 f"long tail: {len(names)} models, {total} sessions, {n} requests")


def constant_rate(name: str, rate_per_s: float, from_s: float, to_s: float, *, prompt_tokens: int = 100,
                  output_tokens: int = 100, start: datetime = DEFAULT_START) -> Trace:
    """Evenly spaced requests for one model: ``rate_per_s`` per second from ``from_s``
    (inclusive) to ``to_s`` (exclusive), every one the same size. For tests and what-ifs."""
    n = max(0, int(math.ceil((to_s - from_s) * rate_per_s - 1e-9)))
    t = from_s + np.arange(n, dtype=np.float64) / rate_per_s
    return Trace(t, np.zeros(n, dtype=np.int32), [name], np.full(n, prompt_tokens), np.full(n, output_tokens),
                 start, f"{name}: {rate_per_s:g}/s from {from_s:g} s to {to_s:g} s")
