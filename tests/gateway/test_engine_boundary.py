"""What the ``openai`` SDK sees at the engine boundary (issue 15), through a real web process
(uvicorn, as ``llmgw up`` runs it) and fake engine processes that behave like
llama-cpp-python's server: ``n`` ignored, no usage chunk in streams, non-streamed requests
that run on after their client left. The gateway serves OpenAI's answers anyway: fan-out,
usage counted, non-streamed requests assembled from a stream (so a client that leaves stops
the engine), engine errors mapped, OpenAI's limits and the model's endpoints enforced
before anything reaches an engine."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from catalog.models import Model, Profile
from gateway.models import ApiKey, UsageRecord
from tests.processes import fake_engine, free_port, open_request, wait_for_port, wait_until, web_server
from tests.replicas import ENGINE_KEY, routed_to, serve

pytestmark = [pytest.mark.django_db(transaction=True)]

HI = [{"role": "user", "content": "say hi"}]
TRACEBACK_500 = json.dumps({"error": {"message": "Traceback (most recent call last):\n  File "
                                                 "\"/opt/engine/app.py\", line 12, in run\nRuntimeError: CUDA out of "
                                                 "memory", "type": "internal_server_error"}})

ENGINES = {
    # name: fake engine flags (every one refuses requests without the engine key)
    "llama": ("--tokens", "5", "--no-usage-chunk"),
    "slowllama": ("--tokens", "400", "--token-delay-ms", "25", "--no-usage-chunk"),
    "broken": ("--error-status", "500", "--error-body", TRACEBACK_500),
    "strict": ("--fastapi-422",),
    "honest": ("--tokens", "4", "--honor-n"),
    "overflow": ("--fail-in-stream",),
    # One request at a time, answers bigger than every socket buffer between it and the client.
    "serial": ("--capacity", "1", "--tokens", "300", "--piece-bytes", "32768", "--no-usage-chunk"),
    "undone": ("--tokens", "3", "--no-done"),
    "undone-custom": ("--tokens", "3", "--no-done"),
    "toolish": ("--tool-call", "--repeat-tool-names", "--no-usage-chunk"),
    "midllama": ("--tokens", "6", "--no-usage-chunk", "--stream-error", "Traceback (most recent call last):\n  File "
                 "\"/srv/llama/app.py\", line 3, in x\nValueError: the grammar broke"),
    "midway": ("--tokens", "6", "--stream-error", "Traceback (most recent call last):\n  File \"/srv/vllm/engine.py\", "
               "line 9, in step\nRuntimeError: the engine died"),
}


#: Served with llama-cpp-python's profile: the gateway knows what that engine does not.
LLAMA_LIKE = ("llama", "slowllama", "overflow", "undone", "toolish", "midllama", "serial")


@pytest.fixture(scope="module")
def servers(django_db_setup, tmp_path_factory):
    logs = tmp_path_factory.mktemp("boundary")
    ports = {name: free_port() for name in ENGINES}
    records = {name: logs / f"{name}.jsonl" for name in ENGINES}
    engines = [fake_engine(ports[name], logs, *flags, "--record", str(records[name]), api_key=ENGINE_KEY)
               for name, flags in ENGINES.items()]
    for name in ENGINES:
        wait_for_port(ports[name])
    web_port = free_port()
    web = web_server(web_port, logs, env={"LLMGW_WATCH_INTERVAL": "50ms", "LLMGW_USAGE_FLUSH_INTERVAL": "0.2s"})
    yield {"ports": ports, "records": records, "url": f"http://127.0.0.1:{web_port}",
           "web": web, "web_port": web_port}
    for proc in [web, *engines]:
        proc.stop()


def records(servers, name: str, event: str = "request") -> list[dict]:
    path = servers["records"][name]
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in rows if r.get("event") == event]


@pytest.fixture
def llama_profile(transactional_db) -> Profile:
    """A llama-cpp-python profile: what the gateway knows of the engine comes from it (no
    ``n``, no usage chunk, no cancel of a non-streamed request, /extras/tokenize, chat and
    completions only, a 512-token context from ``--n_ctx``)."""
    profile = Profile.from_preset("llama-cpp-python-cpu", name="llama")
    profile.command = profile.command.replace("--n_ctx 2048", "--n_ctx 512")
    profile.full_clean()
    profile.save()
    return profile


@pytest.fixture
def key(transactional_db) -> str:
    return ApiKey.create_key("boundary")[1]


@pytest.fixture
def models(servers, make_model, llama_profile, key):
    made = {}
    for name in ENGINES:
        profile = llama_profile if name in LLAMA_LIKE else None
        extra = {"profile": profile} if profile else {}
        if name == "llama":
            extra["max_output_tokens"] = 100
            extra["aliases"] = "llama-alias"
        made[name] = make_model(name, **extra)
        replica = serve(made[name], servers["ports"][name])
        wait_until(lambda: routed_to(post(servers, "/v1/chat/completions",
                                          {"model": name, "messages": HI, "max_tokens": 1}, key), replica),
                   timeout_s=15, what=f"{name} to be routed to this test's replica")
    return made


def post(servers, path: str, body: dict, key: str, **kw) -> httpx.Response:
    return httpx.post(servers["url"] + path, json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=kw.pop("timeout", 30), **kw)


@pytest.fixture
def oai(servers, key) -> openai.OpenAI:
    return openai.OpenAI(base_url=servers["url"] + "/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture
def aoai(servers, key) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=servers["url"] + "/v1", api_key=key, max_retries=0, timeout=30)


# --- n > 1 on an engine that ignores n ---------------------------------------------------------


def test_n_choices_from_an_engine_that_ignores_n_are_fanned_out_and_merged(oai, servers, models):
    before = len(records(servers, "llama"))
    reply = oai.chat.completions.create(model="llama", messages=HI, n=3, max_tokens=5)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.message.content and c.finish_reason for c in reply.choices)
    sent = records(servers, "llama")[before:]
    assert len(sent) == 3 and all(r["n"] is None and r["stream"] for r in sent)  # n requests of one choice
    # The prompt counted once (by the engine's tokenizer), the completions summed.
    assert reply.usage.completion_tokens == 15 and reply.usage.prompt_tokens == 2
    assert reply.usage.total_tokens == 17


def test_n_choices_streamed_come_interleaved_with_their_own_index_and_one_done(oai, models):
    chunks = list(oai.chat.completions.create(model="llama", messages=HI, n=2, max_tokens=5, stream=True,
                                              stream_options={"include_usage": True}))
    indexes = {c.choices[0].index for c in chunks if c.choices}
    assert indexes == {0, 1}
    assert len({c.id for c in chunks}) == 1  # one completion, as OpenAI streams it
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_an_engine_that_serves_n_itself_gets_the_request_as_sent(oai, servers, models):
    reply = oai.chat.completions.create(model="honest", messages=HI, n=2, max_tokens=4)
    assert len(reply.choices) == 2 and records(servers, "honest")[-1]["n"] == 2


# --- usage the client asked for ----------------------------------------------------------------


def test_include_usage_gets_its_chunk_from_an_engine_that_sends_none(oai, models):
    chunks = list(oai.chat.completions.create(model="llama", messages=HI, max_tokens=5, stream=True,
                                              stream_options={"include_usage": True}))
    assert [c.choices for c in chunks[-1:]] == [[]]
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (2, 5, 7)
    assert all(c.usage is None for c in chunks[:-1])


def test_a_stream_without_include_usage_gets_no_usage_chunk(oai, models):
    chunks = list(oai.chat.completions.create(model="llama", messages=HI, max_tokens=5, stream=True))
    assert all(c.choices and c.usage is None for c in chunks)


def test_a_non_streamed_answer_always_carries_usage(oai, models):
    reply = oai.completions.create(model="llama", prompt="one two three", max_tokens=5)
    assert reply.object == "text_completion" and reply.choices[0].text
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 5)
    chat = oai.chat.completions.create(model="llama", messages=HI, max_tokens=5)
    assert chat.object == "chat.completion" and chat.usage.completion_tokens == 5


async def test_the_async_client_gets_the_same_answers(aoai, models):
    reply = await aoai.chat.completions.create(model="llama", messages=HI, n=2, max_tokens=5)
    assert len(reply.choices) == 2 and reply.usage.completion_tokens == 10
    stream = await aoai.chat.completions.create(model="llama", messages=HI, max_tokens=5, stream=True,
                                                stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert chunks[-1].usage.completion_tokens == 5
    with pytest.raises(openai.BadRequestError):
        await aoai.chat.completions.create(model="llama", messages=HI, max_tokens=0)


# --- a client that leaves stops the engine ------------------------------------------------------


def test_a_non_streamed_request_is_asked_as_a_stream_and_a_client_that_leaves_stops_it(servers, models, key):
    """llama-cpp-python generates a non-streamed answer to the end after its client left;
    asked for a stream, it stops when the gateway closes it."""
    before = len(records(servers, "slowllama"))
    # The client leaves once the engine has the request, however long a busy machine took
    # to get it there (a client timeout could run out before the request left the gateway).
    with open_request(servers["web_port"], "/v1/completions",
                      {"model": "slowllama", "prompt": "x", "max_tokens": 400}, key):
        wait_until(lambda: len(records(servers, "slowllama")) > before, timeout_s=60,
                   what="the engine to get the request")
    sent = records(servers, "slowllama")[-1]
    assert sent["path"] == "/v1/completions" and sent["stream"] is True and sent["max_tokens"] == 400
    wait_until(lambda: records(servers, "slowllama", "cancelled"), timeout_s=60,
               what="the engine to see the request cancelled")
    # 400 tokens take 10 s: it stopped for the client that left.
    assert not [r for r in records(servers, "slowllama", "completed") if r["path"] == "/v1/completions"]
    wait_until(lambda: UsageRecord.objects.filter(model_name="slowllama", status=499, stream=False).exists(),
               timeout_s=60, what="the 499 usage record")


# --- engine errors -------------------------------------------------------------------------------


def test_an_engine_500_is_a_502_engine_error_on_one_line_and_its_status_is_kept(oai, models):
    with pytest.raises(openai.InternalServerError) as failed:
        oai.chat.completions.create(model="broken", messages=HI, max_tokens=3)
    error = failed.value.body
    assert failed.value.status_code == 502 and error["code"] == "engine_error"
    assert "\n" not in error["message"] and "/opt/engine" not in error["message"], error
    assert "CUDA out of memory" in error["message"]
    wait_until(lambda: UsageRecord.objects.filter(model_name="broken", status=502, upstream_status=500).exists(),
               timeout_s=10, what="a usage record with the engine's own status")


def test_an_engines_validation_error_is_a_400_naming_the_parameter(oai, models):
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model="strict", messages=HI, max_tokens=3)
    assert refused.value.status_code == 400 and refused.value.body["param"] == "max_tokens"


# --- what the model serves, and its limits ---------------------------------------------------


def test_an_endpoint_the_model_does_not_serve_is_a_404_naming_those_it_does(oai, servers, models):
    before = len(records(servers, "llama"))
    with pytest.raises(openai.NotFoundError) as refused:
        oai.embeddings.create(model="llama", input="x")
    message = refused.value.body["message"]
    assert "/v1/embeddings" in message and "/v1/chat/completions" in message and "/v1/completions" in message
    assert len(records(servers, "llama")) == before  # never reached the engine


def test_the_models_limits_are_openais_400s_before_the_engine(oai, servers, models):
    before = len(records(servers, "llama"))
    with pytest.raises(openai.BadRequestError) as over_output:
        oai.chat.completions.create(model="llama", messages=HI, max_tokens=200)
    assert over_output.value.body["param"] == "max_tokens" and "100" in over_output.value.body["message"]
    Model.objects.filter(name="llama").update(max_output_tokens=None)
    wait_until(lambda: post(servers, "/v1/chat/completions", {"model": "llama", "messages": HI, "max_tokens": 600},
                            oai.api_key).json()["error"]["code"] == "context_length_exceeded",
               timeout_s=10, what="the context limit (512, from --n_ctx) to apply")
    with pytest.raises(openai.BadRequestError) as over_context:
        oai.chat.completions.create(model="llama", messages=HI, max_completion_tokens=600)
    assert "512" in over_context.value.body["message"]
    for bad in (0, -1):
        with pytest.raises(openai.BadRequestError):
            oai.chat.completions.create(model="llama", messages=HI, max_tokens=bad)
    assert len(records(servers, "llama")) == before


def test_models_list_shows_capabilities_and_limits(oai, models):
    listed = {m.id: m for m in oai.models.list()}
    llama = listed["llama"].model_dump()
    assert llama["capabilities"] == ["chat/completions", "completions"]
    assert llama["context_length"] == 512 and llama["max_output_tokens"] == 100
    assert "embeddings" in listed["honest"].model_dump()["capabilities"]


def test_invalid_unicode_is_a_400_naming_where_it_is(servers, models, key):
    raw = b'{"model": "llama", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    r = httpx.post(servers["url"] + "/v1/chat/completions", content=raw, timeout=30,
                   headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content", r.text
    r = httpx.post(servers["url"] + "/v1/chat/completions", content=b'{"model": "\\udc00", "messages": []}',
                   headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text


def test_an_unknown_role_is_openais_400(oai, models):
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model="llama", messages=[{"role": "wizard", "content": "x"}])
    assert refused.value.body["param"] == "messages[0].role" and refused.value.body["code"] == "invalid_value"



def test_an_engines_error_inside_a_stream_reaches_the_client_on_one_line(servers, models, key):
    with httpx.stream("POST", servers["url"] + "/v1/chat/completions", timeout=30,
                      json={"model": "midway", "messages": HI, "max_tokens": 6, "stream": True},
                      headers={"Authorization": f"Bearer {key}"}) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
    assert len(errors) == 1, events
    assert errors[0]["message"] == "RuntimeError: the engine died" and errors[0]["code"] == "engine_error", errors


def test_a_request_by_alias_is_recorded_under_the_models_name(oai, models):
    before = UsageRecord.objects.filter(model_name="llama").count()
    reply = oai.chat.completions.create(model="llama-alias", messages=HI, max_tokens=2)
    assert reply.choices
    wait_until(lambda: UsageRecord.objects.filter(model_name="llama").count() > before, timeout_s=10,
               what="the usage record")
    assert not UsageRecord.objects.filter(model_name="llama-alias").exists()


# --- what llama-cpp-python does wrong, answered as OpenAI would --------------------------------


def test_a_prompt_over_the_context_is_a_400_before_the_engine(servers, models, key):
    """The gateway counts the prompt with the engine's tokenizer first (a word a token on the
    fake engine): over the 512-token context, with or without the completion asked for."""
    before = len(records(servers, "llama"))
    long_prompt = " ".join(["word"] * 600)
    for body in ({"prompt": long_prompt, "max_tokens": 2}, {"prompt": " ".join(["word"] * 500), "max_tokens": 20},
                 {"prompt": long_prompt, "max_tokens": 2, "stream": True}):
        r = post(servers, "/v1/completions", {"model": "llama", **body}, key)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert "512" in r.json()["error"]["message"] and r.json()["error"]["param"] == "prompt"
    assert len(records(servers, "llama")) == before
    assert post(servers, "/v1/completions", {"model": "llama", "prompt": "a b c", "max_tokens": 2},
                key).status_code == 200


def test_a_refused_prompt_costs_its_key_nothing(servers, models, key):
    """A prompt the gateway refused as over the context was recorded with its counted tokens,
    so its key's budget (summed from usage records), /metrics and the admin charged a request
    that never ran: four refused 1.4M-token prompts spent a 5M daily budget."""
    r = post(servers, "/v1/completions", {"model": "llama", "prompt": " ".join(["word"] * 600), "max_tokens": 2,
                                          "user": "refused-costs-nothing"}, key)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    wait_until(lambda: UsageRecord.objects.filter(model_name="llama", status=400).exists(), timeout_s=10,
               what="the refused request's usage record")
    assert {(row.prompt_tokens, row.completion_tokens) for row in UsageRecord.objects.filter(
        model_name="llama", status=400)} == {(None, None)}


def test_a_prompt_longer_than_any_tokenizer_could_fit_is_refused_without_the_tokenizer(servers, models, key):
    """Megabytes of prompt kept the engine's tokenizer (and so the replica) busy for tens of
    seconds before the 400; a second one waiting behind it timed out, went uncounted to the
    engine and came back a 502. Past context × 128 bytes no tokenizer is asked: one word of
    70,000 letters (one token to the fake engine's word count) is refused at once."""
    tokenized = len(records(servers, "llama", "tokenize"))
    for path, body in (("/v1/completions", {"prompt": "x" * 70_000}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "é" * 35_000}]})):
        r = post(servers, path, {"model": "llama", "max_tokens": 2, **body}, key)
        error = r.json()["error"]
        assert r.status_code == 400 and error["code"] == "context_length_exceeded", r.text
        assert "512 tokens" in error["message"] and "70,000 bytes" in error["message"]
        assert error["param"] == ("prompt" if path == "/v1/completions" else "messages")
    assert len(records(servers, "llama", "tokenize")) == tokenized


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_that_ends_its_stream_before_any_event_is_asked_why(oai, servers, models, stream):
    """llama-cpp-python starts a stream, then raises (a prompt over its context it did not
    count as we did): the gateway asks again without a stream and answers the engine's
    error, never an empty 200."""
    with pytest.raises(openai.BadRequestError) as refused:
        answer = oai.chat.completions.create(model="overflow", messages=HI, max_tokens=3, stream=stream)
        list(answer) if stream else None
    assert refused.value.body["code"] == "context_length_exceeded"
    probe = records(servers, "overflow")[-1]
    assert probe["stream"] is False and probe["max_tokens"] == 3  # as asked, so the engine's error names it


@pytest.mark.parametrize("model", ["undone", "undone-custom"])
def test_a_stream_that_ends_without_done_ends_with_an_error_event(servers, models, key, model):
    with httpx.stream("POST", servers["url"] + "/v1/chat/completions", timeout=30,
                      json={"model": model, "messages": HI, "max_tokens": 3, "stream": True},
                      headers={"Authorization": f"Bearer {key}"}) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] != "[DONE]" and json.loads(events[-1])["error"]["code"] == "upstream_stream_broken", events
    assert "[DONE]" not in events


def test_a_non_streamed_answer_from_a_stream_without_done_is_a_502(oai, models):
    with pytest.raises(openai.APIStatusError) as broken:
        oai.chat.completions.create(model="undone", messages=HI, max_tokens=3)
    assert broken.value.status_code == 502


def test_streamed_tool_calls_name_the_function_once_as_openai_streams_them(oai, models):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    chunks = list(oai.chat.completions.create(model="toolish", messages=HI, tools=tools, stream=True,
                                              stream_options={"include_usage": True}))
    calls = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert calls[0].function.name == "get_weather" and calls[0].id == "call_1"
    assert all(c.function.name is None and c.id is None for c in calls[1:])
    assert all(c.choices[0].delta.function_call is None for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens == len(calls)  # tool-call pieces are tokens too
    with oai.beta.chat.completions.stream(model="toolish", messages=HI, tools=tools) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.name == "get_weather"
    reply = oai.chat.completions.create(model="toolish", messages=HI, tools=tools)
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert reply.choices[0].message.function_call is None  # never both, as OpenAI answers


def test_an_error_in_a_composed_stream_ends_it_on_one_line(servers, models, key):
    with httpx.stream("POST", servers["url"] + "/v1/chat/completions", timeout=30,
                      json={"model": "midllama", "messages": HI, "max_tokens": 6, "stream": True},
                      headers={"Authorization": f"Bearer {key}"}) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    last = json.loads(events[-1])["error"]
    assert last["message"] == "ValueError: the grammar broke" and "[DONE]" not in events, events


def test_a_list_of_prompts_gets_a_choice_per_prompt(oai, servers, models):
    reply = oai.completions.create(model="llama", prompt=["one two", "three"], max_tokens=2, n=2)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    sent = [r["prompt"] for r in records(servers, "llama")[-4:]]
    assert sent == ["one two", "one two", "three", "three"]  # choice i*n + j is prompt i's j-th


def test_a_developer_message_goes_to_llama_cpp_python_as_system(oai, servers, models):
    # The preset's --chat_format gemma drops system messages: they are folded into the first
    # user turn instead, as Gemma's own template does.
    oai.chat.completions.create(model="llama", max_tokens=2, messages=[{"role": "developer", "content": "be brief"},
                                                                       {"role": "user", "content": "hi"}])
    assert records(servers, "llama")[-1]["roles"] == ["user"]
    assert records(servers, "llama")[-1]["contents"] == ["be brief\n\nhi"]
    # An assistant turn without content (a tool call) gets "" (the engine fails on a missing one).
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert oai.chat.completions.create(model="llama", max_tokens=2, messages=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]).choices
    assert records(servers, "llama")[-1]["contents"] == ["hi", "", "42"]
    oai.chat.completions.create(model="honest", max_tokens=2, messages=[{"role": "developer", "content": "x"}])
    assert records(servers, "honest")[-1]["roles"] == ["developer"]  # an engine that knows it gets it


def test_echo_puts_the_prompt_back_and_is_refused_in_a_stream(oai, models):
    reply = oai.completions.create(model="llama", prompt="hello there", max_tokens=2, echo=True)
    assert reply.choices[0].text.startswith("hello there") and len(reply.choices[0].text) > len("hello there")
    with pytest.raises(openai.BadRequestError) as refused:
        list(oai.completions.create(model="llama", prompt="x", max_tokens=2, echo=True, stream=True))
    assert refused.value.body["param"] == "echo"


def test_names_no_model_can_have_are_a_404_without_a_lookup(servers, models, key):
    for name in ("a\x00b", "x\ny", "é" * 3, "a" * 300):
        raw = json.dumps({"model": name, "messages": [{"role": "user", "content": "x"}]}).encode()
        r = httpx.post(servers["url"] + "/v1/chat/completions", content=raw, timeout=30,
                       headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
        assert "\n" not in r.json()["error"]["message"] and "\x00" not in r.json()["error"]["message"]
    r = httpx.get(servers["url"] + "/v1/models/a%00b", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text


def test_a_body_nested_too_deeply_or_not_utf8_is_a_400(servers, models, key):
    deep = '{"model": "llama", "messages": [{"role": "user", "content": "x"}], "x": ' + "[" * 300 + "]" * 300 + "}"
    for raw in (deep.encode(), json.dumps({"model": "llama", "messages": HI}).encode("utf-16")):
        r = httpx.post(servers["url"] + "/v1/chat/completions", content=raw, timeout=30,
                       headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text


def test_what_the_engine_would_ignore_is_refused(oai, models):
    image = [{"role": "user", "content": [{"type": "text", "text": "what is it"},
                                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model="llama", messages=image, max_tokens=2)
    assert refused.value.body["param"] == "messages[0].content[1]", refused.value.body
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model="llama", messages=HI, tools=tools, tool_choice="required", max_tokens=2)
    assert refused.value.body["param"] == "tool_choice"
    # A malformed grammar kills llama-cpp-python 0.3.36 (SIGSEGV) for everyone: never sent.
    with pytest.raises(openai.BadRequestError) as refused:
        oai.completions.create(model="llama", prompt="x", max_tokens=2, extra_body={"grammar": "root ::= ("})
    assert refused.value.body["param"] == "grammar"
    # An engine that serves them gets them.
    assert oai.chat.completions.create(model="honest", messages=image, max_tokens=2).choices


@pytest.mark.parametrize("stream", [False, True])
def test_n_legs_on_an_engine_that_serves_one_request_at_a_time_all_finish(servers, models, key, stream):
    """Each leg is read as soon as it answers: were the second opened before the first is
    read, the engine would wait to write the first (its socket full) and never answer the
    second."""
    body = {"model": "serial", "prompt": "x", "max_tokens": 300, "n": 2, "stream": stream}
    with httpx.stream("POST", servers["url"] + "/v1/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as r:
        raw = r.read()
    assert r.status_code == 200, raw[:300]
    if stream:
        chunks = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]
        indexes = {c["choices"][0]["index"] for c in chunks if c.get("choices")}
        assert indexes == {0, 1}
    else:
        assert [len(c["text"]) > 300 * 32768 for c in json.loads(raw)["choices"]] == [True, True]


def test_each_prompt_of_a_list_is_held_to_the_context_not_their_sum(oai, models):
    fits = " ".join(["word"] * 300)  # 300 tokens each, 600 together, in a 512-token context
    reply = oai.completions.create(model="llama", prompt=[fits, fits], max_tokens=2)
    assert len(reply.choices) == 2 and reply.usage.prompt_tokens == 600
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="llama", prompt=[fits, " ".join(["word"] * 600)], max_tokens=2)
    with pytest.raises(openai.BadRequestError) as refused:
        oai.completions.create(model="llama", prompt=["a", "b"], max_tokens=2, n=100)
    assert "128" in refused.value.body["message"]


def test_the_models_default_is_cut_to_what_the_context_leaves(oai, servers, models, key):
    Model.objects.filter(name="llama").update(default_max_tokens=100)
    prompt = " ".join(["word"] * 450)  # 450 of 512 tokens: 62 left for the answer
    wait_until(lambda: post(servers, "/v1/completions", {"model": "llama", "prompt": "a b"}, key).status_code == 200
               and records(servers, "llama")[-1]["max_tokens"] == 100, timeout_s=10, what="the default to apply")
    reply = oai.completions.create(model="llama", prompt=prompt)
    assert reply.choices and records(servers, "llama")[-1]["max_tokens"] == 62
    with pytest.raises(openai.BadRequestError):  # but what the client names is held to the context
        oai.completions.create(model="llama", prompt=prompt, max_tokens=100)


def test_a_legacy_functions_request_is_answered_with_a_function_call(oai, models):
    functions = [{"name": "get_weather", "parameters": {"type": "object"}}]
    reply = oai.chat.completions.create(model="toolish", messages=HI, functions=functions,
                                        function_call={"name": "get_weather"})
    choice = reply.choices[0]
    assert choice.message.function_call.name == "get_weather" and not choice.message.tool_calls
    assert choice.finish_reason == "function_call"
    chunks = list(oai.chat.completions.create(model="toolish", messages=HI, functions=functions, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [d.function_call for d in deltas if d.function_call]
    assert calls[0].name == "get_weather" and all(c.name is None for c in calls[1:])
    assert all(not d.tool_calls for d in deltas)
