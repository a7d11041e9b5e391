"""Prometheus metrics of this web process (``/metrics``). Labels are bounded: model names
come from the catalog (anything else is ``unknown``), statuses are HTTP codes, teams and
keys are catalog rows named at scrape time (:class:`TokenCounts`). With several web processes
(``llmgw.metrics``: multiprocess mode) a scrape sums every process's: the gauges are
``livesum`` (the live processes' values added up), the token counts read their sums at scrape
time."""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

from llmgw import integers
from llmgw import metrics as process_metrics
from llmgw.metrics import REGISTRY, read_database

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
#: Holds last from a refresh (tens of ms: a warm replica) to the cold-start timeout (minutes).
_HOLD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_TOKENS = ("llmgw_tokens", "Tokens of answered requests, by model, the key's team and kind (prompt, completion).")
_KEY_TOKENS = ("llmgw_key_tokens", "Tokens of answered requests, by key (its name and visible prefix) and kind "
               "(prompt, completion).")

REQUESTS = Counter("llmgw_requests", "Requests answered under /v1/, by model and HTTP status.",
                   ["model", "status"], registry=REGISTRY)
TTFT = Histogram("llmgw_time_to_first_token_seconds", "Time to the first streamed byte (or the whole answer).",
                 ["model"], buckets=_LATENCY_BUCKETS, registry=REGISTRY)
LATENCY = Histogram("llmgw_request_duration_seconds", "Total time of a request.", ["model"],
                    buckets=_LATENCY_BUCKETS, registry=REGISTRY)
OVERHEAD = Histogram("llmgw_gateway_overhead_seconds", "The gateway's own work before the upstream call (time "
                     "waiting for an admission slot, a replica or the engine's tokenizer left out).",
                     buckets=_OVERHEAD_BUCKETS, registry=REGISTRY)
#: Gauges: summed over this machine's live web processes when there are several.
_LIVESUM = "livesum"
IN_FLIGHT = Gauge("llmgw_requests_in_flight", "Requests with an upstream call under way now (from the call to the "
                  "answer's last byte; JSON and streamed).", ["model"], registry=REGISTRY,
                  multiprocess_mode=_LIVESUM)
#: The total over models, kept for dashboards already scraping it (``llmgw_requests_held`` has them apart).
HELD = Gauge("llmgw_requests_held_for_cold_start", "Requests waiting for a replica to become ready.",
             registry=REGISTRY, multiprocess_mode=_LIVESUM)
ROUTING = Counter("llmgw_routing_decisions", "Replica choices, by model, routing policy and outcome: hit (the replica "
                  "the prefix or session prefers), spill (that one was over the load bound), unkeyed (no prefix "
                  "block nor session: least-loaded), least-loaded (the policy).",
                  ["model", "policy", "outcome"], registry=REGISTRY)
HELD_BY_MODEL = Gauge("llmgw_requests_held", "Requests held now for a replica of the model to become ready (cold start).",
                      ["model"], registry=REGISTRY, multiprocess_mode=_LIVESUM)
HOLD_TIME = Histogram("llmgw_request_hold_seconds", "How long a request was held for a replica to become ready, "
                      "whatever ended the hold (a route, an answer, the cold-start timeout, the client leaving).",
                      ["model"], buckets=_HOLD_BUCKETS, registry=REGISTRY)
QUEUED = Gauge("llmgw_requests_queued", "Requests waiting now in the model's admission queue (this machine's web "
               "processes together).", ["model"], registry=REGISTRY, multiprocess_mode=_LIVESUM)

_children: dict[tuple, object] = {}


def child(metric, *labels: str):
    """``metric.labels(*labels)``, kept: the same child for the same labels without
    ``labels()``' lock, checks and tuple building on every request (the labels are bounded:
    catalog names, HTTP statuses, policies and outcomes). Children are never removed from
    the gateway's metrics, so a kept one is always the one ``/metrics`` reads."""
    key = (id(metric), labels)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*labels)
    return found


#: The ``team`` label of a key without a team (or no key: authentication off), and of a
#: team or key deleted since its tokens were counted.
NO_TEAM = "none"
ANONYMOUS = "anonymous"
DELETED = "deleted"

#: Multiprocess mode: each process's token counts by ids, summed at scrape time and labelled
#: there (never on ``/metrics`` itself: ``llmgw.metrics.INTERNAL``).
_RAW_TOKENS_NAME = "llmgw_internal_tokens"
_RAW_TOKENS = Counter(_RAW_TOKENS_NAME, "Tokens by model, team id and key id (read by TokenCounts).",
                      ["model", "team_id", "key_id", "kind"], registry=None)
process_metrics.INTERNAL.add(_RAW_TOKENS_NAME)


def _id_label(value: int | None) -> str:
    return "" if value is None else str(value)


def _id_of(label: str) -> int | None:
    return int(label) if label else None


class TokenCounts:
    """Prompt and completion tokens this process recorded (``gateway.usage``), counted in
    memory by (model, team id, key id) and labelled at scrape time with the team's and key's
    names (two queries): ``llmgw_tokens_total{model, team, kind}`` and
    ``llmgw_key_tokens_total{key, key_prefix, kind}``, ``kind`` being ``prompt`` or
    ``completion``.

    Labels stay bounded: models, teams and keys are catalog rows. A key is labelled by its
    name and its visible prefix, so each key has a series of its own whose count never
    goes down (keys may share a name: summed by name alone, a key renamed or deleted would
    take its tokens out of the sum, which Prometheus reads as a counter reset); ``sum by
    (key)`` adds up keys of one name. A key without a team counts under ``team="none"``, no
    key (authentication off) under ``key="anonymous"``, a team or key deleted since under
    ``deleted`` (key prefix ``""``).

    While the database cannot be reached the names last read are used; a team or key never
    named yet leaves both series out of that scrape (a sum missing some counts would read
    as a counter reset).

    Several web processes (multiprocess mode): each adds to a raw counter by ids in its own
    file, and :meth:`collect` labels the sum over every process."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, int | None, int | None], list[int]] = {}
        self._lock = threading.Lock()  # add() on the event loop, collect() in a worker thread
        #: The labels last read for team ids and key ids (``deleted`` included).
        self._team_names: dict[int, str] = {}
        self._key_names: dict[int, tuple[str, str]] = {}

    def add(self, model: str, team_id: int | None, key_id: int | None, prompt_tokens: int | None,
            completion_tokens: int | None) -> None:
        """Count one request's tokens; a count that is not one (None: not known; anything
        but a non-negative integer) counts nothing, and raises nothing. ``model`` is its
        catalog name (a request that reached no model has no tokens to count)."""
        prompt, completion = integers.count_or_none(prompt_tokens), integers.count_or_none(completion_tokens)
        if not prompt and not completion:
            return
        if process_metrics.MULTIPROCESS_DIR is not None:
            ids = (str(model), _id_label(team_id), _id_label(key_id))
            if prompt:
                _RAW_TOKENS.labels(*ids, "prompt").inc(prompt)
            if completion:
                _RAW_TOKENS.labels(*ids, "completion").inc(completion)
            return
        with self._lock:
            counts = self._counts.setdefault((str(model), team_id, key_id), [0, 0])
            counts[0] += prompt or 0
            counts[1] += completion or 0

    def describe(self):
        # No database at registration (it happens at import, maybe in async code).
        yield CounterMetricFamily(*_TOKENS, labels=["model", "team", "kind"])
        yield CounterMetricFamily(*_KEY_TOKENS, labels=["key", "key_prefix", "kind"])

    def _names(self, team_ids: set[int], key_ids: set[int]) -> tuple[dict[int, str], dict[int, tuple[str, str]]]:
        """The labels of ``team_ids`` and ``key_ids`` read now (two queries at most), kept
        as the last known."""
        # lazy: this module (and the registry) is imported before the apps are ready.
        from gateway.models import ApiKey, Team

        teams = dict(Team.objects.filter(pk__in=team_ids).values_list("id", "name")) if team_ids else {}
        keys = ({pk: (name, prefix) for pk, name, prefix in
                 ApiKey.objects.filter(pk__in=key_ids).values_list("id", "name", "prefix")} if key_ids else {})
        teams = {team: teams.get(team, DELETED) for team in team_ids}
        keys = {key: keys.get(key, (DELETED, "")) for key in key_ids}
        self._team_names.update(teams)
        self._key_names.update(keys)
        return teams, keys

    def _counts_now(self) -> dict[tuple[str, int | None, int | None], tuple[int, int]]:
        """(model, team id, key id) → (prompt, completion) tokens: this process's, or every
        process's summed (multiprocess mode)."""
        if process_metrics.MULTIPROCESS_DIR is None:
            with self._lock:
                return {k: tuple(v) for k, v in self._counts.items()}
        summed: dict[tuple[str, int | None, int | None], list[int]] = {}
        for sample in process_metrics.summed_samples(_RAW_TOKENS_NAME):
            if not sample.name.endswith("_total"):
                continue
            labels = sample.labels
            entry = summed.setdefault((labels["model"], _id_of(labels["team_id"]), _id_of(labels["key_id"])), [0, 0])
            entry[0 if labels["kind"] == "prompt" else 1] += int(sample.value)
        return {k: tuple(v) for k, v in summed.items()}

    def collect(self):
        counts = self._counts_now()
        team_ids = {team for _, team, _ in counts if team is not None}
        key_ids = {key for _, _, key in counts if key is not None}
        names = read_database(lambda: self._names(team_ids, key_ids))
        if names is None:  # the database is away: the names last read, if they name every series
            if not (team_ids <= self._team_names.keys() and key_ids <= self._key_names.keys()):
                return
            names = self._team_names, self._key_names
        teams, keys = names
        by_model: dict[tuple[str, str], list[int]] = {}
        by_key: dict[tuple[str, str], list[int]] = {}
        for (model, team_id, key_id), (prompt, completion) in counts.items():
            team = NO_TEAM if team_id is None else teams.get(team_id, DELETED)
            key = (ANONYMOUS, "") if key_id is None else keys.get(key_id, (DELETED, ""))
            for total, label in ((by_model, (model, team)), (by_key, key)):
                entry = total.setdefault(label, [0, 0])
                entry[0] += prompt
                entry[1] += completion
        tokens = CounterMetricFamily(*_TOKENS, labels=["model", "team", "kind"])
        for (model, team), (prompt, completion) in sorted(by_model.items()):
            tokens.add_metric([model, team, "prompt"], prompt)
            tokens.add_metric([model, team, "completion"], completion)
        yield tokens
        key_tokens = CounterMetricFamily(*_KEY_TOKENS, labels=["key", "key_prefix", "kind"])
        for (key, prefix), (prompt, completion) in sorted(by_key.items()):
            key_tokens.add_metric([key, prefix, "prompt"], prompt)
            key_tokens.add_metric([key, prefix, "completion"], completion)
        yield key_tokens


TOKENS = TokenCounts()
REGISTRY.register(TOKENS)
