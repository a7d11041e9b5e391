"""Token limits and served endpoints of a catalog model (``catalog.models``): the precedence
of ``token_limits`` (pure, on unsaved objects), the validation messages, and what the admin
and ``llmgw explain`` show."""
from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from catalog.models import MAX_TOKENS_LIMIT, Model, Profile, effective_context_length, limits_info


def profile(engine="llama_cpp_python", command="{python} -m llama_cpp.server --port {port} --n_ctx 2048", **kw):
    return Profile(pk=kw.pop("pk", 1), name=kw.pop("name", "p"), engine=engine, command=command, cpu_cores=1, **kw)


def model(p=None, **kw):
    m = Model(name=kw.pop("name", "m"), weights=kw.pop("weights", "file:/dev/null"), **kw)
    if p is not None:
        m.profile = p
    return m


@pytest.mark.parametrize("operator, command, weights, expected", [
    (None, None, None, None),
    (None, 2048, None, 2048),
    (None, None, 32768, 32768),
    (None, 2048, 32768, 2048),   # the engine runs with less than the weights know
    (None, 65536, 32768, 32768),  # the engine cannot give more than the weights were made for
    (1000, 2048, 32768, 1000),    # the operator's value overrides both
    (100000, 2048, 32768, 100000),
])
def test_the_context_length_is_the_operators_else_the_smaller_of_command_and_weights(operator, command, weights,
                                                                                     expected):
    assert effective_context_length(operator, command, weights) == expected


def test_token_limits_read_the_profile_command_and_the_weights_metadata():
    p = profile()
    assert model(p).token_limits() == (2048, None)
    assert model(p, weights_context_length=1024).token_limits() == (1024, None)
    assert model(p, weights_context_length=32768, max_output_tokens=256).token_limits() == (2048, 256)
    assert model(p, context_length=4096, weights_context_length=32768).token_limits() == (4096, None)
    assert model(p, context_length=4096).context_limit == 4096


def test_an_external_model_has_only_the_operators_limits():
    m = Model(name="gpt", external_base_url="https://api.example.com/v1", weights_context_length=99)
    assert m.token_limits() == (None, None)
    m.context_length, m.max_output_tokens = 128000, 4096
    assert m.token_limits() == (128000, 4096)


def test_served_endpoints_are_the_models_own_else_its_profiles_else_all():
    text = profile()
    embedding = profile(command="{python} -m llama_cpp.server --port {port} --embedding True")
    assert model(text).served_endpoints == {"chat/completions", "completions"}
    assert model(embedding).served_endpoints == {"chat/completions", "completions", "embeddings"}
    assert model(embedding, endpoints="embeddings").served_endpoints == {"embeddings"}
    narrowed = profile(endpoints="chat/completions")
    assert model(narrowed).served_endpoints == {"chat/completions"}
    assert Model(name="gpt", external_base_url="https://api.example.com/v1").served_endpoints == {
        "chat/completions", "completions", "embeddings"}


def test_a_model_reads_its_engines_traits_and_an_external_one_is_openai():
    m = model(profile())
    t = m.engine_traits
    assert (t.serves_n, t.cancels_unstreamed, t.streams_usage, t.tokenize_path, t.tokenize_field) == (
        False, False, False, "/extras/tokenize", "input")
    ext = Model(name="gpt", external_base_url="https://api.example.com/v1")
    e = ext.engine_traits
    assert (e.serves_n, e.cancels_unstreamed, e.streams_usage, e.tokenize_path) == (True, True, True, None)


def test_the_explain_line_names_the_limits_and_the_endpoints():
    info = limits_info(model(profile(), max_output_tokens=512))
    assert info == {"context_length": 2048, "max_output_tokens": 512, "default_max_tokens": None,
                    "served_endpoints": ["chat/completions", "completions"],
                    "text": "context 2048 tokens, output at most 512 tokens"}
    assert limits_info(model(profile(command="x --port {port}")))["text"] == (
        "context unknown, output unlimited (up to the context)")


# -- validation (full_clean reads other models: a database) ---------------------------------------------------------

@pytest.fixture
def text_profile(db):
    p = Profile(name="llama", engine=Profile.Engine.LLAMA_CPP_PYTHON,
                command="{python} -m llama_cpp.server --model {weights_path} --port {port} --n_ctx 2048", cpu_cores=1)
    p.full_clean()
    p.save()
    return p


def errors_of(m) -> dict:
    with pytest.raises(ValidationError) as caught:
        m.full_clean()
    return caught.value.message_dict


def test_a_model_may_not_name_an_endpoint_its_profile_does_not_serve(text_profile):
    errors = errors_of(model(text_profile, endpoints="chat/completions, embeddings"))
    assert errors["endpoints"] == ["Its profile llama does not serve embeddings: it serves chat/completions, "
                                   "completions (set the profile's endpoints, or start its engine for them)."]
    model(text_profile, endpoints="chat/completions").full_clean()  # narrowing is fine


def test_a_profile_names_only_known_endpoints(db):
    p = profile(pk=None, endpoints="chat/completions, images")
    with pytest.raises(ValidationError) as caught:
        p.full_clean()
    assert caught.value.message_dict["endpoints"] == [
        "Unknown endpoint(s) images: choose from chat/completions, completions, embeddings."]


def test_default_max_tokens_above_a_known_limit_is_refused(text_profile):
    assert errors_of(model(text_profile, default_max_tokens=4096))["default_max_tokens"] == [
        "Default max tokens 4096 is above its context length 2048."]
    assert errors_of(model(text_profile, default_max_tokens=300, max_output_tokens=200))["default_max_tokens"] == [
        "Default max tokens 300 is above its max output tokens 200."]
    model(text_profile, default_max_tokens=2048).full_clean()
    model(text_profile, default_max_tokens=4096, context_length=8192).full_clean()  # the operator's context


def test_max_output_tokens_above_the_context_length_is_refused(text_profile):
    assert errors_of(model(text_profile, max_output_tokens=3000))["max_output_tokens"] == [
        "Max output tokens 3000 is above its context length 2048."]


@pytest.mark.parametrize("field", ["context_length", "max_output_tokens"])
@pytest.mark.parametrize("value", [0, MAX_TOKENS_LIMIT + 1])
def test_limits_are_bounded(text_profile, field, value):
    assert field in errors_of(model(text_profile, **{"context_length": 8192, field: value}))


def test_the_detected_context_length_is_not_a_form_field():
    assert not Model._meta.get_field("weights_context_length").editable


def test_the_rest_api_shows_the_limits_in_force_and_keeps_the_detected_one_read_only(text_profile):
    from catalog.serializers import ModelSerializer

    m = model(text_profile, max_output_tokens=100, weights_context_length=1024)
    m.save()
    data = ModelSerializer(m).data
    assert data["token_limits"] == {"context_length": 1024, "max_output_tokens": 100}
    assert data["served_endpoints"] == ["chat/completions", "completions"]
    assert data["weights_context_length"] == 1024
    s = ModelSerializer(m, data={"weights_context_length": 5}, partial=True)
    assert s.is_valid(), s.errors
    s.save()
    m.refresh_from_db()
    assert m.weights_context_length == 1024


def test_the_rest_api_shows_what_a_profile_serves_and_refuses_unknown_endpoints(text_profile):
    from catalog.serializers import ProfileSerializer

    assert ProfileSerializer(text_profile).data["served_endpoints"] == ["chat/completions", "completions"]
    s = ProfileSerializer(text_profile, data={"endpoints": "chat/completions, images"}, partial=True)
    assert not s.is_valid() and "images" in str(s.errors["endpoints"])
    s = ProfileSerializer(text_profile, data={"endpoints": "chat/completions"}, partial=True)
    assert s.is_valid(), s.errors
    assert ProfileSerializer(s.save()).data["served_endpoints"] == ["chat/completions"]
