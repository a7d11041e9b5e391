"""The shape of a request body, checked before it reaches an engine.

Engines answer a wrongly typed field with a 500 and their own traceback (llama-cpp-python's
pydantic dump, with file paths); OpenAI answers 400 ``invalid_type`` naming the field. The
gateway does what OpenAI does for the fields every engine reads — nothing deeper: engines
keep their own checks of values (ranges, context length).
"""

from __future__ import annotations

from numbers import Real

from llmgw import integers

_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
               float: "a number", type(None): "null"}


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


Problem = tuple[str, str, str]  # (param, message, code)


def _expect(body: dict, field: str, ok, expected: str) -> Problem | None:
    if field in body and body[field] is not None and not ok(body[field]):
        return (field, f"Invalid type for '{field}': expected {expected}, but got {kind_of(body[field])} instead.",
                "invalid_type")
    return None


def _missing(param: str) -> Problem:
    return param, f"Missing required parameter: '{param}'.", "missing_required_parameter"


def check(path: str, body: dict) -> Problem | None:
    """The first problem with ``body`` for the endpoint ``path`` (e.g. ``chat/completions``)
    as ``(param, message, code)`` — OpenAI's codes ``invalid_type``, ``empty_array``,
    ``missing_required_parameter`` — or None. ``body`` is a JSON object."""
    path = path.strip("/")
    common = (
        ("stream", lambda v: isinstance(v, bool), "a boolean"),
        ("max_tokens", is_integer, "an integer"),
        ("max_completion_tokens", is_integer, "an integer"),
        ("n", is_integer, "an integer"),
        ("temperature", _is_number, "a number"),
        ("top_p", _is_number, "a number"),
        ("stream_options", lambda v: isinstance(v, dict), "an object"),
    )
    for field, ok, expected in common:
        problem = _expect(body, field, ok, expected)
        if problem:
            return problem
    if path == "chat/completions":
        messages = body.get("messages")
        if messages is None:
            return _missing("messages")
        if not isinstance(messages, list):
            return ("messages", f"Invalid type for 'messages': expected an array of objects, but got "
                                f"{kind_of(messages)} instead.", "invalid_type")
        if not messages:
            return ("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1, "
                                "but got an empty array instead.", "empty_array")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                return (f"messages[{i}]", f"Invalid type for 'messages[{i}]': expected an object, but got "
                                          f"{kind_of(message)} instead.", "invalid_type")
            if not isinstance(message.get("role"), str):
                return _missing(f"messages[{i}].role")
    elif path == "completions":
        return _expect(body, "prompt", lambda v: isinstance(v, (str, list)), "a string or an array")
    elif path == "embeddings":
        if body.get("input") is None:
            return _missing("input")
        return _expect(body, "input", lambda v: isinstance(v, (str, list)), "a string or an array")
    return None
