"""OpenAI's request rules (gateway.validation), without a database: a valid body of each
endpoint passes, and each rule answers OpenAI's param, code and message."""

from __future__ import annotations

import json

import pytest

from catalog.engines import engine_traits
from gateway import validation

CHAT = "chat/completions"
COMPLETIONS = "completions"
EMBEDDINGS = "embeddings"
HI = [{"role": "user", "content": "x"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "d",
                                         "parameters": {"type": "object", "properties": {}}}}

VALID = [
    (CHAT, {"model": "m", "messages": HI}),
    (CHAT, {"model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "developer", "content": [{"type": "text", "text": "rules"}]},
        {"role": "user", "name": "ann", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            {"type": "video_url", "video_url": {"url": "http://x/v.mp4"}},  # vLLM's: passes
        ]},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
        {"role": "function", "name": "f", "content": "42"},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}, {"type": "refusal", "refusal": "no"}]},
    ]}),
    (CHAT, {"model": "m", "messages": HI, "temperature": 2, "top_p": 0.5, "n": 128, "presence_penalty": -2,
            "frequency_penalty": 2.0, "max_tokens": 16.0, "max_completion_tokens": 1, "logprobs": True,
            "top_logprobs": 20, "seed": -5, "stop": ["a", "b", "c", "d"], "user": "u", "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": False,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}}},
            "logit_bias": {"50256": -100, "1": 100}, "stream": True, "stream_options": {"include_usage": True},
            "top_k": 40, "min_p": 0.1, "grammar": "root ::= x"}),  # engines' extras pass
    (CHAT, {"model": "m", "messages": HI, "tool_choice": "required", "response_format": {"type": "json_object"},
            "stop": "\n", "temperature": None, "stream_options": None}),
    (CHAT, {"model": "m", "messages": HI, "seed": 2**63 - 1, "service_tier": "flex", "modalities": ["text"],
            "stop": ""}),  # OpenAI sets no minLength on a stop string
    (CHAT, {"model": "m", "messages": HI, "seed": -(2**63), "service_tier": "auto", "modalities": [],
            "stop": ["", "x"], "audio": None}),
    (COMPLETIONS, {"model": "m", "prompt": "once", "stop": ""}),
    (COMPLETIONS, {"model": "m", "prompt": "once"}),
    (COMPLETIONS, {"model": "m", "prompt": ["a", "b"], "echo": True, "best_of": 2, "suffix": "end", "logprobs": 5,
                   "max_tokens": 8, "stream": True, "stream_options": {"include_usage": False}}),
    (COMPLETIONS, {"model": "m", "prompt": [1, 2, 3]}),
    (COMPLETIONS, {"model": "m", "prompt": [[1, 2], [3]]}),
    (EMBEDDINGS, {"model": "m", "input": "x"}),
    (EMBEDDINGS, {"model": "m", "input": ["a", "b"], "encoding_format": "base64", "dimensions": 256, "user": "u"}),
    (EMBEDDINGS, {"model": "m", "input": [1, 2]}),
    (EMBEDDINGS, {"model": "m", "input": [[1, 2], [3]], "encoding_format": "float"}),
    (EMBEDDINGS, {"model": "m", "input": "x", "stream_options": {"include_usage": True}}),  # not OpenAI's there
]


@pytest.mark.parametrize("path, body", VALID)
def test_a_valid_body_passes(path, body):
    assert validation.check(path, body) is None
    assert validation.check(path, body, limits=(4096, 2048)) is None


def chat(**fields) -> dict:
    return {"model": "m", "messages": HI, **fields}


def one(message: dict) -> dict:
    return {"model": "m", "messages": [message]}


INVALID = [
    # (path, body, param, code)
    (CHAT, {"model": "m"}, "messages", "missing_required_parameter"),
    (CHAT, chat(messages="hi"), "messages", "invalid_type"),
    (CHAT, chat(messages=[]), "messages", "empty_array"),
    (CHAT, chat(messages=["hi"]), "messages[0]", "invalid_type"),
    (CHAT, one({"content": "x"}), "messages[0].role", "missing_required_parameter"),
    (CHAT, one({"role": 1, "content": "x"}), "messages[0].role", "invalid_type"),
    (CHAT, one({"role": "robot", "content": "x"}), "messages[0].role", "invalid_value"),
    (CHAT, one({"role": "user"}), "messages[0].content", "missing_required_parameter"),
    (CHAT, one({"role": "user", "content": None}), "messages[0].content", None),
    (CHAT, one({"role": "assistant", "content": None}), "messages[0].content", None),
    (CHAT, one({"role": "assistant", "content": None, "tool_calls": []}), "messages[0].tool_calls", "empty_array"),
    (CHAT, one({"role": "user", "content": []}), "messages[0].content", "empty_array"),
    (CHAT, chat(tools=[]), "tools", "empty_array"),
    (CHAT, one({"role": "user", "content": 5}), "messages[0].content", "invalid_type"),
    (CHAT, one({"role": "user", "content": {"type": "text"}}), "messages[0].content", "invalid_type"),
    (CHAT, one({"role": "user", "content": ["x"]}), "messages[0].content[0]", "invalid_type"),
    (CHAT, one({"role": "user", "content": [{"text": "x"}]}), "messages[0].content[0].type",
     "missing_required_parameter"),
    (CHAT, one({"role": "user", "content": [{"type": 3}]}), "messages[0].content[0].type", "invalid_type"),
    (CHAT, one({"role": "user", "content": [{"type": "text"}]}), "messages[0].content[0].text",
     "missing_required_parameter"),
    (CHAT, one({"role": "user", "content": [{"type": "text", "text": 1}]}), "messages[0].content[0].text",
     "invalid_type"),
    (CHAT, one({"role": "user", "content": [{"type": "image_url", "image_url": "http://x"}]}),
     "messages[0].content[0].image_url", "invalid_type"),
    (CHAT, one({"role": "user", "content": [{"type": "image_url", "image_url": {}}]}),
     "messages[0].content[0].image_url.url", "missing_required_parameter"),
    (CHAT, one({"role": "user", "content": "x", "name": 7}), "messages[0].name", "invalid_type"),
    (CHAT, one({"role": "tool", "content": "x"}), "messages[0].tool_call_id", "missing_required_parameter"),
    (CHAT, one({"role": "tool", "content": "x", "tool_call_id": 1}), "messages[0].tool_call_id", "invalid_type"),
    (CHAT, one({"role": "function", "content": "x"}), "messages[0].name", "missing_required_parameter"),
    (CHAT, one({"role": "assistant", "tool_calls": {"id": "x"}}), "messages[0].tool_calls", "invalid_type"),
    (CHAT, one({"role": "assistant", "tool_calls": [{"type": "function"}]}), "messages[0].tool_calls[0].id",
     "missing_required_parameter"),
    (CHAT, one({"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f"}}]}),
     "messages[0].tool_calls[0].function.arguments", "missing_required_parameter"),
    (CHAT, {"model": "m", "messages": [*HI, {"role": "user", "content": 1}]}, "messages[1].content", "invalid_type"),
    (CHAT, chat(temperature="hot"), "temperature", "invalid_type"),
    (CHAT, chat(temperature=True), "temperature", "invalid_type"),
    (CHAT, chat(temperature=2.5), "temperature", "decimal_above_max_value"),
    (CHAT, chat(temperature=-0.1), "temperature", "decimal_below_min_value"),
    (CHAT, chat(top_p=1.5), "top_p", "decimal_above_max_value"),
    (CHAT, chat(n=0), "n", "integer_below_min_value"),
    (CHAT, chat(n=129), "n", "integer_above_max_value"),
    (CHAT, chat(n=1.5), "n", "invalid_type"),
    (CHAT, chat(presence_penalty=3), "presence_penalty", "decimal_above_max_value"),  # the param's type
    (CHAT, chat(temperature=3), "temperature", "decimal_above_max_value"),
    (CHAT, chat(top_p=-1), "top_p", "decimal_below_min_value"),
    (CHAT, chat(frequency_penalty=-3), "frequency_penalty", "decimal_below_min_value"),
    (CHAT, chat(n=1.5), "n", "invalid_type"),
    (CHAT, chat(frequency_penalty=-2.5), "frequency_penalty", "decimal_below_min_value"),
    (CHAT, chat(max_tokens=0), "max_tokens", "integer_below_min_value"),
    (CHAT, chat(max_tokens="10"), "max_tokens", "invalid_type"),
    (CHAT, chat(max_tokens=5.5), "max_tokens", "invalid_type"),
    (CHAT, chat(max_completion_tokens=-1), "max_completion_tokens", "integer_below_min_value"),
    (CHAT, chat(logprobs=1), "logprobs", "invalid_type"),
    (CHAT, chat(logprobs=True, top_logprobs=21), "top_logprobs", "integer_above_max_value"),
    (CHAT, chat(top_logprobs=2), "top_logprobs", None),
    (CHAT, chat(logprobs=False, top_logprobs=2), "top_logprobs", None),
    (CHAT, chat(seed="1"), "seed", "invalid_type"),
    (CHAT, chat(seed=2**63), "seed", "integer_above_max_value"),
    (CHAT, chat(seed=-(2**63) - 1), "seed", "integer_below_min_value"),
    (CHAT, chat(seed=1e30), "seed", "integer_above_max_value"),
    (COMPLETIONS, {"prompt": "x", "seed": 10**20}, "seed", "integer_above_max_value"),
    (CHAT, chat(service_tier="turbo"), "service_tier", "invalid_value"),
    (CHAT, chat(service_tier=1), "service_tier", "invalid_type"),
    (CHAT, chat(modalities="text"), "modalities", "invalid_type"),
    (CHAT, chat(modalities=["text", 1]), "modalities[1]", "invalid_type"),
    (CHAT, chat(modalities=["video"]), "modalities[0]", "invalid_value"),
    (CHAT, chat(modalities=["text", "audio"]), "modalities", "unsupported_value"),
    (CHAT, chat(modalities=["audio"]), "modalities", "unsupported_value"),
    (CHAT, chat(audio={"voice": "alloy", "format": "wav"}), "audio", "unsupported_parameter"),
    (CHAT, chat(audio="alloy"), "audio", "invalid_type"),
    (CHAT, chat(stop=[]), "stop", "empty_array"),
    (CHAT, chat(stop=5), "stop", "invalid_type"),
    (CHAT, chat(stop=["a", "b", "c", "d", "e"]), "stop", "array_above_max_length"),
    (CHAT, chat(stop=["a", 1]), "stop[1]", "invalid_type"),
    (CHAT, chat(user=1), "user", "invalid_type"),
    (CHAT, chat(tools={}), "tools", "invalid_type"),
    (CHAT, chat(tools=["f"]), "tools[0]", "invalid_type"),
    (CHAT, chat(tools=[{"type": "retrieval"}]), "tools[0].type", "invalid_value"),
    (CHAT, chat(tools=[{"type": "function"}]), "tools[0].function", "missing_required_parameter"),
    (CHAT, chat(tools=[{"type": "function", "function": {}}]), "tools[0].function.name",
     "missing_required_parameter"),
    (CHAT, chat(tools=[{"type": "function", "function": {"name": "f", "parameters": []}}]),
     "tools[0].function.parameters", "invalid_type"),
    (CHAT, chat(tool_choice="any"), "tool_choice", "invalid_value"),
    (CHAT, chat(tool_choice=1), "tool_choice", "invalid_type"),
    (CHAT, chat(tool_choice={"type": "function"}), "tool_choice.function", "missing_required_parameter"),
    (CHAT, chat(response_format="json"), "response_format", "invalid_type"),
    (CHAT, chat(response_format={}), "response_format.type", "missing_required_parameter"),
    (CHAT, chat(response_format={"type": "yaml"}), "response_format.type", "invalid_value"),
    (CHAT, chat(response_format={"type": "json_schema"}), "response_format.json_schema", "missing_required_parameter"),
    (CHAT, chat(logit_bias=[1]), "logit_bias", "invalid_type"),
    (CHAT, chat(logit_bias={"1": 101}), "logit_bias.1", "integer_above_max_value"),
    (CHAT, chat(logit_bias={"1": "x"}), "logit_bias.1", "invalid_type"),
    (CHAT, chat(logit_bias={"abc": 1}), "logit_bias", "invalid_value"),
    (COMPLETIONS, {"model": "m", "prompt": "x", "logit_bias": {"-1": 1}}, "logit_bias", "invalid_value"),
    (CHAT, chat(stream="yes"), "stream", "invalid_type"),
    (CHAT, chat(stream=True, stream_options=[]), "stream_options", "invalid_type"),
    (CHAT, chat(stream=True, stream_options={"include_usage": "yes"}), "stream_options.include_usage",
     "invalid_type"),
    (CHAT, chat(stream_options={"include_usage": True}), "stream_options", None),
    (CHAT, chat(stream=False, stream_options={"include_usage": True}), "stream_options", None),
    (COMPLETIONS, {"model": "m"}, "prompt", "missing_required_parameter"),  # OpenAI requires it
    (COMPLETIONS, {"model": "m", "prompt": None, "max_tokens": 4}, "prompt", "missing_required_parameter"),
    (COMPLETIONS, {"model": "m", "prompt": "x", "logprobs": 6}, "logprobs", "integer_above_max_value"),
    (COMPLETIONS, {"model": "m", "prompt": "x", "temperature": 3}, "temperature", "decimal_above_max_value"),
    (COMPLETIONS, {"model": "m", "prompt": 5}, "prompt", "invalid_type"),
    (COMPLETIONS, {"model": "m", "prompt": {"a": 1}}, "prompt", "invalid_type"),
    (COMPLETIONS, {"model": "m", "prompt": ["a", 1.5]}, "prompt[0]", "invalid_type"),
    (COMPLETIONS, {"model": "m", "prompt": [[1], [True]]}, "prompt[1]", "invalid_type"),
    (COMPLETIONS, {"model": "m", "prompt": "x", "echo": "no"}, "echo", "invalid_type"),
    (COMPLETIONS, {"model": "m", "prompt": "x", "best_of": 21}, "best_of", "integer_above_max_value"),
    (COMPLETIONS, {"model": "m", "prompt": "x", "suffix": 1}, "suffix", "invalid_type"),
    (COMPLETIONS, {"model": "m", "prompt": "x", "logprobs": True}, "logprobs", "invalid_type"),
    (COMPLETIONS, {"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens", "integer_below_min_value"),
    (EMBEDDINGS, {"model": "m"}, "input", "missing_required_parameter"),
    (EMBEDDINGS, {"model": "m", "input": {"a": 1}}, "input", "invalid_type"),
    (EMBEDDINGS, {"model": "m", "input": []}, "input", None),
    (EMBEDDINGS, {"model": "m", "input": ""}, "input", None),
    (EMBEDDINGS, {"model": "m", "input": ["a", ""]}, "input[1]", None),
    (EMBEDDINGS, {"model": "m", "input": [[1], []]}, "input[1]", "invalid_type"),
    (EMBEDDINGS, {"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format", "invalid_value"),
    (EMBEDDINGS, {"model": "m", "input": "x", "dimensions": 0}, "dimensions", "integer_below_min_value"),
]


@pytest.mark.parametrize("path, body, param, code", INVALID)
def test_a_body_that_breaks_a_rule_names_the_param_and_code(path, body, param, code):
    problem = validation.check(path, body)
    assert problem is not None, body
    assert problem[0] == param and problem[2] == code, problem
    assert isinstance(problem[1], str) and problem[1]


@pytest.mark.parametrize("body, message", [
    (one({"role": "robot", "content": "x"}),
     "Invalid value: 'robot'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and "
     "'developer'."),
    (chat(max_tokens=0),
     "Invalid 'max_tokens': integer below minimum value. Expected a value >= 1, but got 0 instead."),
    (chat(temperature=3),
     "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 3 instead."),
    (chat(top_p=2),
     "Invalid 'top_p': decimal above maximum value. Expected a value <= 1, but got 2 instead."),
    (chat(n=0.0),
     "Invalid 'n': integer below minimum value. Expected a value >= 1, but got 0 instead."),
    (chat(temperature=3.5),
     "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 3.5 instead."),
    (chat(messages="hi"),
     "Invalid type for 'messages': expected an array of objects, but got a string instead."),
    ({"model": "m"}, "Missing required parameter: 'messages'."),
    (chat(stream_options={"include_usage": True}),
     "The 'stream_options' parameter is only allowed when 'stream' is enabled."),
    (one({"role": "user", "content": None}), "Invalid value for 'content': expected a string, got null."),
    (chat(top_logprobs=2), "The 'top_logprobs' parameter is only allowed when 'logprobs' is enabled."),
    (chat(messages=[]),
     "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead."),
    (one({"role": "user", "content": 5}),
     "Invalid type for 'messages[0].content': expected one of a string or array of objects, but got an integer "
     "instead."),
    (chat(parallel_tool_calls="yes"),
     "Invalid type for 'parallel_tool_calls': expected a boolean, but got a string instead."),
    (chat(seed=2**63),
     "Invalid 'seed': integer above maximum value. Expected a value <= 9223372036854775807, but got "
     "9223372036854775808 instead."),
    (chat(seed=-(2**63) - 1),
     "Invalid 'seed': integer below minimum value. Expected a value >= -9223372036854775808, but got "
     "-9223372036854775809 instead."),
    (chat(service_tier="turbo"),
     "Invalid value: 'turbo'. Supported values are: 'auto', 'default', 'flex', 'scale', and 'priority'."),
    (chat(modalities=["video"]), "Invalid value: 'video'. Supported values are: 'text' and 'audio'."),
    (chat(modalities=["text", "audio"]),
     "Unsupported value: 'modalities' does not support 'audio' with this model. This model answers text only."),
    (chat(stop=[]),
     "Invalid 'stop': empty array. Expected an array with minimum length 1, but got an empty array instead."),
    (chat(stop=list("abcde")),
     "Invalid 'stop': array too long. Expected an array with maximum length 4, but got an array with length 5 "
     "instead."),
])
def test_messages_are_openais_words(body, message):
    assert validation.check(CHAT, body)[1] == message


def test_an_empty_embeddings_input_is_openais_words():
    assert validation.check(EMBEDDINGS, {"input": []})[1] == ("'$.input' is invalid. Please check the API reference: "
                                                               "https://platform.openai.com/docs/api-reference.")


def test_top_level_fields_are_checked_in_the_bodys_order_before_the_messages():
    assert validation.check(CHAT, {"top_p": 2, "n": 0, "messages": "x"})[0] == "top_p"
    assert validation.check(CHAT, {"messages": "x", "n": 0, "top_p": 2})[0] == "n"


def test_a_huge_number_is_shown_cut_short():
    problem = validation.check(CHAT, chat(n=10 ** 300))
    assert problem[2] == "integer_above_max_value" and len(problem[1]) < 300


def test_audio_output_is_refused_saying_the_model_answers_text_only():
    param, message, code = validation.check(CHAT, chat(audio={"voice": "alloy", "format": "wav"}))
    assert (param, code) == ("audio", "unsupported_parameter")
    assert message.startswith("Unsupported parameter: 'audio' is not supported with this model.")
    assert "text only" in message


def test_service_tier_and_modalities_are_chat_fields_only():
    # Not OpenAI's on the legacy completions nor on embeddings: engines' extras there, passed on.
    assert validation.check(COMPLETIONS, {"prompt": "x", "service_tier": "turbo", "modalities": ["audio"]}) is None
    assert validation.check(EMBEDDINGS, {"input": "x", "service_tier": "turbo", "audio": {}}) is None


@pytest.mark.parametrize("body, sent", [
    ({"stop": "", "n": 1}, {"n": 1}),
    ({"stop": ["", "x", ""]}, {"stop": ["x"]}),
    ({"stop": [""]}, {}),
    ({"stop": ["\n"]}, {"stop": ["\n"]}),
    ({"stop": " "}, {"stop": " "}),  # white space is a real stop
    ({}, {}),
])
def test_empty_stop_strings_are_taken_out_before_the_engine(body, sent):
    before = json.dumps(body)
    assert validation.without_empty_stops(body) == sent
    assert json.dumps(body) == before  # not changed in place


def test_a_body_without_empty_stops_is_returned_as_it_is():
    body = {"stop": ["x"], "messages": HI}
    assert validation.without_empty_stops(body) is body


def test_other_paths_are_not_checked():
    assert validation.check("responses", {"anything": 1}) is None


# --- limits --------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, field", [(CHAT, "max_tokens"), (CHAT, "max_completion_tokens"),
                                         (COMPLETIONS, "max_tokens")])
def test_max_tokens_over_the_models_output_limit_is_refused_naming_it(path, field):
    body = {"messages": HI, "prompt": "x", field: 5000}
    param, message, code = validation.check(path, body, limits=(8192, 4096))
    assert (param, code) == (field, "invalid_value")
    assert message == (f"{field} is too large: 5000. This model supports at most 4096 completion tokens, whereas "
                       f"you provided 5000.")


@pytest.mark.parametrize("asked, ok", [(4095, True), (4096, False), (10 ** 6, False)])
def test_max_tokens_that_fill_the_context_are_context_length_exceeded(asked, ok):
    problem = validation.check(CHAT, chat(max_tokens=asked), limits=(4096, None))
    if ok:
        assert problem is None
    else:
        assert problem[0] == "max_tokens" and problem[2] == "context_length_exceeded" and "4096" in problem[1]


def test_unknown_limits_and_embeddings_are_not_bounded():
    assert validation.check(CHAT, chat(max_tokens=10 ** 6), limits=(None, None)) is None
    assert validation.check(EMBEDDINGS, {"input": "x", "max_tokens": 10 ** 6}, limits=(10, 10)) is None


# --- lone surrogates -----------------------------------------------------------------------------

@pytest.mark.parametrize("raw, path", [
    (b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages[0].content"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
     "messages[0].content[0].text"),
    (b'{"model": "\\uDBFF"}', "model"),
    (b'{"metadata": {"\\ud800": 1}}', "metadata.\\ud800"),
    (b'{"\\ud800": 1}', "\\ud800"),
    (b'{"stop": ["ok", "\\ude00\\ud83d"]}', "stop[1]"),  # low before high: both lone
    (b'{"model": "\xed\xa0\x80"}', "model"),  # encoded as UTF-8 bytes: json's surrogatepass lets it in
    ('{"model": "m", "x": "\ud800"}'.encode("utf-16", "surrogatepass"), "x"),  # a UTF-16 body
])
def test_a_lone_surrogate_anywhere_is_found_and_named(raw, path):
    assert validation.has_surrogate_escape(raw)
    assert validation.lone_surrogate_path(json.loads(raw)) == path
    param, message, code = validation.lone_surrogate_problem(path)
    assert param == path and code == "invalid_value" and path in message


@pytest.mark.parametrize("raw", [
    b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00 ok"}]}',  # a pair: one emoji
    b'{"content": "\\\\ud800"}',  # an escaped backslash, then text
    '{"content": "\ud55c\uad6d\uc5b4 \U0001f600"}'.encode(),  # Hangul starts with byte ED too
])
def test_pairs_and_lookalikes_are_not_lone(raw):
    assert validation.lone_surrogate_path(json.loads(raw)) is None


def test_a_plain_body_is_not_walked():
    assert not validation.has_surrogate_escape(b'{"model": "m", "messages": [{"role": "user", "content": "\\u00e9"}]}')
    assert not validation.has_surrogate_escape('{"content": "日本 ✓"}'.encode())


def test_a_deep_body_is_walked_without_recursion():
    body: object = "\ud800"
    for _ in range(5000):
        body = [body]
    assert validation.lone_surrogate_path({"x": body}) == "x" + "[0]" * 5000


def test_a_completion_without_a_prompt_is_openais_missing_parameter():
    assert validation.check(COMPLETIONS, {"model": "m", "max_tokens": 4}) == (
        "prompt", "Missing required parameter: 'prompt'.", "missing_required_parameter")


@pytest.mark.parametrize("field", ["temperature", "top_p", "presence_penalty", "frequency_penalty"])
def test_a_decimal_parameter_says_decimal_for_an_integer_value(field):
    code = validation.check(CHAT, chat(**{field: 10 ** 6}))[2]
    assert code == "decimal_above_max_value"


@pytest.mark.parametrize("path, field, value", [(CHAT, "n", 129.0), (CHAT, "max_tokens", 0.0),
                                                 (CHAT, "top_logprobs", 21.0), (COMPLETIONS, "best_of", 21.0),
                                                 (COMPLETIONS, "logprobs", 6.0), (EMBEDDINGS, "dimensions", 0.0)])
def test_an_integer_parameter_says_integer_for_a_whole_float_value(path, field, value):
    body = {"model": "m", "messages": HI, "prompt": "x", "input": "x", **({"logprobs": True} if path == CHAT else {}),
            field: value}
    assert validation.check(path, body)[2].startswith("integer_")


@pytest.mark.parametrize("key", ["abc", "-1", "1.5", "", "+1", " 1", "1e3", "\uff11", "0x10"])
def test_a_logit_bias_key_that_is_no_token_id_is_openais_invalid_key(key):
    problem = validation.check(CHAT, chat(logit_bias={"7": 1, key: 1}))
    assert problem is not None and problem[0] == "logit_bias" and problem[2] == "invalid_value", problem
    assert problem[1].startswith("Invalid key in 'logit_bias': ")
    assert "You should only be submitting non-negative integers" in problem[1]


@pytest.mark.parametrize("key", ["0", "123", "007", "50256"])
def test_a_logit_bias_key_of_decimal_digits_is_a_token_id(key):
    assert validation.check(CHAT, chat(logit_bias={key: -100})) is None


def test_a_logit_bias_key_is_checked_before_its_value():
    problem = validation.check(CHAT, chat(logit_bias={"abc": 500}))
    assert problem[0] == "logit_bias" and problem[1].startswith("Invalid key in 'logit_bias': abc.")


LLAMA_CPP_PYTHON = engine_traits("llama_cpp_python", "python -m llama_cpp.server --model m.gguf")
VLLM = engine_traits("vllm", "vllm serve m")


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[1, 2], [3]], [7]])
def test_a_token_id_prompt_is_refused_for_an_engine_that_takes_text_only(prompt):
    body = {"model": "m", "prompt": prompt}
    assert validation.check(COMPLETIONS, body) is None
    problem = validation.engine_problem(COMPLETIONS, body, LLAMA_CPP_PYTHON, "tiny")
    assert problem is not None and problem[0] == "prompt" and problem[2] == "unsupported_value", problem
    assert "'tiny'" in problem[1] and "text prompts only" in problem[1]


@pytest.mark.parametrize("prompt", ["once", ["once"], ["a", "b"]])
def test_a_text_prompt_passes_an_engine_that_takes_text_only(prompt):
    assert validation.engine_problem(COMPLETIONS, {"model": "m", "prompt": prompt}, LLAMA_CPP_PYTHON, "tiny") is None


def test_a_token_id_prompt_passes_an_engine_that_reads_token_ids():
    for prompt in ([1, 2, 3], [[1, 2], [3]]):
        assert validation.engine_problem(COMPLETIONS, {"model": "m", "prompt": prompt}, VLLM, "big") is None


def test_token_ids_in_a_chat_or_an_embeddings_body_are_not_a_prompt():
    assert validation.engine_problem(EMBEDDINGS, {"model": "m", "input": [1, 2]}, LLAMA_CPP_PYTHON, "tiny") is None
    assert validation.engine_problem(CHAT, chat(prompt=[1, 2]), LLAMA_CPP_PYTHON, "tiny") is None
