"""A model's routing policy where operators meet it (issue 17): the admin (its own
fieldset, a list filter, a refusal of a value that is no policy) and ``llmgw explain`` (the
rule in words with the load bound's figures, ``--json`` with the policy; an external model:
routing does not apply). The REST API's side is in tests/ops/test_api.py."""
from __future__ import annotations

import json

import pytest
from django.contrib.admin.models import LogEntry

from catalog.models import Model, RoutingPolicy
from fleet.planning import routing
from tests.catalog.test_admin_secrets import form_data
from tests.cli import llmgw

pytestmark = pytest.mark.django_db

#: The load bound as explain words it, from the planner's own figures.
BOUND = (f"unless that one already runs {routing.BOUND_SLACK} more requests than the least loaded "
         f"({routing.BOUND_FACTOR:.0%} more once the least loaded runs over "
         f"{int(routing.BOUND_SLACK // routing.BOUND_FACTOR)}): then it spills to the next replica in the key's order")


def change_url(model) -> str:
    return f"/admin/catalog/model/{model.pk}/change/"


def test_the_admin_shows_the_policy_in_a_routing_fieldset_and_saves_a_change(admin_client, make_model):
    model = make_model("chat")
    page = admin_client.get(change_url(model))
    text = page.content.decode()
    assert page.status_code == 200
    assert ">Routing</h2>" in text and "It does not apply to an external model" in text
    assert 'name="routing_policy"' in text
    for label in RoutingPolicy.labels:  # every choice offered, in the model's words
        assert label.replace("'", "&#x27;") in text
    data = form_data(page)
    assert data["routing_policy"] == RoutingPolicy.LEAST_LOADED
    data["routing_policy"] = RoutingPolicy.PREFIX_AFFINITY
    answer = admin_client.post(change_url(model), data)
    assert answer.status_code == 302, answer.content.decode()[-3000:]
    model.refresh_from_db()
    assert model.routing_policy == "prefix-affinity"
    assert "Routing policy" in LogEntry.objects.get(object_id=str(model.pk)).get_change_message()


def test_the_admin_refuses_a_value_that_is_no_routing_policy(admin_client, make_model):
    model = make_model("chat", routing_policy=RoutingPolicy.SESSION)
    data = form_data(admin_client.get(change_url(model)))
    data["routing_policy"] = "round-robin"
    answer = admin_client.post(change_url(model), data)
    assert answer.status_code == 200
    assert "Select a valid choice. round-robin is not one of the available choices." in answer.content.decode()
    assert Model.objects.get(pk=model.pk).routing_policy == "session"


def test_the_admins_model_list_filters_by_routing_policy(admin_client, make_model):
    make_model("spread")
    make_model("cached", routing_policy=RoutingPolicy.PREFIX_AFFINITY)
    page = admin_client.get("/admin/catalog/model/")
    assert page.status_code == 200 and "By routing policy" in page.content.decode()
    page = admin_client.get("/admin/catalog/model/", {"routing_policy__exact": "prefix-affinity"})
    assert page.status_code == 200
    assert [m.name for m in page.context["cl"].result_list] == ["cached"]


@pytest.mark.parametrize("policy, words", [
    ("least-loaded", "least-loaded — each request goes to the replica with the fewest requests in flight "
                     "(ties take turns)"),
    ("prefix-affinity", "prefix-affinity — a prompt goes to the replica that most likely holds its prefix in its "
                        f"cache, {BOUND}; a prompt too short to have a prefix goes by its session (X-Session-Id, "
                        "else user) if it has one, else least-loaded"),
    ("session", "session — one session's requests stay on one replica (by X-Session-Id, else user, else the "
                f"prompt's prefix), {BOUND}"),
])
def test_explain_says_the_routing_policy_in_words(make_model, policy, words):
    make_model("chat", routing_policy=policy)
    code, out, _ = llmgw("explain", "chat")
    assert code == 0
    assert f"  routing:     {words}\n" in out
    code, out, _ = llmgw("explain", "chat", "--json")
    assert code == 0
    assert json.loads(out)["routing"] == {"policy": policy, "applies": True, "text": words}


def test_the_words_carry_the_planners_figure_for_the_bound():
    assert BOUND.startswith(f"unless that one already runs {routing.load_slack(0)} more requests")
    past = int(routing.BOUND_SLACK // routing.BOUND_FACTOR)
    # The figure in words is where load_slack stops being the flat slack.
    assert routing.load_slack(past) == routing.BOUND_SLACK < routing.load_slack(past + 1)


def test_explain_says_routing_does_not_apply_to_an_external_model():
    model = Model(name="remote", external_base_url="https://api.example.com/v1", min_replicas=0, max_replicas=0,
                  routing_policy=RoutingPolicy.SESSION)
    model.full_clean()
    model.save()
    code, out, _ = llmgw("explain", "remote")
    assert code == 0
    assert "  routing:     does not apply — an external model: every request goes to its base URL\n" in out
    code, out, _ = llmgw("explain", "remote", "--json")
    assert json.loads(out)["routing"] == {
        "policy": "session", "applies": False,
        "text": "does not apply — an external model: every request goes to its base URL"}


def test_explain_says_a_stored_value_that_is_no_policy_routes_as_least_loaded(make_model):
    model = make_model("chat")
    Model.objects.filter(pk=model.pk).update(routing_policy="round-robin")  # past validation, as a raw write would
    code, out, _ = llmgw("explain", "chat")
    assert code == 0
    assert ("  routing:     least-loaded — 'round-robin' is no routing policy, so the fewest requests in flight "
            "decide\n") in out
