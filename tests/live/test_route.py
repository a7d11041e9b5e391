"""``fleet.live.route``: the policy's choice on this process's in-flight counts."""

from __future__ import annotations

from fleet import live
from fleet.live import Endpoint


def _endpoints(model_id: int, first_replica: int) -> tuple[Endpoint, ...]:
    return tuple(Endpoint(first_replica + i, model_id, f"http://127.0.0.1:{9000 + first_replica + i}", "local")
                 for i in range(2))


def test_ties_take_turns_per_model_when_two_models_requests_interleave():
    a, b = _endpoints(9101, 91010), _endpoints(9102, 91020)
    chosen_a, chosen_b = [], []
    for _ in range(6):
        chosen_a.append(live.route(a)[0].replica_id)
        chosen_b.append(live.route(b)[0].replica_id)
    assert set(chosen_a[:2]) == {91010, 91011} and chosen_a[:2] * 3 == chosen_a
    assert set(chosen_b[:2]) == {91020, 91021} and chosen_b[:2] * 3 == chosen_b


def test_every_endpoint_excluded_is_none_and_the_decision_says_the_policy():
    a = _endpoints(9103, 91030)
    assert live.route(a, exclude={91030, 91031}) is None
    endpoint, decision = live.route(a, live.LEAST_LOADED, exclude={91030})
    assert endpoint.replica_id == 91031 and decision.outcome == "least-loaded"
