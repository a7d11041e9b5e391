"""OpenAI answers built by the gateway from an engine's streams (issue 15).

llama-cpp-python's server cannot cancel a non-streamed request when the client hangs up (it
generates to the end), ignores ``n`` > 1 and sends no usage chunk in streams. So the gateway

* asks such an engine for a stream even when the client did not, and puts the non-streamed
  answer together itself (:class:`StreamAssembler`);
* serves ``n`` > 1 as n requests with ``n`` = 1 (:func:`split_n`) whose answers are merged
  (:func:`merge_answers`) or whose streams are interleaved (:func:`merge_streams`);
* adds the final ``stream_options.include_usage`` chunk when the engine sent none
  (:func:`usage_chunk`), counting the prompt with the engine's tokenizer
  (:func:`prompt_text`, ``gateway.tokenize.count_tokens``).

Shapes are OpenAI's: ``chat.completion`` / ``chat.completion.chunk`` and the legacy
``text_completion`` (which its streamed chunks are called too). Pure code, no Django: this
is the hot path. Nothing here raises on odd engine JSON; a field of the wrong type is
skipped.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import Literal

from gateway import sse
from llmgw import integers

Kind = Literal["chat", "completion"]
KINDS = ("chat", "completion")

#: What a stream's last event is, and what the gateway ends a stream it writes itself with.
DONE_EVENT = b"data: [DONE]\n\n"

_ANSWER_OBJECT = {"chat": "chat.completion", "completion": "text_completion"}
_CHUNK_OBJECT = {"chat": "chat.completion.chunk", "completion": "text_completion"}
_ID_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-"}


def kind_of(path: str) -> Kind | None:
    """``"chat"`` for ``chat/completions``, ``"completion"`` for ``completions`` (with or
    without a leading ``/v1/``), None for any other path (embeddings…)."""
    name = path.strip("/")
    if name.startswith("v1/"):
        name = name[3:]
    return "chat" if name == "chat/completions" else "completion" if name == "completions" else None


def make_usage(prompt_tokens: object, completion_tokens: object) -> dict:
    """OpenAI's ``usage`` object: ``{prompt_tokens, completion_tokens, total_tokens}``, the
    total always the sum. Counts that are not counts (negative, a bool, a string) are 0."""
    prompt = integers.count_or_none(prompt_tokens) or 0
    completion = integers.count_or_none(completion_tokens) or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def encode_event(data: dict) -> bytes:
    """One server-sent event carrying ``data`` as JSON: ``b"data: {...}\\n\\n"``."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _is_index(value: object) -> bool:
    return integers.is_int(value) and value >= 0  # type: ignore[operator]


class _ToolCall:
    __slots__ = ("id", "type", "name", "arguments")

    def __init__(self) -> None:
        self.id: str | None = None
        self.type: str | None = None
        self.name: list[str] = []
        self.arguments: list[str] = []

    def feed(self, delta: dict) -> None:
        if isinstance(delta.get("id"), str) and delta["id"] and self.id is None:
            self.id = delta["id"]
        if isinstance(delta.get("type"), str) and delta["type"]:
            self.type = delta["type"]
        function = delta.get("function")
        if isinstance(function, dict):
            self.feed_function(function)

    def feed_function(self, function: dict) -> None:
        name = function.get("name")
        # OpenAI sends the name once; llama-cpp-python repeats it in every chunk of the call.
        if isinstance(name, str) and name and name != "".join(self.name):
            self.name.append(name)
        if isinstance(function.get("arguments"), str):
            self.arguments.append(function["arguments"])

    def function(self) -> dict:
        return {"name": "".join(self.name), "arguments": "".join(self.arguments)}


class _Choice:
    """One choice's pieces as they come; joined once, in :meth:`answer`."""

    __slots__ = ("role", "content", "content_sent", "refusal", "reasoning", "tool_calls", "function_call",
                 "logprobs_seen", "logprobs", "refusal_logprobs", "finish_reason")

    def __init__(self) -> None:
        self.role = "assistant"
        self.content: list[str] = []
        self.content_sent = False
        self.refusal: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, _ToolCall] = {}
        self.function_call: _ToolCall | None = None
        self.logprobs_seen = False
        # chat: lists of token entries; completions: the four parallel lists by field.
        self.logprobs: dict[str, list] = {}
        self.refusal_logprobs: list | None = None
        self.finish_reason: str | None = None

    def feed_logprobs(self, logprobs: object, fields: tuple[str, ...]) -> None:
        if not isinstance(logprobs, dict):
            return
        self.logprobs_seen = True
        for field in fields:
            if isinstance(logprobs.get(field), list):
                self.logprobs.setdefault(field, []).extend(logprobs[field])


_CHAT_LOGPROB_FIELDS = ("content", "refusal")
_COMPLETION_LOGPROB_FIELDS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


class StreamAssembler:
    """The non-streamed answer OpenAI would have sent, from the chunks of a stream.

    ``kind`` is ``"chat"`` (``chat.completion.chunk`` → ``chat.completion``) or
    ``"completion"`` (``text_completion`` chunks → ``text_completion``); anything else
    raises ValueError. Call :meth:`feed` with every chunk's parsed JSON in order, then
    :meth:`answer`. Choices are kept by their ``index`` (a choice without one is 0)."""

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        self.kind: Kind = kind  # type: ignore[assignment]
        self._choices: dict[int, _Choice] = {}
        self._head: dict = {}
        self._content_chunks = 0
        #: The engine's own usage, if a chunk carried one (the include_usage chunk).
        self.usage: dict | None = None
        #: The ``error`` object of an error event in the stream (OpenAI's shape), if any.
        self.error: dict | None = None

    @property
    def content_chunks(self) -> int:
        """Chunks that carried generated output (text, content, refusal, reasoning, tool-call
        pieces): about one token each on llama.cpp engines, so the completion tokens'
        estimate when the engine sends no usage."""
        return self._content_chunks

    @property
    def completion_tokens(self) -> int:
        """The engine's ``usage.completion_tokens`` if it sent one, else :attr:`content_chunks`."""
        given = integers.count_or_none(self.usage.get("completion_tokens")) if self.usage else None
        return self._content_chunks if given is None else given

    def feed(self, data: dict) -> None:
        """Take one chunk (a parsed ``data:`` JSON object). Non-dicts and malformed choices are
        skipped; an ``{"error": {...}}`` event is kept in :attr:`error`."""
        if not isinstance(data, dict):
            return
        if isinstance(data.get("error"), dict) and self.error is None:
            self.error = data["error"]
        for field in ("id", "created", "model", "system_fingerprint", "service_tier"):
            if field not in self._head and data.get(field) is not None:
                self._head[field] = data[field]
        if isinstance(data.get("usage"), dict):
            self.usage = data["usage"]
        choices = data.get("choices")
        if not isinstance(choices, list):
            return
        produced = False
        for raw in choices:
            if not isinstance(raw, dict):
                continue
            index = raw.get("index", 0)
            if not _is_index(index):
                continue
            choice = self._choices.get(index)
            if choice is None:
                choice = self._choices[index] = _Choice()
            if self.kind == "chat":
                produced |= self._feed_chat(choice, raw)
            else:
                text = raw.get("text")
                if isinstance(text, str):
                    choice.content.append(text)
                    produced |= bool(text)
                choice.feed_logprobs(raw.get("logprobs"), _COMPLETION_LOGPROB_FIELDS)
            if isinstance(raw.get("finish_reason"), str):
                choice.finish_reason = raw["finish_reason"]
        if produced:
            self._content_chunks += 1

    @staticmethod
    def _feed_chat(choice: _Choice, raw: dict) -> bool:
        produced = False
        delta = raw.get("delta")
        if isinstance(delta, dict):
            if isinstance(delta.get("role"), str) and delta["role"]:
                choice.role = delta["role"]
            if isinstance(delta.get("content"), str):
                choice.content.append(delta["content"])
                choice.content_sent = True
                produced |= bool(delta["content"])
            for field, pieces in (("refusal", choice.refusal), ("reasoning_content", choice.reasoning)):
                if isinstance(delta.get(field), str):
                    pieces.append(delta[field])
                    produced |= bool(delta[field])
            if isinstance(delta.get("tool_calls"), list):
                for call in delta["tool_calls"]:
                    if not isinstance(call, dict):
                        continue
                    index = call.get("index", 0)
                    if not _is_index(index):
                        continue
                    choice.tool_calls.setdefault(index, _ToolCall()).feed(call)
                    produced = True
            if isinstance(delta.get("function_call"), dict):
                if choice.function_call is None:
                    choice.function_call = _ToolCall()
                choice.function_call.feed_function(delta["function_call"])
                produced = True
        choice.feed_logprobs(raw.get("logprobs"), _CHAT_LOGPROB_FIELDS)
        return produced

    def answer(self, usage: dict | None = None, *, prompt_tokens: int | None = None) -> dict:
        """The non-streamed object: ``id``, ``object``, ``created``, ``model``,
        ``system_fingerprint`` / ``service_tier`` when the stream had them, ``choices`` in
        index order, ``usage``.

        ``usage`` is ``usage`` if given, else the engine's own from the stream, else counted:
        ``prompt_tokens`` (0 when not given: OpenAI's shape needs a number) and
        :attr:`content_chunks` as the completion tokens.

        A chat choice is ``{index, message: {role, content, refusal[, reasoning_content]
        [, tool_calls][, function_call]}, logprobs, finish_reason}``; ``content`` is None when
        nothing was said besides tool calls, a function call or a refusal. A completion choice
        is ``{index, text, logprobs, finish_reason}``. ``logprobs`` is None unless a chunk
        carried some; then its lists are the chunks' lists concatenated."""
        head = self._head
        answer: dict = {
            "id": head.get("id") or _ID_PREFIX[self.kind] + secrets.token_hex(12),
            "object": _ANSWER_OBJECT[self.kind],
            "created": head.get("created") if integers.is_int(head.get("created")) else int(time.time()),
            "model": head.get("model", ""),
        }
        for field in ("system_fingerprint", "service_tier"):
            if field in head:
                answer[field] = head[field]
        build = self._chat_choice if self.kind == "chat" else self._completion_choice
        answer["choices"] = [build(index, self._choices[index]) for index in sorted(self._choices)]
        if usage is None and self.usage is not None:
            usage = make_usage(self.usage.get("prompt_tokens"), self.usage.get("completion_tokens"))
        answer["usage"] = usage if usage is not None else make_usage(prompt_tokens or 0, self._content_chunks)
        return answer

    @staticmethod
    def _chat_choice(index: int, choice: _Choice) -> dict:
        content = "".join(choice.content)
        message: dict = {"role": choice.role, "content": content,
                         "refusal": "".join(choice.refusal) if choice.refusal else None}
        if choice.reasoning:
            message["reasoning_content"] = "".join(choice.reasoning)
        if choice.tool_calls:
            message["tool_calls"] = [
                {"id": call.id or f"call_{secrets.token_hex(12)}", "type": call.type or "function",
                 "function": call.function()}
                for _, call in sorted(choice.tool_calls.items())]
        if choice.function_call is not None and not choice.tool_calls:  # OpenAI never sends both
            message["function_call"] = choice.function_call.function()
        if not content and (choice.tool_calls or choice.function_call is not None or choice.refusal):
            message["content"] = None  # as OpenAI answers a call or a refusal
        logprobs = None
        if choice.logprobs_seen:
            logprobs = {"content": choice.logprobs.get("content"), "refusal": choice.logprobs.get("refusal")}
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": choice.finish_reason}

    @staticmethod
    def _completion_choice(index: int, choice: _Choice) -> dict:
        logprobs = None
        if choice.logprobs_seen:
            logprobs = {field: choice.logprobs.get(field, []) for field in _COMPLETION_LOGPROB_FIELDS}
        return {"index": index, "text": "".join(choice.content), "logprobs": logprobs,
                "finish_reason": choice.finish_reason}


class EventTooLarge(ValueError):
    """An upstream event grew past the limit before its blank line came."""


async def stream_chunks(byte_chunks: AsyncIterable[bytes], max_event_bytes: int | None = None) -> AsyncIterator[dict]:
    """The JSON objects of an SSE byte stream (an aiohttp ``content.iter_any()``), in order,
    until ``data: [DONE]`` (or the Responses API's final events) or the end of the bytes.
    Comments and events that carry no JSON object are skipped; error events are yielded
    like any object. Raises :class:`EventTooLarge` when an unfinished event passes
    ``max_event_bytes``; the byte source's own errors pass through."""
    buffer = b""
    async for piece in byte_chunks:
        buffer += piece
        events, buffer = sse.split_events(buffer)
        if max_event_bytes is not None and len(buffer) > max_event_bytes:
            raise EventTooLarge(f"an event is over {max_event_bytes} bytes")
        for event in events:
            if (b"[DONE]" in event or b"event:" in event) and sse.is_done(event):
                return
            data = sse.event_json(event)
            if data is not None:
                yield data
    if buffer.strip():
        data = sse.event_json(buffer)  # a last event the engine did not end with a blank line
        if data is not None:
            yield data


# --- n > 1 served as n requests ------------------------------------------------------------


def split_n(body: dict, n: int) -> list[dict]:
    """The ``n`` request bodies that stand for one with ``n`` choices: each a shallow copy of
    ``body`` without ``n``; when ``seed`` is an integer, body i has ``seed + i`` so that the
    choices differ (and stay reproducible). Raises ValueError for ``n`` < 1."""
    if not integers.is_int(n) or n < 1:
        raise ValueError(f"n must be a positive integer, not {n!r}")
    seed = body.get("seed")
    bodies = []
    for i in range(n):
        one = {key: value for key, value in body.items() if key != "n"}
        if integers.is_int(seed):
            one["seed"] = (seed + i + 2 ** 63) % 2 ** 64 - 2 ** 63  # stepped within int64
        bodies.append(one)
    return bodies


def merge_usage(usages: list[dict | None]) -> dict | None:
    """One ``usage`` for the answers of :func:`split_n`'s requests: the prompt counted once
    (the first usage's ``prompt_tokens``, as OpenAI counts a request with ``n`` choices),
    the completions summed. None when no usage was given."""
    given = [usage for usage in usages if isinstance(usage, dict)]
    if not given:
        return None
    prompt = integers.count_or_none(given[0].get("prompt_tokens")) or 0
    completion = sum(integers.count_or_none(usage.get("completion_tokens")) or 0 for usage in given)
    return make_usage(prompt, completion)


def merge_answers(answers: list[dict]) -> dict:
    """One answer from the answers of :func:`split_n`'s requests: the first answer's head
    (``id``, ``object``, ``created``, ``model``…), every answer's choices in order re-indexed
    0..n-1, and :func:`merge_usage` of their usages (no ``usage`` when none had one). Raises
    ValueError for an empty list."""
    if not answers:
        raise ValueError("no answers to merge")
    merged = {key: value for key, value in answers[0].items() if key not in ("choices", "usage")}
    choices = []
    for answer in answers:
        for choice in answer.get("choices") or []:
            if isinstance(choice, dict):
                choices.append({**choice, "index": len(choices)})
    merged["choices"] = choices
    usage = merge_usage([answer.get("usage") for answer in answers])
    if usage is not None:
        merged["usage"] = usage
    return merged


def reindex_chunk(data: dict, index: int) -> dict:
    """``data`` (a streamed chunk) with every choice's ``index`` set to ``index``: a new dict
    and new choice dicts, the input is left as it was."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        return data
    return {**data, "choices": [{**choice, "index": index} if isinstance(choice, dict) else choice
                                for choice in choices]}


_END = object()


async def merge_streams(streams: list[AsyncIterator[dict]], *, combine_usage: bool = True) -> AsyncIterator[dict]:
    """The chunks of all ``streams`` as they come, stream i's re-indexed to choice i
    (:func:`reindex_chunk`), until every stream has ended.

    Every chunk carries the first chunk's ``id`` and ``created``, so that the client sees one
    completion. With ``combine_usage``, the streams' usage is taken out of their chunks (a
    usage-only chunk is dropped) and, if any stream sent usage, one last usage-only chunk
    with :func:`merge_usage` of them follows (prompt counted once).

    An error raised by one stream is raised here after the other streams are cancelled and
    closed; when the consumer stops early (``aclose()``, cancellation) every stream is
    cancelled and closed too, so that each upstream request ends and its engine stops."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=max(1, len(streams)))

    async def pump(index: int, stream: AsyncIterator[dict]) -> None:
        failure: Exception | None = None
        try:
            async for data in stream:
                await queue.put((index, data, None))
        except Exception as exc:  # handed to the consumer, which cancels the others
            failure = exc
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()  # its upstream request ends now, not when collected
        await queue.put((index, _END, failure))

    tasks = [asyncio.ensure_future(pump(i, stream)) for i, stream in enumerate(streams)]
    head: dict = {}
    last: dict | None = None
    usages: list[dict | None] = []
    try:
        running = len(tasks)
        while running:
            index, data, failure = await queue.get()
            if failure is not None:
                raise failure
            if data is _END:
                running -= 1
                continue
            if not isinstance(data, dict):
                continue
            if combine_usage and isinstance(data.get("usage"), dict):
                usages.append(data["usage"])
                data = {key: value for key, value in data.items() if key != "usage"}
                if not data.get("choices"):
                    continue
            if not head:
                head = {field: data[field] for field in ("id", "created") if field in data}
            data = {**reindex_chunk(data, index), **head}
            last = data
            yield data
        if combine_usage and usages:
            final = {key: value for key, value in (last or {}).items() if key not in ("choices", "usage")}
            yield {**final, "choices": [], "usage": merge_usage(list(usages))}
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# --- usage the client asked for ------------------------------------------------------------


def usage_chunk(last_chunk: dict | None, usage: dict, kind: str, *, model: str = "") -> bytes:
    """The final event ``stream_options.include_usage`` asks for, as OpenAI sends it:
    ``data: {"id", "object", "created", "model"[, "system_fingerprint"], "choices": [],
    "usage": {prompt_tokens, completion_tokens, total_tokens}}\\n\\n`` — ``id``, ``created``,
    ``model`` and ``system_fingerprint`` those of ``last_chunk`` (the stream's last chunk);
    without one, a new id, now, and ``model``. ``usage`` is read with :func:`make_usage`
    (the total recomputed). Raises ValueError for an unknown ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    last = last_chunk if isinstance(last_chunk, dict) else {}
    data: dict = {
        "id": last.get("id") or _ID_PREFIX[kind] + secrets.token_hex(12),
        "object": _CHUNK_OBJECT[kind],
        "created": last["created"] if integers.is_int(last.get("created")) else int(time.time()),
        "model": last.get("model") or model,
    }
    if last.get("system_fingerprint") is not None:
        data["system_fingerprint"] = last["system_fingerprint"]
    data["choices"] = []
    data["usage"] = make_usage(usage.get("prompt_tokens"), usage.get("completion_tokens"))
    return encode_event(data)


def _is_token_ids(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(integers.is_int(item) for item in value)


def prompt_token_ids_count(path: str, body: dict) -> int | None:
    """The prompt's token count when a completions request gives the prompt as token ids
    (a list of ints, or a list of such lists: their lengths summed) — "already tokens", no
    tokenizer needed; None when there is text to count (:func:`prompt_text`) or nothing."""
    if kind_of(path) != "completion":
        return None
    prompt = body.get("prompt")
    if _is_token_ids(prompt):
        return len(prompt)  # type: ignore[arg-type]
    if isinstance(prompt, list) and prompt and all(_is_token_ids(item) for item in prompt):
        return sum(len(item) for item in prompt)
    return None


def prompt_text(path: str, body: dict) -> str:
    """The text to count as a request's prompt tokens (with the engine's tokenizer).

    * completions: ``prompt`` as a string, or a list of strings joined with newlines; ""
      when the prompt is token ids (count those with :func:`prompt_token_ids_count`);
    * chat: every message's text — string contents and the ``text`` of ``{"type":
      "text"}`` parts — joined with newlines. This undercounts: the chat template's own
      tokens (role markers, separators, a system preamble) and ``tools`` are not in it, so
      the count is a lower bound of what the engine read.

    "" for any other path or a body without text. Raises nothing."""
    kind = kind_of(path)
    if kind == "completion":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and all(isinstance(item, str) for item in prompt):
            return "\n".join(prompt)
        return ""
    if kind != "chat" or not isinstance(body.get("messages"), list):
        return ""
    texts = []
    for message in body["messages"]:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(part["text"] for part in content
                         if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str))
    return "\n".join(texts)
