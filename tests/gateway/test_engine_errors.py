"""gateway.engine_errors: engines' error answers in OpenAI's statuses, codes and one-line messages.

The bodies under tests/fixtures/engine_errors/ are real: captured from llama-cpp-python
(``captured: true`` in cases.json) or written from the engines' own sources (vLLM, SGLang,
llama-server; ``source`` names where). No database, no processes except the fake engine's
own tests at the end.
"""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.engine_errors import MESSAGE_MAX_CHARS, first_event_data, map_engine_error, one_line, param_from_loc

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "engine_errors"
CASES = json.loads((FIXTURES / "cases.json").read_text())


def _map(status, body, content_type="application/json", path="chat/completions"):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return map_engine_error(status, content_type, raw, "gemma", path)


def _assert_one_clean_line(message):
    assert "\n" not in message and "\r" not in message
    assert len(message) <= MESSAGE_MAX_CHARS + 60  # the engine's words, plus our short prefix
    assert "Traceback" not in message and ".py" not in message and "/site-packages" not in message


# --------------------------------------------------------------------------- the fixtures
def test_every_fixture_file_is_listed_in_cases_json():
    bodies = {p.name for p in FIXTURES.iterdir() if p.suffix in (".json", ".html", ".txt")} - {"cases.json"}
    assert bodies == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_is_mapped_to_openais_status_code_and_param(name):
    case = CASES[name]
    status, message, code, param = map_engine_error(
        case["status"], case["content_type"], (FIXTURES / name).read_bytes(), "gemma", case["path"])
    expect = case["expect"]
    assert (status, code, param) == (expect["status"], expect["code"], expect["param"]), message
    assert message.strip()
    _assert_one_clean_line(message)
    assert status != 422 and status < 500 or status in (502,)


# ------------------------------------------------------------------------ validation errors
def test_fastapi_422_becomes_400_naming_the_field():
    body = {"detail": [{"type": "int_parsing", "loc": ["body", "max_tokens"],
                        "msg": "Input should be a valid integer, unable to parse string as an integer",
                        "input": "x"}]}
    status, message, code, param = _map(422, body)
    assert (status, code, param) == (400, "invalid_type", "max_tokens")
    assert message == ("Invalid type for 'max_tokens': Input should be a valid integer, "
                       "unable to parse string as an integer.")


def test_missing_field_is_missing_required_parameter():
    body = {"detail": [{"type": "missing", "loc": ["body", "messages"], "msg": "Field required", "input": {}}]}
    assert _map(422, body) == (400, "Missing required parameter: 'messages'.", "missing_required_parameter",
                               "messages")


def test_several_problems_name_the_first_and_count_the_rest():
    body = {"detail": [
        {"type": "literal_error", "loc": ["body", "messages", 0, "role"], "msg": "Input should be 'user'"},
        {"type": "float_parsing", "loc": ["body", "temperature"], "msg": "Input should be a valid number"},
        {"type": "missing", "loc": ["body", "model"], "msg": "Field required"}]}
    status, message, code, param = _map(422, body)
    assert (status, code, param) == (400, "invalid_value", "messages[0].role")
    assert message.endswith("(2 more problems in the request.)")


@pytest.mark.parametrize("loc, param", [
    (["body", "max_tokens"], "max_tokens"),
    (["body", "messages", 0, "role"], "messages[0].role"),
    (("body", "messages", 1, "ChatCompletionRequestUserMessage", "content"), "messages[1].content"),
    (["body", "messages", 0, "typed-dict", "role"], "messages[0].role"),
    (["body", "stop", "function-after[validate(), str]"], "stop"),
    (["body", "tools", 0, "function", "name"], "tools[0].function.name"),
    ("messages.0.role", "messages[0].role"),
    (["body"], None),
    ([], None),
    (None, None),
    (42, None),
])
def test_param_from_loc_uses_openais_spelling(loc, param):
    assert param_from_loc(loc) == param


def test_a_500_carrying_pydantics_dump_is_a_400_with_one_line():
    dump = ("1 validation error for CreateChatCompletionRequest\ntemperature\n"
            "  Input should be a valid number, unable to parse string as a number "
            "[type=float_parsing, input_value='hot', input_type=str]\n"
            "    For further information visit https://errors.pydantic.dev/2.9/v/float_parsing")
    body = {"error": {"message": dump, "type": "internal_server_error", "param": None, "code": None}}
    status, message, code, param = _map(500, body)
    assert (status, code, param) == (400, "invalid_type", "temperature")
    assert message == "Invalid type for 'temperature': Input should be a valid number, unable to parse string as a number."


def test_fastapis_str_of_a_validation_error_is_read_too():
    text = ("2 validation errors:\n"
            "  {'type': 'int_parsing', 'loc': ('body', 'n'), 'msg': 'Input should be a valid integer', 'input': 'x'}\n"
            "  {'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required', 'input': {}}\n")
    status, message, code, param = _map(500, {"error": {"message": text}})
    assert (status, code, param) == (400, "invalid_type", "n")
    assert message == "Invalid type for 'n': Input should be a valid integer. (1 more problem in the request.)"


def test_a_500_saying_invalid_request_is_a_400():
    status, message, code, param = _map(500, {"detail": "Invalid request: messages must alternate\nuser/assistant"})
    assert (status, code) == (400, "invalid_value")
    assert message == "Invalid request: messages must alternate user/assistant"


# ------------------------------------------------------------------------ context length
@pytest.mark.parametrize("status", [400, 500])
def test_llama_cpp_pythons_context_message_is_context_length_exceeded(status):
    body = {"error": {"message": "Requested tokens (2100) exceed context window of 2048",
                      "type": "internal_server_error", "param": None, "code": None}}
    assert _map(status, body) == (400, "Requested tokens (2100) exceed context window of 2048",
                                  "context_length_exceeded", "messages")


def test_context_length_names_the_input_field_of_the_endpoint():
    body = {"object": "error", "message": "This model's maximum context length is 2048 tokens.", "code": 400}
    assert _map(400, body, path="completions")[3] == "prompt"
    assert _map(400, body, path="/v1/embeddings")[3] == "input"


def test_an_engines_own_param_is_kept_for_context_length():
    body = {"error": {"message": "This model's maximum context length is 2048 tokens. However, you requested 2100.",
                      "type": "invalid_request_error", "param": "max_tokens", "code": "context_length_exceeded"}}
    assert _map(400, body)[2:] == ("context_length_exceeded", "max_tokens")


# ----------------------------------------------------------------- statuses and shapes
def test_frameworks_404_is_unknown_endpoint_naming_the_path():
    assert _map(404, {"detail": "Not Found"}, path="embeddings") == (
        404, "The engine serving 'gemma' has no endpoint /v1/embeddings.", "unknown_endpoint", None)


def test_openai_shaped_4xx_keeps_message_code_and_param():
    body = {"error": {"message": "Invalid 'n': must be 1.", "type": "invalid_request_error", "param": "n",
                      "code": "invalid_value"}}
    assert _map(400, body) == (400, "Invalid 'n': must be 1.", "invalid_value", "n")


def test_openai_shaped_500_is_still_502_engine_error():
    body = {"error": {"message": "CUDA error: out of memory", "type": "server_error", "param": "x",
                      "code": "oom"}}
    assert _map(500, body) == (502, "The engine serving 'gemma' failed (500): CUDA error: out of memory",
                               "engine_error", None)


def test_a_429_stays_429_with_openais_code():
    assert _map(429, {"object": "error", "message": "Too many requests", "code": 429})[::2] == (
        429, "rate_limit_exceeded")


def test_an_engine_refusing_the_gateways_key_is_502_not_401():
    status, message, code, _ = _map(401, {"error": {"message": "Invalid API key", "code": "invalid_api_key"}})
    assert (status, code) == (502, "engine_error")
    assert "refused the gateway's credentials" in message


def test_ollama_style_string_error_is_kept():
    assert _map(400, {"error": "invalid model name"}) == (400, "invalid model name", "engine_error", None)


def test_traceback_and_paths_are_stripped_from_a_502():
    text = ('Traceback (most recent call last):\n  File "/opt/venv/lib/python3.11/site-packages/llama_cpp/'
            'llama.py", line 1200, in _create_completion\n    raise RuntimeError(...)\n'
            'RuntimeError: failed to load /models/gemma-3-270m.gguf: bad magic')
    status, message, code, param = _map(500, text.encode(), content_type="text/plain")
    assert (status, code, param) == (502, "engine_error", None)
    assert message == "The engine serving 'gemma' failed (500): RuntimeError: failed to load: bad magic"


@pytest.mark.parametrize("body, content_type, words", [
    (b"<!DOCTYPE html><html><body><h1>Internal Server Error</h1></body></html>", "text/html", "an HTML page"),
    (b"", "", "an empty body"),
    (b"\x00\x01\x02\xfe\xff" * 20, "application/octet-stream", "application/octet-stream"),
    (b'{"error": ', "application/json", "a broken JSON body"),
    (b"[1, 2, 3]", "application/json", "without an error message"),
])
def test_html_or_garbage_gives_a_generic_line_naming_the_status(body, content_type, words):
    status, message, code, param = map_engine_error(500, content_type, body, "gemma", "chat/completions")
    assert (status, code, param) == (502, "engine_error", None)
    assert message.startswith("The engine serving 'gemma' failed (500)") and words in message
    _assert_one_clean_line(message)


def test_garbage_4xx_keeps_its_status_and_names_it():
    status, message, code, _ = map_engine_error(400, "text/html", b"<html>no</html>", "gemma", "completions")
    assert (status, code) == (400, "engine_error")
    assert message == "The engine serving 'gemma' answered 400 to /v1/completions with an HTML page instead of an error."


def test_a_422_without_details_is_400():
    assert _map(422, {"detail": "Unprocessable"})[:2] == (400, "Unprocessable")


def test_a_lone_surrogate_or_invalid_utf8_in_the_body_does_not_raise():
    status, message, _, _ = map_engine_error(500, "application/json", b'{"error": {"message": "bad \\ud800 \xff"}}',
                                             "gemma", "chat/completions")
    assert status == 502 and message.startswith("The engine serving 'gemma' failed (500): bad")


def test_long_messages_are_cut_to_the_limit():
    line = one_line("word " * 500)
    assert len(line) == MESSAGE_MAX_CHARS and line.endswith("…")


def test_one_line_keeps_urls_and_api_paths():
    assert one_line("see https://errors.pydantic.dev/2.9/v/int_parsing on /v1/chat/completions") == (
        "see https://errors.pydantic.dev/2.9/v/int_parsing on /v1/chat/completions")


@pytest.mark.parametrize("text, line", [
    ("failed to load /srv/weights/llama", "failed to load"),
    ("cannot open /home/me/models/secret-model-dir: no such directory", "cannot open: no such directory"),
    ("no weights in /srv/weights/llama.", "no weights in."),  # the sentence's full stop stays
    ("no weights in '~/models/x/y'", "no weights in ''"),
    ("load /srv/w/model.gguf.", "load."),
    ("connect to http://10.0.0.5:8000/v1/chat/completions failed.", "connect to failed."),
    ("upstream http://gpu-a:23100 is down", "upstream is down"),
    ("peer https://engine.internal/health refused", "peer refused"),
    ("peer https://127.0.0.1/x refused", "peer refused"),
    ("proxy http://user:secret@example.com/x said no", "proxy said no"),
    ("http://example.com/page is plain http", "is plain http"),
])
def test_one_line_removes_the_machines_directories_and_addresses(text, line):
    assert one_line(text) == line


@pytest.mark.parametrize("text", [
    "No route for /v1/chat/completions or /v1/embeddings.",
    "see /v1/models/llama-3.1-8b",
    "a / b, a/b/c and ratio 1/2",
    "single segments stay: /tmp /health",
    "Please check the API reference: https://platform.openai.com/docs/api-reference.",
])
def test_one_line_keeps_openais_paths_relative_words_and_public_pages(text):
    assert one_line(text) == text


def test_a_message_of_nothing_but_a_path_says_so():
    assert one_line("/srv/weights/llama") == "(the engine's message named only places on its machine, which are not shown)"


@pytest.mark.parametrize("body, data", [
    (b'data: {"a": 1}\n\ndata: {"b": 2}\n\n', b'{"a": 1}'),
    (b'data: [DONE]\n\ndata: {"b": 2}\n\n', b'{"b": 2}'),
    (b'event: error\r\ndata: {"a":\r\ndata: 1}\r\n\r\n', b'{"a":\n1}'),  # lines joined, CRLF
    (b': comment\n\ndata:{"a": 1}', b'{"a": 1}'),  # no space after the colon, no blank line at the end
    (b"data: [DONE]\n\n", None),
    (b"event: ping\n\n", None),
    (b"", None),
])
def test_first_event_data_is_the_first_event_that_carries_data(body, data):
    assert first_event_data(body) == data


def test_an_error_told_as_server_sent_events_is_mapped_from_its_first_event():
    event = b'data: {"error": {"message": "Invalid value for top_k", "type": "invalid_request_error", ' \
            b'"param": "top_k", "code": "invalid_value"}}\n\ndata: [DONE]\n\n'
    assert map_engine_error(400, "text/event-stream", event, "gemma", "chat/completions") == (
        400, "Invalid value for top_k", "invalid_value", "top_k")


def test_an_event_stream_error_without_json_data_keeps_its_words():
    status, message, code, _ = map_engine_error(503, "text/event-stream", b"data: engine is restarting\n\n",
                                                "gemma", "chat/completions")
    assert (status, code) == (502, "engine_error")
    assert message == "The engine serving 'gemma' failed (503): engine is restarting"


def test_an_event_stream_error_without_data_shows_no_raw_bytes():
    status, message, code, _ = map_engine_error(500, "text/event-stream", b"event: ping\nid: 7\n\n",
                                                "gemma", "chat/completions")
    assert (status, code) == (502, "engine_error")
    assert message == "The engine serving 'gemma' failed (500) without an error message (text/event-stream)."


def test_the_weights_directory_of_an_sse_fixture_does_not_reach_the_client():
    case = CASES["sse_internal_error_event.txt"]
    _, message, _, _ = map_engine_error(case["status"], case["content_type"],
                                        (FIXTURES / "sse_internal_error_event.txt").read_bytes(), "gemma",
                                        case["path"])
    assert message == "The engine serving 'gemma' failed (500): failed to load model from: out of memory"


def test_deeply_nested_json_does_not_raise():
    body = b"[" * 100000 + b"]" * 100000
    assert map_engine_error(500, "application/json", body, "gemma", "chat/completions")[0] == 502


# ---------------------------------------------------------- tests/fake_engine.py's new modes
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def start_engine(tmp_path):
    started = []

    def start(*args):
        port = _free_port()
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_engine.py"), "--port", str(port), *args],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return port
            except OSError:
                time.sleep(0.05)
        raise AssertionError("fake engine did not start")

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(timeout=10)


def _post(port, path, body, timeout=30):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, resp.getheader("Content-Type"), data


def test_fake_engine_answers_a_given_error_body_byte_for_byte(start_engine):
    fixture = FIXTURES / "proxy_bad_gateway.html"
    port = start_engine("--error-status", "502", "--error-body", f"@{fixture}", "--error-content-type", "text/html")
    status, content_type, data = _post(port, "/v1/chat/completions", {"messages": []})
    assert (status, content_type, data) == (502, "text/html", fixture.read_bytes())


def test_fake_engine_fastapi_422_and_n(start_engine):
    port = start_engine("--fastapi-422")
    status, _, data = _post(port, "/v1/chat/completions", {"max_tokens": "x"})
    assert status == 422 and json.loads(data)["detail"][0]["loc"] == ["body", "max_tokens"]
    ignoring, honoring = start_engine(), start_engine("--honor-n")
    req = {"messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 2}
    assert len(json.loads(_post(ignoring, "/v1/chat/completions", req)[2])["choices"]) == 1
    assert [c["index"] for c in json.loads(_post(honoring, "/v1/chat/completions", req)[2])["choices"]] == [0, 1, 2]


def test_fake_engine_without_usage_chunk(start_engine):
    port = start_engine("--no-usage-chunk", "--tokens", "3")
    req = {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}
    _, _, data = _post(port, "/v1/completions", req)
    assert b"[DONE]" in data and b'"usage"' not in data


def test_fake_engine_logs_a_cancelled_non_streamed_request(start_engine, tmp_path):
    log = tmp_path / "cancel.jsonl"
    port = start_engine("--tokens", "40", "--token-delay-ms", "100", "--cancel-log", str(log))
    sock = socket.create_connection(("127.0.0.1", port))
    body = b'{"messages": [{"role": "user", "content": "hi"}]}'
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    time.sleep(0.3)
    sock.close()  # 4 s of "generation" left
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not log.exists():
        time.sleep(0.05)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["event"] for e in events] == ["cancelled"]
    assert events[0]["after_s"] < 4.0  # noticed before the answer was due, not at its end
    status, _, _ = _post(port, "/v1/chat/completions", {"messages": [], "max_tokens": 1})
    assert status == 200
    assert [json.loads(line)["event"] for line in log.read_text().splitlines()] == ["cancelled", "completed"]


# ------------------------------------------------------- llama-cpp-python's captured quirks
def test_an_unknown_role_is_one_problem_listing_the_roles_pydantics_union_allows():
    body = (FIXTURES / "llama_cpp_python_unknown_role.json").read_bytes()
    assert map_engine_error(500, "application/json", body, "gemma", "chat/completions") == (
        400, "Invalid value for 'messages[0].role': Input should be 'system', 'user', 'assistant', 'tool' or "
             "'function'.", "invalid_value", "messages[0].role")


def test_llama_cpp_pythons_500_for_a_wrong_type_loses_its_file_and_line():
    body = (FIXTURES / "llama_cpp_python_max_tokens_string.json").read_bytes()
    assert b"line 376" in body  # the engine's own words carry a frame of its traceback
    _, message, _, _ = map_engine_error(500, "application/json", body, "gemma", "chat/completions")
    assert "line" not in message and "PATH" not in message


def test_a_lone_surrogate_is_the_clients_400_not_an_engine_failure():
    body = (FIXTURES / "llama_cpp_python_lone_surrogate.json").read_bytes()
    status, message, code, _ = map_engine_error(500, "application/json", body, "gemma", "chat/completions")
    assert (status, code) == (400, "invalid_value") and "surrogate" in message


# ------------------------------------------------------------------ bare Python errors as a 5xx
@pytest.mark.parametrize("text", [
    "invalid literal for int() with base 10: 'abc'",
    "invalid literal for int() with base 10: '1.5'",
    "could not convert string to float: 'x'",
    "ValueError: invalid literal for int() with base 16: 'zz'",
])
def test_a_500_that_is_a_bare_value_error_is_the_clients_invalid_value(text):
    status, message, code, _ = _map(500, {"error": {"message": text, "type": "internal_server_error"}})
    assert (status, code) == (400, "invalid_value")
    assert message.startswith("Invalid value in the request: the engine serving 'gemma' could not read it")
    _assert_one_clean_line(message)


def test_llama_cpp_pythons_logit_bias_key_failure_is_a_400():
    body = (FIXTURES / "llama_cpp_python_logit_bias_key_abc.json").read_bytes()
    status, message, code, _ = map_engine_error(500, "application/json", body, "gemma", "completions")
    assert (status, code) == (400, "invalid_value") and "'abc'" in message


@pytest.mark.parametrize("text, field", [("'content'", "'content'"), ("KeyError: 'tool_calls'", "'tool_calls'"),
                                         ('"role"', '"role"')])
def test_a_500_that_is_a_bare_key_error_names_the_missing_field_in_a_sentence(text, field):
    status, message, code, param = _map(500, {"error": {"message": text, "type": "internal_server_error"}})
    assert (status, code, param) == (502, "engine_error", None)
    assert message == f"The engine serving 'gemma' failed on this request (it read a field it did not find: {field})."


def test_the_captured_key_error_never_reaches_the_client_bare():
    body = (FIXTURES / "llama_cpp_python_assistant_without_content.json").read_bytes()
    _, message, _, _ = map_engine_error(500, "application/json", body, "gemma", "chat/completions")
    assert message != "'content'" and "it read a field it did not find: 'content'" in message


@pytest.mark.parametrize("status, text", [
    (400, "invalid literal for int() with base 10: 'abc'"),  # a 4xx keeps its own status
    (500, "the worker said: invalid literal for int() with base 10: 'abc'"),  # not a bare ValueError
    (500, "'content' is missing from the cache"),  # not a bare KeyError
    (500, "'two words'"),
])
def test_only_a_bare_python_error_as_a_5xx_is_read_as_one(status, text):
    mapped_status, message, code, _ = _map(status, {"error": {"message": text}})
    assert "could not read it" not in message and "did not find" not in message
    assert (mapped_status, code) == ((400, "engine_error") if status == 400 else (502, "engine_error"))
