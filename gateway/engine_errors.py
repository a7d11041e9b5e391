"""An engine's error answer, turned into the status, message, code and param OpenAI would give.

Engines answer errors in many shapes: FastAPI's ``{"detail": "Not Found"}`` and its 422
validation lists (vLLM, llama-cpp-python), llama-cpp-python's 500 with a pydantic dump for a
wrongly typed field, OpenAI's own ``{"error": {...}}`` (llama-server, vLLM, with ``code`` an
integer), SGLang's and older vLLM's flat ``{"object": "error", "message", "type", "code"}``,
Ollama's ``{"error": "..."}``, and a proxy's HTML page. The client sees one shape and
OpenAI's statuses (issue 15, docs/architecture.md "Gateway rules"):

* the client's mistake stays a 4xx: 422 becomes 400 (OpenAI never answers 422), and a
  validation error an engine reports as a 5xx is a 400 too, naming the field in ``param``;
* a context-length complaint is 400 ``context_length_exceeded`` whatever the status;
* the framework's own 404 (no such route) is 404 ``unknown_endpoint``;
* the engine's 401/403 is the gateway's engine key being refused, not the client's: 502;
* a 5xx whose message is a bare Python ValueError (``invalid literal for int() with base 10:
  'abc'``, ``could not convert string to float: 'x'``) is the engine failing to read one of the
  request's values: 400 ``invalid_value``;
* a 5xx whose message is a bare KeyError repr (``'content'``) is 502 ``engine_error`` saying
  which field the engine did not find, never the bare word;
* any other 5xx is 502 ``engine_error``.

Messages are one line of at most ``MESSAGE_MAX_CHARS`` characters, with no traceback and
no file paths, directories or engine addresses (URLs naming a machine). An error told as
server-sent events is read from its first event. Everything here is pure: bytes in, a tuple out.
"""

from __future__ import annotations

import ast
import ipaddress
import json
import re
from urllib.parse import urlsplit

__all__ = ["MESSAGE_MAX_CHARS", "first_event_data", "map_engine_error", "one_line", "param_from_loc"]

#: The most characters of an engine's own words that reach the client.
MESSAGE_MAX_CHARS = 300

_CONTEXT_PATTERNS = (
    re.compile(r"Requested tokens \(\d+\) exceed context window of \d+", re.I),  # llama-cpp-python
    re.compile(r"maximum context length is \d+", re.I),  # vLLM, OpenAI, llama-cpp-python's 400
    re.compile(r"exceeds? the available context size", re.I),  # llama-server
    re.compile(r"is longer than the model's context length", re.I),  # SGLang
    re.compile(r"context[_ ]length[_ ]exceeded", re.I),
)
# pydantic's "1 validation error for Model", FastAPI's str(): "2 validation errors:".
_PYDANTIC_HEADER = re.compile(r"\b(\d+) validation errors?(?: for [\w.\[\]]+|:)", re.I)
_PYDANTIC_TYPE = re.compile(r"\s*\[type=([\w.]+)[^\]]*\]")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\):")
_FILE_FRAME = re.compile(r'File "[^"]*", line \d+(?:, in [\w<>.]+)?')
# An absolute path naming a file (a dot in its last part: .py, .gguf, .so): the machine's
# layout is nobody's business outside it. /v1/chat/completions has no dot and stays.
_FILE_PATH = re.compile(r"(?<![\w:/.])(?:[A-Za-z]:\\|/)(?:[\w.\-+@~]+[/\\])*[\w\-+@~]*\.[\w.\-]*[\w\-](?::\d+)?")
# An absolute path of two or more segments without a dot in its last part: a directory of
# weights ("/srv/weights/llama", "/home/me/models/secret-model-dir"). Its last part does not
# end in a dot, so that a sentence's full stop stays. OpenAI's own paths (/v1/...) stay.
_DIR_PATH = re.compile(r"(?<![\w:/.\\~])~?/(?:[\w.\-+@~]+/)+[\w.\-+@~]*[\w\-+@~]/?")
_OPENAI_PATH = re.compile(r"/v1(?:/[\w.\-]+)*/?")
# A URL. One that names a machine (an IP address, localhost, a name without a dot, a port,
# credentials) or is not https is the engine's address or a peer's: removed whole. A public
# https page (OpenAI's "Please check the API reference: https://platform.openai.com/...")
# stays.
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>()\[\]{}|\\^`]+")
_PRIVATE_SUFFIXES = (".local", ".internal", ".lan", ".localdomain", ".svc", ".cluster.local")
_SSE_DATA = re.compile(rb"^\s*data\s*:")
_HTML = re.compile(rb"^\s*<(?:!doctype|html|head|body|\?xml)", re.I)
# Pydantic's/FastAPI's ``type`` of one validation error → OpenAI's ``code``.
_MISSING_TYPES = {"missing", "missing_argument", "value_error.missing"}
_TYPE_SUFFIXES = ("_type", "_parsing", ".not_a_dict", ".not_a_list")
_DEFAULT_CODES = {429: "rate_limit_exceeded"}
# A bare Python ValueError as a 5xx's whole message: the engine converted a value of the
# request and failed (llama-cpp-python's int() of a logit_bias key). The client's 400.
_VALUE_ERROR = re.compile(r"\s*(?:ValueError:\s*)?(?:invalid literal for \w+\(\) with base \d+: "
                          r"|could not convert string to \w+: )", re.I)
# A bare KeyError repr as a 5xx's whole message ("'content'"): the engine looked up a field
# the request left out (llama-cpp-python's chat template on an assistant turn without content).
_KEY_ERROR = re.compile(r"\s*(?:KeyError:\s*)?('[\w.\-]{1,64}'|\"[\w.\-]{1,64}\")\s*")


def map_engine_error(status: int, content_type: str, body: bytes, model: str,
                     path: str) -> tuple[int, str, str, str | None]:
    """What the client gets for an engine's error answer.

    ``status`` is the engine's HTTP status (≥ 400), ``content_type`` its Content-Type header
    (may be empty), ``body`` the raw bytes it sent, ``model`` the model's name as the client
    knows it (used in generic messages), ``path`` the OpenAI path asked for, with or without
    the ``/v1/`` prefix (``chat/completions`` or ``/v1/chat/completions``).

    A body of server-sent events (``text/event-stream``, or bytes starting with ``data:``) is
    read as its first event's data (:func:`first_event_data`), mapped as if it were the body.

    Returns ``(status, message, code, param)``: the status for the client (400, 401…429 as
    sent except 422 → 400 and 401/403 → 502, 502 for a 5xx), a single line of at most
    ``MESSAGE_MAX_CHARS`` characters plus a short prefix, OpenAI's ``code`` (the engine's own
    string code where it gave one, else ``invalid_type``, ``invalid_value``,
    ``missing_required_parameter``, ``context_length_exceeded``, ``unknown_endpoint``,
    ``model_not_found``, ``rate_limit_exceeded`` or ``engine_error``), and ``param`` (``"max_tokens"``,
    ``"messages[0].role"``) or None. Raises nothing, whatever the bytes.
    """
    endpoint = "/v1/" + path.lstrip("/").removeprefix("v1/")
    if _is_event_stream(content_type, body):  # an error told as server-sent events: its first event
        data = first_event_data(body)
        if data is not None:
            content_type, body = ("application/json" if data.lstrip()[:1] in (b"{", b"[") else "text/plain"), data
    parsed = _parse(content_type, body)
    message, code, param, problems = _read(parsed)
    if message is None and not problems:
        said_json = "json" in (content_type or "").lower()
        text = ("" if parsed is not None or said_json or _HTML.match(body) or _is_event_stream(content_type, body)
                else body.decode("utf-8", "replace"))
        message = text if text.strip() and _printable(text) else None

    validation = bool(problems) or (message is not None and _looks_like_validation(message))
    if problems:  # FastAPI's detail list
        message, code, param = _describe(problems, param)
    elif validation:  # pydantic's text dump, or the engine's "Invalid request…"
        message, code, param = _describe(_pydantic_problems(message), param, fallback=message)
    if message is not None and any(p.search(message) for p in _CONTEXT_PATTERNS):
        if param in (None, "messages", "prompt", "input"):  # llama-cpp-python says "messages" for a prompt
            param = _input_param(endpoint)
        return 400, one_line(message), "context_length_exceeded", param
    if message is not None and "surrogates not allowed" in message:  # llama-cpp-python: 500
        return (400, "The request contains a lone UTF-16 surrogate (such as \\ud800), which is not valid "
                     "Unicode text.", "invalid_value", None)
    if status == 404 and (message is None or message.strip() in ("Not Found", "404 page not found")):
        return 404, f"The engine serving '{model}' has no endpoint {endpoint}.", "unknown_endpoint", None
    if status in (401, 403):
        return (502, f"The engine serving '{model}' refused the gateway's credentials ({status}).",
                "engine_error", None)
    if validation:
        return 400, one_line(message), code or "invalid_value", param
    if status >= 500 and message is not None:
        if _VALUE_ERROR.match(message):
            return (400, f"Invalid value in the request: the engine serving '{model}' could not read it "
                         f"({one_line(message)}).", "invalid_value", param)
        key = _KEY_ERROR.fullmatch(message)
        if key:
            return (502, f"The engine serving '{model}' failed on this request (it read a field it did not find: "
                         f"{key.group(1)}).", "engine_error", None)
    if status == 404 and code is None and message and re.search(r"\bmodel\b.*\b(?:does not exist|not found)", message, re.I):
        code = "model_not_found"
    if 400 <= status < 500:
        line = one_line(message) if message else (
            f"The engine serving '{model}' answered {status} to {endpoint}{_no_message(content_type, body)}.")
        return (400 if status == 422 else status), line, code or _DEFAULT_CODES.get(status, "engine_error"), param
    if message:
        return 502, f"The engine serving '{model}' failed ({status}): {one_line(message)}", "engine_error", None
    return 502, f"The engine serving '{model}' failed ({status}){_no_message(content_type, body)}.", "engine_error", None


def one_line(text: str, limit: int = MESSAGE_MAX_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters (an ellipsis where cut): a
    traceback's last line only, ``File "...", line N`` frames removed, every run of white
    space (newlines included) one space, and nothing of the machine's layout: absolute file
    paths (a dot in the last part), absolute paths of two or more segments
    (``/srv/weights/llama``), and URLs that name a machine (``http://10.0.0.5:8000/v1``,
    see :func:`_is_public_url`) removed. OpenAI's own paths (``/v1/chat/completions``), a
    lone ``/``, relative ``a/b`` and public https pages stay."""
    if _TRACEBACK.search(text):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        tail = [line for line in lines if not line.startswith(("File ", "Traceback", "^", "~"))]
        text = tail[-1] if tail else lines[-1]
    text = _FILE_FRAME.sub("", text)
    said = bool(text.strip())
    text = _URL.sub(_kept_url, text)
    text = _FILE_PATH.sub(_kept_path, text)
    text = _DIR_PATH.sub(_kept_path, text)
    text = " ".join(text.split())
    text = re.sub(r"\s+([,.;:)])", r"\1", text).strip(" ,;:")
    if said and not text.strip(" .,;:!?"):
        text = "(the engine's message named only places on its machine, which are not shown)"
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def first_event_data(body: bytes) -> bytes | None:
    """The data of the first event in a server-sent events ``body`` (its ``data:`` lines
    joined by newlines, one space after the colon dropped), skipping ``[DONE]``; None when
    no event carries data. Reads at most the first MiB."""
    lines: list[bytes] = []
    for line in body[:1_048_576].splitlines() + [b""]:
        if not line.strip():
            data = b"\n".join(lines)
            if lines and data.strip() != b"[DONE]":
                return data
            lines = []
        elif line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
        elif _SSE_DATA.match(line):  # "data :" or leading blanks, as sloppy servers write it
            lines.append(line.split(b":", 1)[1].lstrip(b" "))
    return None


def param_from_loc(loc) -> str | None:
    """OpenAI's ``param`` for a FastAPI/pydantic error location: ``["body", "max_tokens"]`` →
    ``"max_tokens"``, ``["body", "messages", 0, "role"]`` → ``"messages[0].role"``. The
    ``body``/``query`` root and pydantic's union tags (class names such as
    ``ChatCompletionRequestUserMessage``, ``typed-dict``, ``function-after[...]``) are left
    out. None for an empty or unreadable location."""
    if isinstance(loc, str):
        loc = [part for part in re.split(r"\.", loc) if part]
        loc = [int(p) if p.isdigit() else p for p in loc]
    if not isinstance(loc, (list, tuple)):
        return None
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    out = ""
    for part in parts:
        if isinstance(part, bool):
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and _is_field_name(part):
            out += ("." if out else "") + part
    return out or None


# ----------------------------------------------------------------------------- reading bodies
def _is_event_stream(content_type: str, body: bytes) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "text/event-stream" or _SSE_DATA.match(body[:64]) is not None


def _kept_path(match: re.Match) -> str:
    """A path as it stays in a message: OpenAI's ``/v1/...`` kept, any other removed."""
    path = match.group()
    return path if _OPENAI_PATH.fullmatch(path) else ""


def _kept_url(match: re.Match) -> str:
    """A URL as it stays in a message: a public page kept, any other removed whole (the
    sentence's own punctuation after it kept)."""
    url = match.group()
    stripped = url.rstrip(".,;:!?")
    return url if _is_public_url(stripped) else url[len(stripped):]


def _is_public_url(url: str) -> bool:
    """An https URL of a public host name: dotted, not an IP address, no port, no
    credentials, not a private suffix (``.local``, ``.internal``, ``.svc``…). Anything else
    names a machine of the cluster (the engine's own address) or cannot be told apart from
    one."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    host = (parts.hostname or "").rstrip(".")
    if parts.scheme.lower() != "https" or port is not None or parts.username or parts.password:
        return False
    if "." not in host or host.endswith(_PRIVATE_SUFFIXES) or host == "localhost":
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False


def _parse(content_type: str, body: bytes):
    if not body.strip() or len(body) > 1_000_000:
        return None
    if "json" not in (content_type or "").lower() and body.lstrip()[:1] not in (b"{", b"["):
        return None
    try:
        return json.loads(body.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None


def _read(parsed) -> tuple[str | None, str | None, str | None, list[dict]]:
    """(message, code, param, validation problems) from any known error shape."""
    if not isinstance(parsed, dict):
        return None, None, None, []
    inner = parsed.get("error")
    if isinstance(inner, dict):  # OpenAI's shape (llama-server, vLLM, llama-cpp-python)
        message = _text(inner.get("message"))
        code = _text(inner.get("code"))
        if inner.get("type") == "exceed_context_size_error":  # llama-server's own type
            code = "context_length_exceeded"
        return message, code, _text(inner.get("param")), []
    if isinstance(inner, str):  # Ollama and others
        return _text(inner), _text(parsed.get("code")), None, []
    detail = parsed.get("detail")
    if isinstance(detail, list):  # FastAPI's RequestValidationError
        problems = [d for d in detail if isinstance(d, dict)]
        if problems:
            return None, None, None, problems
        return None, None, None, []
    if isinstance(detail, str):
        return _text(detail), None, None, []
    # SGLang's and older vLLM's {"object": "error", "message", "type", "param", "code"}
    return _text(parsed.get("message")), _text(parsed.get("code")), _text(parsed.get("param")), []


def _text(value) -> str | None:
    """A non-empty string, or None (vLLM's integer ``code`` is no OpenAI code)."""
    if isinstance(value, str) and value.strip():
        return value
    return None


def _printable(text: str) -> bool:
    sample = text[:2000]
    bad = sum(1 for ch in sample if (ch < " " and ch not in "\t\r\n") or ch == "\ufffd")
    return bad * 20 < len(sample)


# ------------------------------------------------------------------------ validation errors
def _looks_like_validation(message: str) -> bool:
    return bool(_PYDANTIC_HEADER.search(message)) or message.lstrip().startswith("Invalid request")


def _pydantic_problems(message: str) -> list[dict]:
    """Pydantic v2's text dump (``1 validation error for X\\nfield\\n  msg [type=t, ...]``)
    as FastAPI-like problem dicts; [] when it is not one."""
    match = _PYDANTIC_HEADER.search(message)
    if not match:
        return []
    lines = message[match.end():].splitlines()
    problems, loc = [], None
    for line in lines:
        if line.strip().startswith("{") and len(line) < 5000:  # FastAPI's str(): one dict a line
            try:
                item = ast.literal_eval(line.strip())
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                item = None
            if isinstance(item, dict):
                problems.append(item)
                continue
        if not line.strip() or line.lstrip().startswith("For further information"):
            continue
        if not line.startswith(" "):
            loc = line.strip()
            continue
        if loc is None:
            continue
        kind = _PYDANTIC_TYPE.search(line)
        text = _PYDANTIC_TYPE.sub("", line).strip()
        problems.append({"loc": loc, "msg": text, "type": kind.group(1) if kind else ""})
        loc = None
    return problems


def _describe(problems: list[dict], param: str | None, fallback: str | None = None
              ) -> tuple[str, str, str | None]:
    """One line naming the first problem, OpenAI's code for it, and its param.

    Pydantic reports a value that fits no member of a union once per member (llama-cpp-python's
    seven errors for one unknown ``role``); those are one problem: the expected literals are
    joined ("Input should be 'system', 'user' or 'tool'") and the union's other members'
    complaints are not counted as more problems."""
    if not problems:
        line = fallback or "The request is not valid."
        return line, "invalid_value", param
    first = problems[0]
    where = param_from_loc(first.get("loc")) or param
    union = _union_prefix(first.get("loc"))
    kind = str(first.get("type") or "")
    text = " ".join(str(first.get("msg") or "is not valid").split()).rstrip(".")
    same = [p for p in problems if param_from_loc(p.get("loc")) == where and p.get("type") == kind]
    if kind == "literal_error" and len(same) > 1:
        expected = []
        for p in same:
            value = str(p.get("msg") or "").removeprefix("Input should be ").strip()
            if value and value not in expected:
                expected.append(value)
        text = "Input should be " + (", ".join(expected[:-1]) + " or " + expected[-1] if len(expected) > 1
                                     else expected[0])
    if kind in _MISSING_TYPES:
        code, line = "missing_required_parameter", f"Missing required parameter: '{where}'."
    else:
        code = "invalid_type" if kind.endswith(_TYPE_SUFFIXES) else "invalid_value"
        word = "type" if code == "invalid_type" else "value"
        line = f"Invalid {word} for '{where}': {text}." if where else f"Invalid request: {text}."
    others = sum(1 for p in problems[1:] if p not in same
                 and not (union is not None and _union_prefix(p.get("loc")) == union))
    if others:
        line += f" ({others} more problem{'s' if others > 1 else ''} in the request.)"
    return line, code, where


def _union_prefix(loc) -> str | None:
    """The param up to the first union tag in ``loc`` (``messages[0]`` for
    ``body.messages.0.ChatCompletionRequestUserMessage.role``), or None without one."""
    if not isinstance(loc, (list, tuple)):
        return None
    for i, part in enumerate(loc):
        if isinstance(part, str) and i and not _is_field_name(part) and part not in ("body", "query"):
            return param_from_loc(list(loc[:i])) or ""
    return None


def _is_field_name(part: str) -> bool:
    """A body field's name, not one of pydantic's union tags: those are class names
    (``ChatCompletionRequestUserMessage``), or carry ``-``/``[`` (``typed-dict``,
    ``function-after[validate(), str]``), or name a type (``str``, ``list[int]``)."""
    if not part or "-" in part or "[" in part or " " in part:
        return False
    if part in ("str", "int", "float", "bool", "list", "dict", "none", "null", "literal"):
        return False
    return not (part[0].isupper() and any(c.islower() for c in part))


def _no_message(content_type: str, body: bytes) -> str:
    """How a body without an error message is described: its media type, never its bytes."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if not body.strip():
        return " with an empty body"
    if _HTML.match(body) or media == "text/html":
        return " with an HTML page instead of an error"
    if "json" in media and _parse(content_type, body) is None:
        return " with a broken JSON body"
    return f" without an error message ({media})" if re.fullmatch(r"[\w.+\-]+/[\w.+\-]+", media) else \
        " without an error message"


def _input_param(endpoint: str) -> str:
    return {"/v1/chat/completions": "messages", "/v1/completions": "prompt",
            "/v1/embeddings": "input"}.get(endpoint, "messages")
