"""Token limits and served endpoints where people read them: the admin (the detected length
read-only, the limits in force shown, a refusal in words) and ``llmgw explain``."""
from __future__ import annotations

import json

import pytest

from catalog.models import Model, Profile
from tests.catalog.test_admin_secrets import form_data
from tests.cli import llmgw

pytestmark = pytest.mark.django_db


@pytest.fixture
def llama_model():
    p = Profile(name="llama", engine=Profile.Engine.LLAMA_CPP_PYTHON,
                command="{python} -m llama_cpp.server --model {weights_path} --port {port} --n_ctx 2048", cpu_cores=1)
    p.full_clean()
    p.save()
    m = Model(name="gemma", weights="file:/dev/null", profile=p, weights_context_length=32768, max_output_tokens=256)
    m.full_clean()
    m.save()
    return m


def change_url(model) -> str:
    return f"/admin/catalog/model/{model.pk}/change/"


def test_the_admin_shows_the_limits_in_force_and_the_detected_length_read_only(admin_client, llama_model):
    page = admin_client.get(change_url(llama_model))
    text = page.content.decode()
    assert page.status_code == 200
    assert "context 2048 tokens, output at most 256 tokens; serves chat/completions, completions" in text
    assert 'name="weights_context_length"' not in text and "32768" in text
    assert 'name="context_length"' in text and 'name="max_output_tokens"' in text
    data = form_data(page)
    data.update(weights_context_length="5", context_length="4096")
    answer = admin_client.post(change_url(llama_model), data)
    assert answer.status_code == 302, answer.content.decode()[-3000:]
    llama_model.refresh_from_db()
    assert (llama_model.context_length, llama_model.weights_context_length) == (4096, 32768)


def test_the_admin_refuses_an_endpoint_the_profile_does_not_serve_in_words(admin_client, llama_model):
    data = form_data(admin_client.get(change_url(llama_model)))
    data["endpoints"] = "embeddings"
    answer = admin_client.post(change_url(llama_model), data)
    assert answer.status_code == 200
    assert "Its profile llama does not serve embeddings: it serves chat/completions, completions" in (
        answer.content.decode())
    assert Model.objects.get(pk=llama_model.pk).endpoints == ""


def test_the_profile_admin_says_what_its_engines_serve(admin_client, llama_model):
    page = admin_client.get(f"/admin/catalog/profile/{llama_model.profile_id}/change/")
    assert "chat/completions, completions; 2048 tokens of context (from its command)" in page.content.decode()


def test_explain_shows_the_limits_and_the_endpoints_in_one_line_each(llama_model):
    code, out, _ = llmgw("explain", "gemma")
    assert code == 0
    assert "  limits:      context 2048 tokens, output at most 256 tokens\n" in out
    assert "  endpoints:   chat/completions, completions\n" in out
    code, out, _ = llmgw("explain", "gemma", "--json")
    assert json.loads(out)["limits"] == {"context_length": 2048, "max_output_tokens": 256,
                                         "default_max_tokens": None, "served_endpoints": ["chat/completions", "completions"],
                                         "text": "context 2048 tokens, output at most 256 tokens"}


def test_explain_says_what_a_request_without_max_tokens_gets_where_it_describes_the_output(llama_model):
    Model.objects.filter(pk=llama_model.pk).update(max_output_tokens=None, default_max_tokens=128)
    code, out, _ = llmgw("explain", "gemma")
    assert code == 0
    assert ("  limits:      context 2048 tokens, output unlimited (up to the context); a request without max_tokens "
            "gets 128\n") in out
    limits = json.loads(llmgw("explain", "gemma", "--json")[1])["limits"]
    assert limits["default_max_tokens"] == 128 and limits["max_output_tokens"] is None
    external = Model.objects.create(name="gpt", external_base_url="https://api.example.com/v1", default_max_tokens=64)
    assert "without max_tokens" not in llmgw("explain", external.name)[1]  # the gateway adds none to an external call
