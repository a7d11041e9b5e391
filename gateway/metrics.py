"""Prometheus metrics of this web process (``/metrics``). Labels are bounded: model names
come from the catalog (anything else is ``unknown``), statuses are HTTP codes."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from llmgw.metrics import REGISTRY
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)

REQUESTS = Counter("llmgw_requests", "Requests answered under /v1/, by model and HTTP status.",
                   ["model", "status"], registry=REGISTRY)
TTFT = Histogram("llmgw_time_to_first_token_seconds", "Time to the first streamed byte (or the whole answer).",
                 ["model"], buckets=_LATENCY_BUCKETS, registry=REGISTRY)
LATENCY = Histogram("llmgw_request_duration_seconds", "Total time of a request.", ["model"],
                    buckets=_LATENCY_BUCKETS, registry=REGISTRY)
OVERHEAD = Histogram("llmgw_gateway_overhead_seconds", "The gateway's own work before the upstream call.",
                     buckets=_OVERHEAD_BUCKETS, registry=REGISTRY)
IN_FLIGHT = Gauge("llmgw_requests_in_flight", "Requests being relayed now.", ["model"], registry=REGISTRY)
HELD = Gauge("llmgw_requests_held_for_cold_start", "Requests waiting for a replica to become ready.",
             registry=REGISTRY)
ROUTING = Counter("llmgw_routing_decisions", "Replica choices, by model, routing policy and outcome: hit (the replica "
                  "the prefix or session prefers), spill (that one was over the load bound), unkeyed (no prefix "
                  "block nor session: least-loaded), least-loaded (the policy).",
                  ["model", "policy", "outcome"], registry=REGISTRY)
