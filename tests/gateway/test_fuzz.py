"""Fuzzing /v1/ (issue 15): hypothesis writes request bodies — OpenAI's fields with random
and wrongly typed values, random Unicode with lone surrogates (as ``\\ud800`` escapes and as
UTF-8 bytes), nested junk, huge numbers, a name twice in one object, bytes that are not
JSON — and POSTs them through a real web process to a model served by a fake engine and to
an external one. Whatever the body, the answer is never a 500, and every answer that is not
a 2xx is OpenAI's error object. Deterministic (``derandomize``), no example database, a
bounded number of examples per endpoint."""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django.utils import timezone

from catalog.models import Model, Profile
from fleet.models import Agent
from gateway.models import ApiKey
from tests.processes import fake_engine, free_port, wait_for_port, wait_until, web_server
from tests.replicas import routed_to, serve

pytestmark = [pytest.mark.django_db(transaction=True)]

#: Examples per endpoint; LLMGW_FUZZ_EXAMPLES=1500 for a longer hunt (about a minute).
MAX_EXAMPLES = int(os.environ.get("LLMGW_FUZZ_EXAMPLES", "150"))
MODELS = ("plain", "ext", "llama")  # llama: llama-cpp-python's traits, so the gateway composes answers

# --- strategies ----------------------------------------------------------------------------------

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
texts = st.text(st.one_of(st.characters(exclude_categories=()), surrogates), max_size=12)
numbers = st.one_of(
    st.integers(-3, 300), st.integers(-10 ** 40, 10 ** 40), st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, -1, 2 ** 31, 2 ** 63, 2 ** 64 + 1, 1e308, -1e308, 5e-324, 16.0, 0.5]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
junk = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(texts, inner, max_size=4)), max_leaves=12)


roles = st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "function", "developer"]), junk)
parts = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(texts, junk)}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.one_of(
        st.fixed_dictionaries({"url": st.one_of(texts, junk)}), junk)}),
    st.dictionaries(st.sampled_from(["type", "text", "image_url", "input_audio", "refusal"]), junk, max_size=3),
    junk,
)
tool_calls = st.lists(st.one_of(
    st.fixed_dictionaries({"id": texts, "type": st.sampled_from(["function", "x"]),
                           "function": st.fixed_dictionaries({"name": texts, "arguments": st.one_of(texts, junk)})}),
    junk), max_size=2)
message = st.one_of(
    st.fixed_dictionaries({"role": roles}, optional={
        "content": st.one_of(texts, st.lists(parts, max_size=3), junk), "name": st.one_of(texts, junk),
        "tool_calls": st.one_of(tool_calls, junk), "tool_call_id": st.one_of(texts, junk),
        "function_call": junk}),
    junk,
)
tools = st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["function", "code"]), "function": st.one_of(
        st.fixed_dictionaries({"name": texts}, optional={"parameters": junk}), junk)}),
    junk), max_size=2)
prompts = st.one_of(texts, st.lists(texts, max_size=3), st.lists(st.integers(-5, 2 ** 40), max_size=4),
                    st.lists(st.lists(st.integers(0, 100), max_size=3), max_size=2), junk)

GENERATION = {
    "stream": st.one_of(st.booleans(), junk),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.one_of(st.booleans(), junk)}), junk),
    "max_tokens": st.one_of(st.integers(-2, 8), numbers, junk),
    "n": st.one_of(st.integers(-1, 130), junk),
    "temperature": st.one_of(numbers, junk),
    "top_p": st.one_of(numbers, junk),
    "presence_penalty": numbers,
    "frequency_penalty": numbers,
    "seed": st.one_of(numbers, junk),
    "stop": st.one_of(texts, st.lists(st.one_of(texts, junk), max_size=6), junk),
    "user": st.one_of(texts, junk),
    "logit_bias": st.one_of(st.dictionaries(texts, numbers, max_size=3), junk),
    "top_k": junk,  # an engine's extra: passes through
}
FIELDS = {
    "chat/completions": {
        **GENERATION,
        "messages": st.one_of(st.lists(message, min_size=1, max_size=4), junk),
        "max_completion_tokens": st.one_of(st.integers(-2, 8), numbers, junk),
        "logprobs": st.one_of(st.booleans(), junk),
        "top_logprobs": st.one_of(st.integers(-1, 25), junk),
        "tools": st.one_of(tools, junk),
        "tool_choice": st.one_of(st.sampled_from(["none", "auto", "required", "x"]), junk),
        "response_format": st.one_of(st.fixed_dictionaries({"type": st.one_of(
            st.sampled_from(["text", "json_object", "json_schema", "yaml"]), junk)}), junk),
    },
    "completions": {
        **GENERATION,
        "prompt": prompts,
        "echo": st.one_of(st.booleans(), junk),
        "best_of": st.one_of(st.integers(-1, 25), junk),
        "suffix": st.one_of(texts, junk),
        "logprobs": st.one_of(st.integers(-1, 6), junk),
    },
    "embeddings": {
        "input": prompts,
        "encoding_format": st.one_of(st.sampled_from(["float", "base64", "int8"]), junk),
        "dimensions": st.one_of(st.integers(-1, 5000), junk),
        "user": st.one_of(texts, junk),
    },
}


clean_texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
#: Values OpenAI accepts, so that some bodies pass every check and reach the engine.
GOOD = {
    "chat/completions": {
        "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "developer"]),
                                                    "content": clean_texts}), min_size=1, max_size=3),
        "max_tokens": st.integers(1, 4), "max_completion_tokens": st.integers(1, 4),
        "temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "n": st.just(1), "seed": st.integers(),
        "stop": st.lists(clean_texts, max_size=4), "logprobs": st.booleans(), "user": clean_texts,
        "stream": st.booleans(), "top_k": junk,
    },
    "completions": {
        "prompt": st.one_of(clean_texts, st.lists(clean_texts, min_size=1, max_size=2)),
        "max_tokens": st.integers(1, 4), "temperature": st.floats(0, 2), "echo": st.booleans(),
        "stream": st.booleans(), "stop": clean_texts,
    },
    "embeddings": {
        "input": st.one_of(clean_texts.filter(bool), st.lists(clean_texts.filter(bool), min_size=1, max_size=3)),
        "encoding_format": st.sampled_from(["float", "base64"]), "user": clean_texts,
    },
}
_REQUIRED = {"chat/completions": ("messages",), "completions": ("prompt",), "embeddings": ("input",)}


def good_bodies(path: str) -> st.SearchStrategy:
    required = {name: GOOD[path][name] for name in _REQUIRED[path]}
    optional = {name: value for name, value in GOOD[path].items() if name not in required}
    return st.fixed_dictionaries({"model": st.sampled_from(MODELS), **required}, optional=optional)


def encoded(body: dict, how: str) -> bytes:
    """``body`` as bytes: JSON with escapes, UTF-8 as written (surrogates as their bytes), UTF-16."""
    if how == "ascii":
        return json.dumps(body).encode()
    text = json.dumps(body, ensure_ascii=False)
    return text.encode("utf-16" if how == "utf-16" else "utf-8", "surrogatepass")


def bodies(path: str) -> st.SearchStrategy:
    """Raw request bodies for ``path``: mostly JSON objects of its fields (valid model names,
    so that the body's checks are reached), some mangled below the JSON layer."""
    objects = st.fixed_dictionaries(
        {"model": st.one_of(st.sampled_from(MODELS), st.sampled_from(MODELS).map(lambda m: m + "\ud800"), junk)},
        optional={**FIELDS[path], **{f"x_{i}": junk for i in range(2)}},
    )
    as_json = st.builds(encoded, objects, st.sampled_from(["ascii", "ascii", "ascii", "utf-8", "utf-16"]))
    twice = st.builds(lambda m, other: b'{"model": "' + m.encode() + b'", "model": ' + json.dumps(other).encode()
                      + b', "messages": [{"role": "user", "content": "x"}], "input": "x"}',
                      st.sampled_from(MODELS), junk)
    nested_twice = st.builds(lambda m: b'{"model": "' + m.encode() + b'", "stream_options": '
                             b'{"include_usage": true, "include_usage": false}, "input": "x"}', st.sampled_from(MODELS))
    not_json = st.one_of(
        st.binary(max_size=64),
        st.builds(lambda tail: b'{"model": "plain", ' + tail, st.binary(max_size=32)),
        st.sampled_from([b"", b"null", b"[]", b'"x"', b"1e999", b'{"model": NaN}',
                         b'{"model": "plain", "n": 1' + b"0" * 5000 + b"}",  # more digits than int() reads
                         b'{"model": "plain", "input": "\\ud800"}', b'\xef\xbb\xbf{"model": "plain"}']),
    )
    good = st.builds(encoded, good_bodies(path), st.sampled_from(["ascii", "utf-8"]))
    return st.one_of(good, as_json, as_json, twice, nested_twice, not_json)


# --- the gateway under test ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def servers(django_db_setup, tmp_path_factory):
    logs = tmp_path_factory.mktemp("fuzz")
    ports = {name: free_port() for name in ("plain", "external", "llama", "web")}
    engines = [fake_engine(ports["plain"], logs, "--tokens", "2"),
               fake_engine(ports["external"], logs, "--tokens", "2", name="upstream-model"),
               fake_engine(ports["llama"], logs, "--tokens", "2", "--no-usage-chunk")]
    for name in ("plain", "external", "llama"):
        wait_for_port(ports[name])
    web = web_server(ports["web"], logs, env={"LLMGW_WATCH_INTERVAL": "50ms", "LLMGW_MAX_BODY_BYTES": "65536"})
    yield {"ports": ports, "url": f"http://127.0.0.1:{ports['web']}", "web": web}
    for proc in [web, *engines]:
        proc.stop()


@pytest.fixture
def key(servers, make_model, transactional_db) -> str:
    plain = make_model("plain")
    replica = serve(plain, servers["ports"]["plain"])
    ext = Model(name="ext", external_base_url=f"http://127.0.0.1:{servers['ports']['external']}/v1",
                external_api_key="upstream-secret", min_replicas=0, max_replicas=0)
    ext.full_clean()
    ext.save()
    llama_profile = Profile.from_preset("llama-cpp-python-cpu", name="llama")
    llama_profile.save()
    serve(make_model("llama", profile=llama_profile), servers["ports"]["llama"])
    key = ApiKey.create_key("fuzz")[1]
    wait_until(lambda: routed_to(httpx.post(servers["url"] + "/v1/embeddings", json={"model": "plain", "input": "x"},
                                            headers={"Authorization": f"Bearer {key}"}, timeout=30), replica),
               timeout_s=15, what="plain to be routed to this test's replica")
    return key


def assert_openai_shaped(path: str, raw: bytes, response: httpx.Response) -> None:
    where = f"/v1/{path} with {raw[:300]!r}: {response.status_code} {response.text[:300]}"
    assert response.status_code != 500, where
    if response.status_code < 300:
        return
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"], where
    assert isinstance(error["type"], str) and error["type"], where
    assert "param" in error and "code" in error, where
    assert error["param"] is None or isinstance(error["param"], str), where
    assert "Traceback" not in response.text, where


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_no_body_makes_the_gateway_answer_500_or_leave_openais_error_shape(servers, key, path):
    seen: dict[int, int] = {}
    beat = [time.monotonic()]
    with httpx.Client(base_url=servers["url"], timeout=30,
                      headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}) as client:

        @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(raw=bodies(path))
        def post_one(raw: bytes) -> None:
            if time.monotonic() - beat[0] > 1:  # the agent stays alive for a long run
                Agent.objects.filter(name="local").update(last_seen_at=timezone.now())
                beat[0] = time.monotonic()
            response = client.post(f"/v1/{path}", content=raw)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert_openai_shaped(path, raw, response)

        post_one()
    # The bodies reach every layer: some pass to the engine, most are refused.
    assert seen.get(200, 0) > 0 and seen.get(400, 0) > 0, seen


@pytest.mark.parametrize("raw, param", [
    (b'{"model": "plain\\ud800", "messages": [{"role": "user", "content": "x"}]}', "model"),
    (b'{"model": "\xed\xb0\x80", "messages": [{"role": "user", "content": "x"}]}', "model"),
    (b'{"model": "plain", "messages": [{"role": "user", "content": "a\\udc00"}]}', "messages[0].content"),
    (b'{"model": "plain", "messages": [{"role": "user", "content": "x"}], "metadata": {"\\ud800": "v"}}',
     "metadata.\\ud800"),
])
def test_a_lone_surrogate_is_a_400_naming_where_before_the_model_is_looked_up(servers, key, raw, param):
    response = httpx.post(servers["url"] + "/v1/chat/completions", content=raw, timeout=30,
                          headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, "invalid_value", "invalid_request_error")
    assert "x-llmgw-replica" not in response.headers
