"""Secrets in the admin and the REST API (issue 12, "secrets stay secret"): an external
model's provider key is write-only (never rendered back, kept when the form is saved
untouched, clearable, absent from the history and from API answers); keys and agent tokens
shown once are rendered in the answering page, never carried in a cookie."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission

from catalog.models import Model
from llmgw import tokens
from fleet.models import Agent
from gateway.models import ApiKey

pytestmark = pytest.mark.django_db

KEY = "sk-provider-SECRET-0123456789abcdef"


@pytest.fixture
def external():
    model = Model(name="remote", external_base_url="https://api.example.com/v1", external_api_key=KEY,
                  min_replicas=0, max_replicas=0)
    model.full_clean()
    model.save()
    return model


def change_url(model) -> str:
    return f"/admin/catalog/model/{model.pk}/change/"


def form_data(response) -> dict:
    """The POST a browser would send for the admin change page in ``response``, untouched."""
    data = {}
    forms = [response.context["adminform"].form]
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        forms += list(formset.forms)
        management = formset.management_form
        for name in management.fields:
            data[management.add_prefix(name)] = management[name].value()
    for form in forms:
        for name, field in form.fields.items():
            value = form[name].value()
            if value is None or value is False:
                continue
            if value is True:
                value = "on"
            data[form.add_prefix(name)] = value
    return data


def cookies_text(response) -> str:
    return " ".join(f"{name}={morsel.value}" for name, morsel in response.cookies.items())


def assert_no_secret_anywhere(response, secret: str) -> None:
    assert secret not in response.content.decode(), "rendered into the page"
    assert secret not in cookies_text(response), "carried in a cookie"
    assert secret not in str(response.headers), "in a header"


def test_the_change_page_of_an_external_model_does_not_contain_its_key(admin_client, external):
    page = admin_client.get(change_url(external))
    assert page.status_code == 200
    assert_no_secret_anywhere(page, KEY)
    assert "A key is set." in page.content.decode()
    assert 'type="password"' in page.content.decode()


def test_saving_the_form_without_touching_the_key_keeps_it_and_the_history_never_names_it(admin_client, external):
    page = admin_client.get(change_url(external))
    data = form_data(page)
    assert data.get("external_api_key", "") == ""  # the browser has nothing to send back
    data["aliases"] = "far-away"
    answer = admin_client.post(change_url(external), data)
    assert answer.status_code == 302, answer.content.decode()[:3000]
    external.refresh_from_db()
    assert external.external_api_key == KEY and external.aliases == "far-away"
    entry = LogEntry.objects.get()
    assert KEY not in entry.change_message and "API key" not in entry.get_change_message()
    assert KEY not in admin_client.get(f"/admin/catalog/model/{external.pk}/history/").content.decode()


def test_a_typed_key_replaces_the_stored_one_and_clear_removes_it(admin_client, external):
    data = form_data(admin_client.get(change_url(external)))
    data["external_api_key"] = "sk-new-key-9876543210"
    assert admin_client.post(change_url(external), data).status_code == 302
    external.refresh_from_db()
    assert external.external_api_key == "sk-new-key-9876543210"
    entry = LogEntry.objects.latest("id")
    assert "sk-new-key" not in entry.change_message and "External API key" in entry.get_change_message()

    page = admin_client.get(change_url(external))
    assert_no_secret_anywhere(page, "sk-new-key-9876543210")
    data = form_data(page)
    data["clear_external_api_key"] = "on"
    assert admin_client.post(change_url(external), data).status_code == 302
    external.refresh_from_db()
    assert external.external_api_key == ""
    assert "No key is set." in admin_client.get(change_url(external)).content.decode()


def test_a_viewer_sees_whether_a_key_is_set_never_the_key(client, django_user_model, external):
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_model", content_type__app_label="catalog"))
    client.force_login(viewer)
    page = client.get(change_url(external))
    assert page.status_code == 200
    assert_no_secret_anywhere(page, KEY)
    assert '<div class="readonly">set</div>' in page.content.decode()
    type(external).objects.filter(pk=external.pk).update(external_api_key="")
    assert '<div class="readonly">not set</div>' in client.get(change_url(external)).content.decode()


def test_rest_api_answers_never_contain_the_key(admin_client, external):
    for url in ("/api/models/", f"/api/models/{external.pk}/"):
        answer = admin_client.get(url, HTTP_ACCEPT="application/json")
        assert answer.status_code == 200 and KEY not in answer.content.decode()
        page = admin_client.get(url, HTTP_ACCEPT="text/html")  # the browsable API's forms too
        assert page.status_code == 200 and KEY not in page.content.decode()
    answer = admin_client.patch(f"/api/models/{external.pk}/", {"aliases": "x"}, content_type="application/json")
    assert answer.status_code == 200 and KEY not in answer.content.decode()
    assert answer.json()["external_api_key_set"] is True
    external.refresh_from_db()
    assert external.external_api_key == KEY


def test_a_new_api_key_is_shown_on_the_answering_page_never_in_a_cookie(admin_client):
    answer = admin_client.post("/admin/gateway/apikey/add/", {"name": "alice"})
    assert answer.status_code == 200
    key = ApiKey.objects.get(name="alice")
    page = answer.content.decode()
    clear = page.split('<code class="shown-once">')[1].split("</code>")[0]
    assert clear.startswith("llmgw-key-") and tokens.token_matches(clear, key.sha256)
    assert clear not in cookies_text(answer) and "messages" not in answer.cookies
    assert "no-store" in answer.headers["Cache-Control"]
    follow = admin_client.get("/admin/gateway/apikey/")  # nothing left over for the next page
    assert clear not in follow.content.decode() and clear not in cookies_text(follow)


def test_agent_tokens_are_shown_on_the_answering_page_and_a_rekey_drops_the_old_one(admin_client):
    answer = admin_client.post("/admin/fleet/agent/add/", {"name": "gpu-9", "generation": 0,
                                                           "restart_generation": 0, "gpus-TOTAL_FORMS": 0,
                                                           "gpus-INITIAL_FORMS": 0})
    assert answer.status_code == 200, answer.content.decode()[:2000]
    first = answer.content.decode().split('<code class="shown-once">')[1].split("</code>")[0]
    assert Agent.authenticate(first).name == "gpu-9"
    assert first not in cookies_text(answer) and "no-store" in answer.headers["Cache-Control"]

    agent = Agent.objects.get(name="gpu-9")
    answer = admin_client.post("/admin/fleet/agent/", {"action": "rekey", "_selected_action": [agent.pk]})
    assert answer.status_code == 200
    second = answer.content.decode().split('<code class="shown-once">')[1].split("</code>")[0]
    assert second != first and second not in cookies_text(answer)
    assert Agent.authenticate(first) is None and Agent.authenticate(second).name == "gpu-9"


def test_admin_list_filters_in_the_query_string_cannot_guess_a_secret(client, django_user_model, external,
                                                                        cpu_profile):
    """Django's admin accepts any lookup on a model's own fields in the changelist's query
    string (``?field__startswith=…``): one that names a secret would be an oracle, the list
    shrinking to nothing when a guessed prefix is wrong, that a viewer could walk to the whole
    external provider key or engine key, a character at a time. Such lookups are refused (400)."""
    from fleet.models import Replica

    agent = Agent.objects.create(name="gpu-1", address="10.0.0.7")
    replica = Replica.objects.create(model=external, profile=cpu_profile, agent=agent, state="ready", port=20001)
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    for codename, app in (("view_model", "catalog"), ("view_replica", "fleet"), ("view_agent", "fleet"),
                          ("view_apikey", "gateway"), ("view_apitoken", "fleet")):
        viewer.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label=app))
    client.force_login(viewer)
    before = LogEntry.objects.count()
    probes = [
        ("/admin/catalog/model/", f"external_api_key__startswith={KEY[:8]}"),
        ("/admin/catalog/model/", f"external_api_key={KEY}"),
        ("/admin/catalog/model/", "external_api_key__gt=sk-p"),
        ("/admin/catalog/model/", "external_api_key__regex=^sk"),
        ("/admin/fleet/replica/", f"engine_key__startswith={replica.engine_key[:3]}"),
        ("/admin/fleet/replica/", f"engine_key__lt={replica.engine_key}"),
        ("/admin/fleet/agent/", f"token_sha256__startswith={agent.token_sha256[:3]}"),
        ("/admin/gateway/apikey/", "sha256__startswith=a"),
        ("/admin/fleet/apitoken/", "sha256__startswith=a"),
    ]
    for url, query in probes:
        answer = client.get(f"{url}?{query}")
        assert answer.status_code == 400, (query, answer.status_code)
        assert KEY not in answer.content.decode() and replica.engine_key not in answer.content.decode()
    # A name that is no field (the secret's, in capitals) is Django's "invalid lookup": the
    # list is not shown, the browser is sent back to it with ?e=1.
    answer = client.get(f"/admin/fleet/replica/?ENGINE_KEY__startswith={replica.engine_key[:3]}")
    assert answer.status_code == 302 and answer["Location"] == "/admin/fleet/replica/?e=1"
    # The lists themselves and the filters they offer still work.
    assert client.get("/admin/catalog/model/").status_code == 200
    assert client.get(f"/admin/fleet/replica/?state=ready&model__id__exact={external.pk}").status_code == 200
    assert LogEntry.objects.count() == before
    external.refresh_from_db()
    replica.refresh_from_db()
    assert external.external_api_key == KEY
