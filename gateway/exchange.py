"""One request's bookkeeping (``Exchange``): caller, model, timings, tokens, the upstream's
status; recorded once at the end as metrics and a usage record (``gateway.usage``)."""

from __future__ import annotations

import time

from django.http import HttpResponse
from django.utils import timezone

from fleet import live
from fleet.live import NO_KEYS
from gateway import metrics, tenants
from gateway.auth import Caller
from gateway.usage import usage_records
from llmgw import integers


class Exchange:
    """One request's bookkeeping: caller, model, timings, tokens; recorded once at the end."""

    def __init__(self, path: str, request=None) -> None:
        self.started = time.monotonic()
        self.path = path
        self.caller: Caller | None = None
        self.model_name = "unknown"
        self.model_label = "unknown"
        self.replica_id: int | None = None
        self.route_keys = NO_KEYS  # what its model's routing policy routes it by (gateway.routing)
        #: The replica this request is counted in flight on from the moment routing chose it
        #: (while its prompt is counted first), until its upstream call takes the count over
        #: (``take_count``) or it ends: the load bound sees it at once.
        self.counted_on: int | None = None
        self.upstream_status: int | None = None
        self.stream = False
        #: Seconds from the start to the first streamed byte (or the whole answer), as the
        #: client sees it: any wait (queue, hold) included.
        self.ttft_s: float | None = None
        #: Seconds of the gateway's own work before the upstream call (:meth:`note_overhead`).
        self.overhead_s: float | None = None
        #: Seconds spent before the upstream call waiting on others (:meth:`waited`): a slot
        #: in the admission queue, a replica (a cold-start hold), the engine's tokenizer.
        self.waited_s = 0.0
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.content_chunks = 0
        self.recorded = False
        #: The model label this request is counted under in ``llmgw_requests_in_flight``
        #: (from its upstream call to :meth:`finish`), or None.
        self.in_flight_label: str | None = None
        #: The request's place in its tenants' counters (``gateway.tenants``), settled at the end.
        self.admitted = None
        #: OpenAI's ``x-ratelimit-*`` headers for the answer (empty: the caller has no limits).
        self.rate_headers: dict[str, str] = {}
        #: Called once at the end (after the counters settle): the admission queue's slot.
        self.on_finish: list = []
        #: The Django request, for :meth:`gone_status` (None: treated as a client that left).
        self.request = request

    def gone_status(self) -> int:
        """The status recorded for a request that ended by cancellation: 499 when its client
        left, 503 when the server cancelled it (its shutdown: the client was answered 503
        ``shutting_down``, or its stream was cut): the lean handler (``llmgw.asgi``) marks
        ``request.client_left``; a request without the mark counts as left."""
        return 499 if getattr(self.request, "client_left", True) else 503

    def note_usage(self, data: dict | None) -> None:
        """Take token counts from an answer's ``usage``; values that are not counts (an
        engine's or provider's "abc", -1, 1e30) are ignored, never stored."""
        if isinstance(data, dict) and isinstance(data.get("usage"), dict):
            usage_ = data["usage"]
            if (prompt := integers.count_or_none(usage_.get("prompt_tokens"))) is not None:
                self.prompt_tokens = prompt
            if (completion := integers.count_or_none(usage_.get("completion_tokens"))) is not None:
                self.completion_tokens = completion

    def waited(self, seconds: float) -> None:
        """Count ``seconds`` (>= 0) of waiting on others before the upstream call: not the
        gateway's own work, so not its overhead (TTFT and the total keep them)."""
        if seconds > 0:
            self.waited_s += seconds

    def note_overhead(self) -> None:
        """Set :attr:`overhead_s` as the upstream call begins: the time since the request
        began less what it waited (:meth:`waited`) — what ``X-Llmgw-Overhead-Ms``, the
        usage record's ``overhead_ms`` and ``llmgw_gateway_overhead_seconds`` show. From
        here to :meth:`finish` the request counts in ``llmgw_requests_in_flight`` (JSON and
        streamed answers alike; once, however many upstream calls it makes)."""
        self.overhead_s = max(0.0, time.monotonic() - self.started - self.waited_s)
        if self.in_flight_label is None and not self.recorded:
            self.in_flight_label = self.model_label
            metrics.child(metrics.IN_FLIGHT, self.in_flight_label).inc()

    def count_on(self, replica_id: int) -> None:
        """Count this request in flight on ``replica_id`` now (routing chose it)."""
        live.begin_request(replica_id)
        self.counted_on = replica_id

    def take_count(self, replica_id: int) -> bool:
        """Whether this request is already counted on ``replica_id`` (the upstream call then
        keeps that count rather than adding one)."""
        if self.counted_on == replica_id:
            self.counted_on = None
            return True
        return False

    def finish(self, status: int) -> None:
        if self.counted_on is not None:  # ended before its upstream call
            live.end_request(self.counted_on)
            self.counted_on = None
        if self.recorded:
            return
        self.recorded = True
        if self.in_flight_label is not None:
            metrics.child(metrics.IN_FLIGHT, self.in_flight_label).dec()
            self.in_flight_label = None
        total = time.monotonic() - self.started
        if self.admitted is not None:
            answered = self.upstream_status is not None and self.upstream_status < 400
            tenants.settle(self.admitted, self.prompt_tokens, self.completion_tokens, answered,
                           refused_here=status == 400 and self.upstream_status is None)
        for done in self.on_finish:
            done()
        metrics.child(metrics.REQUESTS, self.model_label, str(status)).inc()
        if self.model_label != "unknown":
            metrics.child(metrics.LATENCY, self.model_label).observe(total)
            if self.ttft_s is not None:
                metrics.child(metrics.TTFT, self.model_label).observe(self.ttft_s)
        if self.overhead_s is not None:
            metrics.OVERHEAD.observe(self.overhead_s)
        usage_records.add(
            at=timezone.now(), key_id=self.caller.key_id if self.caller else None,
            team_id=self.caller.team_id if self.caller else None, model_name=self.model_name[:128],
            replica_id=self.replica_id, path=self.path[:128], status=status, upstream_status=self.upstream_status,
            stream=self.stream,
            prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
            ttft_ms=None if self.ttft_s is None else self.ttft_s * 1000, total_ms=total * 1000,
            overhead_ms=None if self.overhead_s is None else self.overhead_s * 1000,
        )

    def answer(self, response: HttpResponse) -> HttpResponse:
        self.finish(response.status_code)
        return response

