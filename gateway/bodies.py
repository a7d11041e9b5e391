"""Reading a ``/v1/`` request body: its size limit, strict JSON (no NaN, no duplicate
member names, no numbers out of range), and what the gateway adds before it goes upstream."""

from __future__ import annotations

import json
import math

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse

from gateway import validation
from gateway.errors import openai_error


def body_limit_error(request: HttpRequest) -> HttpResponse | None:
    limit = settings.LLMGW_MAX_BODY_BYTES
    try:
        declared = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        return openai_error(400, "Content-Length is not a number.")
    if declared > limit:
        return openai_error(413, f"Request body of {declared} bytes is over the limit of {limit} bytes.",
                            code="request_too_large")
    return None


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python's extension, not the spec


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: re-encoded it would become Infinity, which is not JSON
        raise ValueError(f"number {text} is out of range")
    return value


class _DuplicateName(ValueError):
    pass


def _unique_names(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object as a dict, refusing one that names a member twice: Python keeps the
    last value, other parsers (a provider's, an engine's) the first, so the gateway could
    check one ``model`` and the upstream serve another."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice = next(name for name, _ in pairs if name in seen or seen.add(name))
        raise _DuplicateName(twice)
    return obj


def parse_body(request: HttpRequest) -> dict | HttpResponse:
    try:
        raw = request.body
    except RequestDataTooBig:
        return openai_error(413, f"Request body is over the limit of {settings.LLMGW_MAX_BODY_BYTES} bytes.",
                            code="request_too_large")
    if raw[:1] == b"\x00" or raw[1:2] == b"\x00" or raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        # Python's json would take UTF-16 and UTF-32 too; JSON on the wire is UTF-8 (RFC 8259).
        return openai_error(400, "The request body is not valid JSON: it must be UTF-8.", code="invalid_json")
    try:
        body = json.loads(raw, parse_constant=_not_json, parse_float=_finite_float, object_pairs_hook=_unique_names)
    except _DuplicateName as exc:
        return openai_error(400, f"The request body names {json.dumps(str(exc))[:200]} twice in one object.",
                            code="invalid_json")
    except (ValueError, UnicodeDecodeError):
        return openai_error(400, "The request body is not valid JSON.", code="invalid_json")
    except RecursionError:
        return openai_error(400, "The request body is nested too deeply.", code="invalid_json")
    if not isinstance(body, dict):
        return openai_error(400, "The request body must be a JSON object.", code="invalid_json")
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _depth_over(body, MAX_DEPTH):
        # Python's own parser took it, but re-encoding it (the gateway writes the bodies it
        # composes) would exhaust the stack: refused here, as the parser refuses deeper ones.
        return openai_error(400, f"The request body is nested too deeply (more than {MAX_DEPTH} levels).",
                            code="invalid_json")
    # Before any field is used: a lone surrogate cannot be encoded (the database, the log, an
    # engine's UTF-8), so it is refused wherever it is (docs/architecture.md, "Gateway rules").
    if validation.has_surrogate_escape(raw) and (where := validation.lone_surrogate_path(body)) is not None:
        param, message, code = validation.lone_surrogate_problem(where)
        return openai_error(400, message, code=code, param=param)
    return body


#: The deepest nesting of arrays and objects a request body may have.
MAX_DEPTH = 200


def _depth_over(value, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests arrays and objects more than ``limit`` deep
    (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def _positive_int(value) -> bool:
    return validation.is_integer(value) and value > 0  # 16.0 is a limit too


def upstream_body(body: dict, raw: bytes, stream: bool, bound: bool, default_max_tokens: int | None,
                  traits=None) -> tuple[bytes, bool]:
    """The request body to send upstream, and whether to strip the usage chunk again.

    Only what the client left out is added, or what the engine would misread changed;
    otherwise its bytes go through untouched:

    * a stream gets ``stream_options.include_usage`` (so usage is recorded);
    * with ``bound`` (a generating request to a replica served here):
      ``max_completion_tokens`` alone is copied to ``max_tokens`` — llama-cpp-python's
      server ignores the newer name, and would generate until its context is full —; and
      when neither names a positive count, the model's ``default_max_tokens`` becomes
      ``max_tokens`` (0 or -1 mean "no limit" to llama.cpp). An unbounded request can hold
      a CPU replica for minutes;
    * with ``bound``, empty ``stop`` strings are left out (OpenAI stops on nothing for them);
    * with ``traits`` (``catalog.engines.EngineTraits``) of an engine that does not know the
      ``developer`` role, such messages go as ``system`` (what OpenAI's older models do);
    * with ``traits`` of an engine whose chat template drops system messages, they are
      folded into the first user turn (:func:`system_into_first_user`)."""
    patched: dict | None = None
    strip_usage = False
    if stream:
        options = body.get("stream_options")
        if not (isinstance(options, dict) and options.get("include_usage")):
            patched = dict(body)
            patched["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
            strip_usage = True
    if bound:
        limit = token_bound(body, default_max_tokens)
        if limit is not None:
            patched = dict(body) if patched is None else patched
            patched["max_tokens"] = limit
    if bound:  # an empty stop string matches at once on llama.cpp and vLLM: the answer would be empty
        current = body if patched is None else patched
        if (cleaned := validation.without_empty_stops(current)) is not current:
            patched = cleaned
    if traits is not None and not traits.knows_developer_role:
        messages = developer_as_system(body.get("messages"))
        if messages is not None:
            patched = dict(body) if patched is None else patched
            patched["messages"] = messages
    if traits is not None and traits.drops_system_messages:
        current = (body if patched is None else patched).get("messages")
        messages = system_into_first_user(current)
        if messages is not None:
            patched = dict(body) if patched is None else patched
            patched["messages"] = messages
    return (raw if patched is None else json.dumps(patched).encode()), strip_usage


def system_into_first_user(messages) -> list | None:
    """``messages`` without system (or developer) messages, their text put before the
    first user turn's, separated by a blank line — what Gemma's own chat template does with
    a system prompt —, or None when there is none. With no user turn, the text becomes one.
    For an engine whose chat template would drop them (``EngineTraits.drops_system_messages``)."""
    if not isinstance(messages, list) or not any(
            isinstance(m, dict) and m.get("role") in ("system", "developer") for m in messages):
        return None
    texts = [_content_text(m.get("content")) for m in messages
             if isinstance(m, dict) and m.get("role") in ("system", "developer")]
    preamble = "\n\n".join(t for t in texts if t)
    rest = [m for m in messages if not (isinstance(m, dict) and m.get("role") in ("system", "developer"))]
    for i, message in enumerate(rest):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                merged = [{"type": "text", "text": preamble + "\n\n"}, *content] if preamble else content
            else:
                merged = f"{preamble}\n\n{content or ''}" if preamble else content
            rest[i] = {**message, "content": merged}
            return rest
    return [{"role": "user", "content": preamble}, *rest] if preamble else rest


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def developer_as_system(messages) -> list | None:
    """``messages`` as llama-cpp-python reads them, or None when nothing needs changing:
    every ``developer`` message as a ``system`` one (it knows no such role), and an
    assistant turn without ``content`` (a tool call, a refusal) given its refusal's text or
    "" (it fails on the missing field with a bare KeyError)."""
    if not isinstance(messages, list) or not any(_needs_rewrite(m) for m in messages):
        return None
    return [_rewritten(m) if _needs_rewrite(m) else m for m in messages]


def _needs_rewrite(message) -> bool:
    return isinstance(message, dict) and (message.get("role") == "developer" or (
        message.get("role") == "assistant" and message.get("content") is None))


def _rewritten(message: dict) -> dict:
    if message.get("role") == "developer":
        return {**message, "role": "system"}
    refusal = message.get("refusal")
    return {**message, "content": refusal if isinstance(refusal, str) else ""}


def requested_tokens(body: dict, default_max_tokens: int | None) -> int:
    """The completion tokens a generating request asks for: ``max_tokens``, else
    ``max_completion_tokens``, else the model's default; 0 when none says (the engine's
    own limit applies)."""
    given = body.get("max_tokens")
    if _positive_int(given):
        return int(given)
    return int(token_bound(body, default_max_tokens) or 0)


def token_bound(body: dict, default_max_tokens: int | None) -> int | None:
    """The ``max_tokens`` the gateway sets on a generating request to a replica served here,
    or None to leave the body alone: ``max_completion_tokens`` when only it is given
    (llama-cpp-python's server ignores the newer name), else the model's
    ``default_max_tokens`` when the request names no limit (see :func:`upstream_body`)."""
    given, newer = body.get("max_tokens"), body.get("max_completion_tokens")
    if _positive_int(given):
        return None
    if _positive_int(newer):
        return newer
    return default_max_tokens or None


def asks_usage(body: dict) -> bool:
    """Whether a streamed request asks for the final usage chunk
    (``stream_options.include_usage``)."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def context_problem(path: str, prompt_tokens: int, completion_tokens: int,
                    context_length: int | None) -> tuple[str, str, str] | None:
    """OpenAI's ``context_length_exceeded`` as ``(param, message, code)`` when a prompt of
    ``prompt_tokens`` and the ``completion_tokens`` asked for (0: none named) do not fit in
    ``context_length`` (None: unknown, never a problem); else None. Counts are tokens."""
    if not context_length or prompt_tokens + completion_tokens <= context_length:
        return None
    param, where = ("messages", "messages") if path == "chat/completions" else ("prompt", "prompt")
    asked = (f"{prompt_tokens + completion_tokens} tokens ({prompt_tokens} in the {where}, {completion_tokens} in "
             f"the completion)") if completion_tokens else f"{prompt_tokens} tokens in the {where}"
    return (param, f"This model's maximum context length is {context_length} tokens. However, you requested "
                   f"{asked}. Please reduce the length of the {where} or completion.", "context_length_exceeded")
