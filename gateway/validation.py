"""The shape of a request body, checked before it reaches an engine: OpenAI's request rules.

Engines answer a wrongly typed field with a 500 and their own traceback (llama-cpp-python's
pydantic dump, with file paths); OpenAI answers 400 naming the field. The gateway answers
what OpenAI answers, with its messages and codes, for the fields OpenAI defines on
``chat/completions``, ``completions`` and ``embeddings``: types (``invalid_type``), enums
(``invalid_value``: "Invalid value: 'x'. Supported values are: ..."), ranges
(``integer_below_min_value``, ``decimal_above_max_value``…), array lengths, required fields,
and, given the model's limits, ``max_tokens`` against its output limit and context length.
Fields OpenAI does not define pass untouched (engines have extras: ``top_k``, ``min_p``,
``grammar``…), and so does ``null`` for any optional field. Content-part types OpenAI does
not define pass too (vLLM's ``video_url``, ``audio_url``).

Cost: one pass over the top-level fields and one over the messages; the whole body is walked
for lone surrogates only when its bytes may hold one (:func:`has_surrogate_escape`).
"""

from __future__ import annotations

import re
from numbers import Real

from llmgw import integers

_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
               float: "a number", type(None): "null"}

Problem = tuple[str, str, "str | None"]  # (param, message, code)

#: In the order OpenAI lists them in its "Supported values are: ..." (its answer pasted in
#: moeru-ai/airi#137, 2025).
ROLES = ("system", "assistant", "user", "function", "tool", "developer")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
TOOL_CHOICES = ("none", "auto", "required")
ENCODING_FORMATS = ("float", "base64")
#: OpenAI's schema order (openai/openai-openapi, CreateChatCompletionRequest.service_tier).
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")
MODALITIES = ("text", "audio")
#: ``seed`` is an int64 in OpenAI's schema: one outside it is a range error there, and an
#: overflow (or a silent wrap) in an engine written in C++.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
_MAX_STOP = 4
_SHOWN_CHARS = 100


def kind_of(value) -> str:
    """How OpenAI names a JSON value's type in its errors ("a string", "an array")."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def is_integer(value) -> bool:
    """An integer, or a float with an integral value (16.0: engines accept it); not a bool."""
    if isinstance(value, float):
        return value.is_integer()
    return integers.is_int(value)


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _is_str(value) -> bool:
    return isinstance(value, str)


def _is_bool(value) -> bool:
    return isinstance(value, bool)


def _is_object(value) -> bool:
    return isinstance(value, dict)


# --- lone surrogates -----------------------------------------------------------------------------

# A \u escape of U+D800–U+DFFF, or one encoded as UTF-8 bytes (ED A0..BF): Python's json
# decodes bytes with "surrogatepass", so both become lone surrogates. A body that is not
# UTF-8 (json also reads UTF-16/32, told by NUL bytes in its first four) may hold one too.
# Two searches, not one alternation: each has a literal prefix that the regex engine skips
# to (60 KB of ASCII: ~35 µs; one alternation: ~600 µs).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_SURROGATE_UTF8 = re.compile(rb"\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogate_escape(raw: bytes) -> bool:
    """Whether the request body ``raw`` (bytes as received) may decode to a string holding a
    lone surrogate: a ``\\uD800``–``\\uDFFF`` escape, the same encoded as UTF-8 bytes, or a
    body that is not UTF-8. False means :func:`lone_surrogate_path` need not be called (a
    pair ``\\ud83d\\ude00`` says True: it is the walk that tells a pair from a lone one)."""
    return (b"\x00" in raw[:4] or _SURROGATE_ESCAPE.search(raw) is not None
            or _SURROGATE_UTF8.search(raw) is not None)


def _printable(text: str) -> str:
    """``text`` with surrogates (and nothing else) written as ``\\udXXX`` escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def lone_surrogate_path(body) -> str | None:
    """The parameter path (``messages[0].content``, ``tools[1].function.name``) of the first
    string in ``body`` — a key or a value, at any depth — that holds a lone surrogate
    (U+D800–U+DFFF: not Unicode, so not encodable as UTF-8 nor storable), or None. A key
    is named by its own path with the surrogate escaped (``metadata.\\ud800``). Walks
    iteratively: no recursion limit beyond the parser's own."""
    stack: list[tuple[str, object]] = [("", body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return path or "body"
        elif isinstance(value, dict):
            # Reversed onto the stack so that the first field is looked at first.
            for key, item in reversed(list(value.items())):
                if _SURROGATE.search(key):
                    return _join(path, _printable(key))
                stack.append((_join(path, key), item))
        elif isinstance(value, list):
            for i in range(len(value) - 1, -1, -1):
                stack.append((f"{path}[{i}]", value[i]))
    return None


def lone_surrogate_problem(param: str) -> Problem:
    """The 400 for a lone surrogate at ``param`` (from :func:`lone_surrogate_path`)."""
    return (param, f"Invalid '{param}': string contains a lone surrogate (U+D800 to U+DFFF), which is not valid "
                   f"Unicode. Encode text as UTF-8 and pair every surrogate escape.", "invalid_value")


# --- problems in OpenAI's words ------------------------------------------------------------------

def _shown(value) -> str:
    """A value as OpenAI shows it in a message ("got 0 instead"), cut short, surrogates escaped."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        text = str(int(value))
    else:
        try:
            text = str(value)
        except ValueError:  # an int of more digits than Python prints
            text = "a very large number"
    text = _printable(text)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def _wrong_type(param: str, expected: str, value) -> Problem:
    return (param, f"Invalid type for '{param}': expected {expected}, but got {kind_of(value)} instead.",
            "invalid_type")


def _missing(param: str) -> Problem:
    return param, f"Missing required parameter: '{param}'.", "missing_required_parameter"


def _quoted_list(values) -> str:
    quoted = [f"'{v}'" for v in values]
    if len(quoted) == 1:
        return quoted[0]
    if len(quoted) == 2:
        return f"{quoted[0]} and {quoted[1]}"
    return ", ".join(quoted[:-1]) + f", and {quoted[-1]}"


def _unsupported(param: str, value, supported) -> Problem:
    return (param, f"Invalid value: '{_shown(value)}'. Supported values are: {_quoted_list(supported)}.",
            "invalid_value")


def _range(param: str, kind: str, value, minimum=None, maximum=None) -> Problem | None:
    """OpenAI's range errors: ``integer_below_min_value`` / ``decimal_above_max_value``…

    ``kind`` is the parameter's type, ``"integer"`` or ``"decimal"``, not the value's:
    OpenAI says ``decimal_above_max_value`` for ``temperature: 3`` as for ``2.5``."""
    if minimum is not None and value < minimum:
        return (param, f"Invalid '{param}': {kind} below minimum value. Expected a value >= {minimum}, but got "
                       f"{_shown(value)} instead.", f"{kind}_below_min_value")
    if maximum is not None and value > maximum:
        return (param, f"Invalid '{param}': {kind} above maximum value. Expected a value <= {maximum}, but got "
                       f"{_shown(value)} instead.", f"{kind}_above_max_value")
    return None


def _empty_array(param: str) -> Problem:
    return (param, f"Invalid '{param}': empty array. Expected an array with minimum length 1, but got an empty "
                   f"array instead.", "empty_array")


def _number(minimum, maximum):
    def rule(param: str, value) -> Problem | None:
        if not _is_number(value):
            return _wrong_type(param, "a number", value)
        return _range(param, "decimal", value, minimum, maximum)
    return rule


def _integer(minimum=None, maximum=None):
    def rule(param: str, value) -> Problem | None:
        if not is_integer(value):
            return _wrong_type(param, "an integer", value)
        return _range(param, "integer", value, minimum, maximum)
    return rule


def _typed(ok, expected: str):
    def rule(param: str, value) -> Problem | None:
        return None if ok(value) else _wrong_type(param, expected, value)
    return rule


def _stop(param: str, value) -> Problem | None:
    """A string or 1 to 4 strings (OpenAI's schema: ``minItems: 1``, ``maxItems: 4``). An
    empty string passes, as at OpenAI (its schema sets no ``minLength``); engines would stop
    at once on it, so :func:`without_empty_stops` takes it out before the engine."""
    if isinstance(value, str):
        return None
    if not isinstance(value, list):
        return _wrong_type(param, "a string or an array of strings", value)
    if not value:
        return _empty_array(param)
    if len(value) > _MAX_STOP:
        return (param, f"Invalid '{param}': array too long. Expected an array with maximum length {_MAX_STOP}, "
                       f"but got an array with length {len(value)} instead.", "array_above_max_length")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            return _wrong_type(f"{param}[{i}]", "a string", item)
    return None


#: A token id as a ``logit_bias`` key: ASCII decimal digits only ("123"; not "-1", "1.5", "+1", "１").
_TOKEN_ID = re.compile(r"[0-9]+", re.ASCII)


def _logit_bias(param: str, value) -> Problem | None:
    """Token ids (decimal strings >= 0) → biases of -100..100. A key that is no token id is
    OpenAI's "Invalid key in 'logit_bias': AI. You should only be submitting non-negative
    integers." (its answer in OkGoDoIt/OpenAI-API-dotnet#163, go-openai#129), naming
    ``logit_bias``; engines fail on one: llama-cpp-python's ``int(key)`` is a 500 with a bare
    ValueError, vLLM's a 400 without ``param``."""
    if not isinstance(value, dict):
        return _wrong_type(param, "an object", value)
    for token, bias in value.items():
        if not _TOKEN_ID.fullmatch(token):
            shown = _shown(token) or "''"
            return (param, f"Invalid key in '{param}': {shown}. You should only be submitting non-negative "
                           f"integers (token ids, such as \"50256\").", "invalid_value")
        here = f"{param}.{_printable(token)}"
        if not _is_number(bias):
            return _wrong_type(here, "a number", bias)
        # OpenAI's schema types a bias as an integer (its range code says so); a fraction passes,
        # as engines take one
        problem = _range(here, "integer", bias, -100, 100)
        if problem:
            return problem
    return None


def _stream_options(param: str, value) -> Problem | None:
    if not isinstance(value, dict):
        return _wrong_type(param, "an object", value)
    include = value.get("include_usage")
    if include is not None and not isinstance(include, bool):
        return _wrong_type(f"{param}.include_usage", "a boolean", include)
    return None


def _response_format(param: str, value) -> Problem | None:
    if not isinstance(value, dict):
        return _wrong_type(param, "an object", value)
    kind = value.get("type")
    if kind is None:
        return _missing(f"{param}.type")
    if not isinstance(kind, str):
        return _wrong_type(f"{param}.type", "a string", kind)
    if kind not in RESPONSE_FORMATS:
        return _unsupported(f"{param}.type", kind, RESPONSE_FORMATS)
    if kind == "json_schema":
        schema = value.get("json_schema")
        if schema is None:
            return _missing(f"{param}.json_schema")
        if not isinstance(schema, dict):
            return _wrong_type(f"{param}.json_schema", "an object", schema)
        if not isinstance(schema.get("name"), str):
            return (_missing(f"{param}.json_schema.name") if schema.get("name") is None
                    else _wrong_type(f"{param}.json_schema.name", "a string", schema["name"]))
    return None


def _named_function(param: str, value, required: tuple[str, ...] = ()) -> Problem | None:
    """``value`` is ``{"name": str, ...}``; ``required`` other string fields."""
    if value is None:
        return _missing(param)
    if not isinstance(value, dict):
        return _wrong_type(param, "an object", value)
    for field in ("name", *required):
        if value.get(field) is None:
            return _missing(f"{param}.{field}")
        if not isinstance(value[field], str):
            return _wrong_type(f"{param}.{field}", "a string", value[field])
    return None


def _tools(param: str, value) -> Problem | None:
    if not isinstance(value, list):
        return _wrong_type(param, "an array", value)
    if not value:
        return _empty_array(param)
    for i, tool in enumerate(value):
        here = f"{param}[{i}]"
        if not isinstance(tool, dict):
            return _wrong_type(here, "an object", tool)
        kind = tool.get("type")
        if kind is None:
            return _missing(f"{here}.type")
        if kind != "function":
            return (_unsupported(f"{here}.type", kind, ("function",)) if isinstance(kind, str)
                    else _wrong_type(f"{here}.type", "a string", kind))
        problem = _named_function(f"{here}.function", tool.get("function"))
        if problem:
            return problem
        parameters = tool["function"].get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            return _wrong_type(f"{here}.function.parameters", "an object", parameters)
    return None


def _tool_choice(param: str, value) -> Problem | None:
    if isinstance(value, str):
        return None if value in TOOL_CHOICES else _unsupported(param, value, TOOL_CHOICES)
    if not isinstance(value, dict):
        return _wrong_type(param, "a string or an object", value)
    kind = value.get("type")
    if kind is None:
        return _missing(f"{param}.type")
    if kind != "function":
        return (_unsupported(f"{param}.type", kind, ("function",)) if isinstance(kind, str)
                else _wrong_type(f"{param}.type", "a string", kind))
    return _named_function(f"{param}.function", value.get("function"))


def _token_list(value) -> bool:
    return all(integers.is_int(item) for item in value)


def _prompt(param: str, value) -> Problem | None:
    """A string, an array of strings, of token ids, or of arrays of token ids."""
    if isinstance(value, str):
        return None
    if not isinstance(value, list):
        return _wrong_type(param, "a string or an array", value)
    if all(isinstance(item, str) for item in value) or _token_list(value):
        return None
    for i, item in enumerate(value):
        if not (isinstance(item, list) and item and _token_list(item)):
            return _wrong_type(f"{param}[{i}]", "a string, an integer or an array of integers", item)
    return None


#: OpenAI's words for an empty embeddings input (an empty string, array, or string in one),
#: with param and code null; here the param names the place.
_INVALID_INPUT = "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference."


def _input(param: str, value) -> Problem | None:
    """Embeddings' ``input``: like a prompt, and nothing empty (OpenAI refuses it)."""
    problem = _prompt(param, value)
    if problem:
        return problem
    if value == "" or value == []:
        return param, _INVALID_INPUT, None
    if isinstance(value, list):
        for i, item in enumerate(value):
            if item == "":
                return f"{param}[{i}]", _INVALID_INPUT, None
    return None


def _modalities(param: str, value) -> Problem | None:
    """An array of "text"/"audio"; "audio" is refused in OpenAI's words for a model that
    lacks a feature (its "messages[0].role does not support 'developer' with this model"):
    every model served here answers text only."""
    if not isinstance(value, list):
        return _wrong_type(param, "an array of strings", value)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            return _wrong_type(f"{param}[{i}]", "a string", item)
        if item not in MODALITIES:
            return _unsupported(f"{param}[{i}]", item, MODALITIES)
    if "audio" in value:
        return (param, f"Unsupported value: '{param}' does not support 'audio' with this model. This model "
                       f"answers text only.", "unsupported_value")
    return None


def _audio(param: str, value) -> Problem | None:
    """Audio output parameters: refused, as OpenAI refuses a parameter a model lacks
    (``unsupported_parameter``); the models served here answer text only."""
    if not isinstance(value, dict):
        return _wrong_type(param, "an object", value)
    return (param, f"Unsupported parameter: '{param}' is not supported with this model. This model answers "
                   f"text only: leave out '{param}' and ask for the 'text' modality.", "unsupported_parameter")


def _choice(supported: tuple[str, ...]):
    def rule(param: str, value) -> Problem | None:
        if not isinstance(value, str):
            return _wrong_type(param, "a string", value)
        return None if value in supported else _unsupported(param, value, supported)
    return rule


_GENERATION = {
    "stream": _typed(_is_bool, "a boolean"),
    "stream_options": _stream_options,
    "max_tokens": _integer(1),
    "n": _integer(1, 128),
    "temperature": _number(0, 2),
    "top_p": _number(0, 1),
    "presence_penalty": _number(-2, 2),
    "frequency_penalty": _number(-2, 2),
    "seed": _integer(SEED_MIN, SEED_MAX),
    "stop": _stop,
    "user": _typed(_is_str, "a string"),
    "logit_bias": _logit_bias,
}

#: Field → rule(param, value) -> Problem | None, per endpoint (a rule sees no ``None``).
RULES: dict[str, dict] = {
    "chat/completions": {
        **_GENERATION,
        "max_completion_tokens": _integer(1),
        "logprobs": _typed(_is_bool, "a boolean"),
        "top_logprobs": _integer(0, 20),
        "tools": _tools,
        "tool_choice": _tool_choice,
        "parallel_tool_calls": _typed(_is_bool, "a boolean"),
        "response_format": _response_format,
        "metadata": _typed(_is_object, "an object"),
        "store": _typed(_is_bool, "a boolean"),
        "service_tier": _choice(SERVICE_TIERS),
        "modalities": _modalities,
        "audio": _audio,
    },
    "completions": {
        **_GENERATION,
        "prompt": _prompt,
        "echo": _typed(_is_bool, "a boolean"),
        "best_of": _integer(0, 20),
        "suffix": _typed(_is_str, "a string"),
        "logprobs": _integer(0, 5),  # an integer here (how many per token), a boolean in chat
    },
    "embeddings": {
        "input": _input,
        "encoding_format": _choice(ENCODING_FORMATS),
        "dimensions": _integer(1),
        "user": _typed(_is_str, "a string"),
    },
}


# --- messages ------------------------------------------------------------------------------------

_PART_FIELDS = {  # a content part's type → (its payload field, the payload's type test, its name)
    "text": ("text", _is_str, "a string"),
    "refusal": ("refusal", _is_str, "a string"),
    "image_url": ("image_url", _is_object, "an object"),
    "input_audio": ("input_audio", _is_object, "an object"),
    "file": ("file", _is_object, "an object"),
}


def _content_parts(param: str, parts: list) -> Problem | None:
    if not parts:
        return _empty_array(param)
    for j, part in enumerate(parts):
        here = f"{param}[{j}]"
        if not isinstance(part, dict):
            return _wrong_type(here, "an object", part)
        kind = part.get("type")
        if kind is None:
            return _missing(f"{here}.type")
        if not isinstance(kind, str):
            return _wrong_type(f"{here}.type", "a string", kind)
        if kind in _PART_FIELDS:
            field, ok, expected = _PART_FIELDS[kind]
            payload = part.get(field)
            if payload is None:
                return _missing(f"{here}.{field}")
            if not ok(payload):
                return _wrong_type(f"{here}.{field}", expected, payload)
            if kind == "image_url":
                url = payload.get("url")
                if url is None:
                    return _missing(f"{here}.image_url.url")
                if not isinstance(url, str):
                    return _wrong_type(f"{here}.image_url.url", "a string", url)
    return None


def _tool_calls(param: str, calls) -> Problem | None:
    if not isinstance(calls, list):
        return _wrong_type(param, "an array", calls)
    if not calls:
        return _empty_array(param)
    for k, call in enumerate(calls):
        here = f"{param}[{k}]"
        if not isinstance(call, dict):
            return _wrong_type(here, "an object", call)
        for field in ("id", "type"):
            if call.get(field) is None:
                return _missing(f"{here}.{field}")
            if not isinstance(call[field], str):
                return _wrong_type(f"{here}.{field}", "a string", call[field])
        if call["type"] != "function":
            return _unsupported(f"{here}.type", call["type"], ("function",))
        problem = _named_function(f"{here}.function", call.get("function"), ("arguments",))
        if problem:
            return problem
    return None


def _message(i: int, message) -> Problem | None:
    here = f"messages[{i}]"
    if not isinstance(message, dict):
        return _wrong_type(here, "an object", message)
    role = message.get("role")
    if role is None:
        return _missing(f"{here}.role")
    if not isinstance(role, str):
        return _wrong_type(f"{here}.role", "a string", role)
    if role not in ROLES:
        return _unsupported(f"{here}.role", role, ROLES)
    name = message.get("name")
    if name is not None and not isinstance(name, str):
        return _wrong_type(f"{here}.name", "a string", name)
    if role == "function" and name is None:
        return _missing(f"{here}.name")
    if role == "assistant":
        for field in ("tool_calls", "function_call"):
            if message.get(field) is not None:
                problem = (_tool_calls(f"{here}.tool_calls", message[field]) if field == "tool_calls"
                           else _named_function(f"{here}.function_call", message[field], ("arguments",)))
                if problem:
                    return problem
    if role == "tool":
        call_id = message.get("tool_call_id")
        if call_id is None:
            return _missing(f"{here}.tool_call_id")
        if not isinstance(call_id, str):
            return _wrong_type(f"{here}.tool_call_id", "a string", call_id)
    content = message.get("content")
    if content is None:
        if role == "assistant" and (message.get("tool_calls") or message.get("function_call")):
            return None  # a turn that only calls tools
        if role == "assistant" and message.get("refusal") is not None:
            return None
        if "content" in message:
            # OpenAI's words (it names the field 'content', the param the place; code null).
            return f"{here}.content", "Invalid value for 'content': expected a string, got null.", None
        return _missing(f"{here}.content")
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return _wrong_type(f"{here}.content", "one of a string or array of objects", content)
    return _content_parts(f"{here}.content", content)


def _messages(messages) -> Problem | None:
    if not isinstance(messages, list):
        return _wrong_type("messages", "an array of objects", messages)
    if not messages:
        return _empty_array("messages")
    for i, message in enumerate(messages):
        problem = _message(i, message)
        if problem:
            return problem
    return None


# --- limits --------------------------------------------------------------------------------------

def _limit_problem(body: dict, limits: tuple[int | None, int | None]) -> Problem | None:
    context_length, max_output_tokens = limits
    for field in ("max_tokens", "max_completion_tokens"):
        asked = body.get(field)
        if asked is None:
            continue
        shown = _shown(asked)
        if max_output_tokens is not None and asked > max_output_tokens:
            return (field, f"{field} is too large: {shown}. This model supports at most {max_output_tokens} "
                           f"completion tokens, whereas you provided {shown}.", "invalid_value")
        if context_length is not None and asked >= context_length:
            return (field, f"This model's maximum context length is {context_length} tokens. However, you "
                           f"requested {shown} tokens for the completion alone, which leaves no room for the "
                           f"prompt. Please reduce the length of the messages or completion.",
                    "context_length_exceeded")
    return None


def without_empty_stops(body: dict) -> dict:
    """``body`` with the empty strings of ``stop`` taken out (``stop`` itself when nothing is
    left), for the engine; ``body`` itself when there is none. OpenAI accepts ``stop: ""``
    and stops on nothing; llama.cpp and vLLM find ``""`` at once and end the answer after
    its first token. Call it after :func:`check` passed; the body is not changed in place."""
    stop = body.get("stop")
    if stop == "":
        return {key: value for key, value in body.items() if key != "stop"}
    if isinstance(stop, list) and "" in stop:
        kept = [item for item in stop if item != ""]
        if not kept:
            return {key: value for key, value in body.items() if key != "stop"}
        return {**body, "stop": kept}
    return body


def check(path: str, body: dict, limits: tuple[int | None, int | None] | None = None) -> Problem | None:
    """The first problem with ``body`` for the endpoint ``path`` (``chat/completions``,
    ``completions``, ``embeddings``; other paths: None), as ``(param, message, code)`` in
    OpenAI's words and codes — ``invalid_type``, ``invalid_value``, ``empty_array``,
    ``missing_required_parameter``, ``integer_below_min_value``, ``decimal_above_max_value``,
    ``array_above_max_length``, ``context_length_exceeded``, ``unsupported_value`` (audio in
    ``modalities``), ``unsupported_parameter`` (an ``audio`` object); ``code`` is None where OpenAI's
    is (``stream_options`` without ``stream``, ``top_logprobs`` without ``logprobs``, a null
    ``content``, an empty embeddings ``input``) — or None. Range codes name the parameter's
    type: ``decimal_*`` for temperature, top_p and the penalties whatever the value's type.

    ``body`` is a decoded JSON object (a dict). ``limits`` is ``(context_length,
    max_output_tokens)`` in tokens, either None when unknown: a ``max_tokens`` or
    ``max_completion_tokens`` over ``max_output_tokens`` is ``invalid_value``, one that is
    at least ``context_length`` is ``context_length_exceeded``. Fields are checked in the
    body's order, then the required ones, then those that depend on another (stream_options
    on stream), then the limits. Lone surrogates are not looked for here (see
    :func:`lone_surrogate_path`). Raises nothing."""
    path = path.strip("/")
    rules = RULES.get(path)
    if rules is None:
        return None
    for field, value in body.items():
        if value is None:
            continue
        rule = rules.get(field)
        if rule is not None:
            problem = rule(field, value)
            if problem:
                return problem
    if path == "chat/completions":
        if body.get("messages") is None:
            return _missing("messages")
        problem = _messages(body["messages"])
        if problem:
            return problem
        if body.get("top_logprobs") is not None and body.get("logprobs") is not True:
            # OpenAI's words and code (null), as for stream_options without stream
            return "top_logprobs", "The 'top_logprobs' parameter is only allowed when 'logprobs' is enabled.", None
    elif path == "completions" and body.get("prompt") is None:
        return _missing("prompt")  # OpenAI requires it; engines would complete an empty prompt
    elif path == "embeddings" and body.get("input") is None:
        return _missing("input")
    if path == "embeddings":
        return None  # never streamed nor bounded: stream_options and max_tokens are engines' extras there
    if body.get("stream_options") is not None and body.get("stream") is not True:
        return ("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.", None)
    if limits is not None:
        return _limit_problem(body, limits)
    return None


def _is_token_prompt(prompt: list) -> bool:
    """A prompt of token ids: a list of ints, or a list of non-empty lists of ints."""
    return _token_list(prompt) or all(isinstance(item, list) and item and _token_list(item) for item in prompt)


def engine_problem(path: str, body: dict, traits, model: str) -> Problem | None:
    """What a valid request asks that the engine serving ``model`` would silently ignore
    (``traits``: ``catalog.engines.EngineTraits``), as a 400 ``unsupported_value`` — OpenAI
    refuses what a model cannot do rather than answer without it: image or audio parts to an
    engine without them, ``tool_choice: "required"`` to one that answers in text instead, a
    completions ``prompt`` of token ids to one that takes text only (``serves_token_prompts``), an
    engine extra that crashes the engine on a bad value (llama-cpp-python's ``grammar``).
    None when the engine does what is asked. ``body`` has passed :func:`check`."""
    for field in traits.refused_fields:
        if field in body:
            return (field, f"Unrecognized request argument supplied: {field} (the engine serving '{model}' fails on "
                           "some values of it; use response_format for structured output).", "unsupported_parameter")
    if path.strip("/") == "completions":
        prompt = body.get("prompt")
        if not traits.serves_token_prompts and isinstance(prompt, list) and prompt and _is_token_prompt(prompt):
            return ("prompt", f"Unsupported value: 'prompt' as token ids is not supported by the engine serving "
                              f"'{model}': it takes text prompts only. Send the prompt as a string.",
                    "unsupported_value")
        return None
    if path.strip("/") != "chat/completions":
        return None
    if body.get("tool_choice") == "required" and not traits.serves_tool_choice_required:
        return ("tool_choice", f"tool_choice 'required' is not supported by the engine serving '{model}': name the "
                               "function to call instead.", "unsupported_value")
    if traits.serves_images and traits.serves_audio:
        return None
    for i, message in enumerate(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if (kind == "image_url" and not traits.serves_images) or (kind == "input_audio" and not traits.serves_audio):
                return (f"messages[{i}].content[{j}]", f"Invalid content type. {kind} is not supported by the model "
                                                       f"'{model}' (its engine reads text only).", "unsupported_value")
    return None
