"""Answers the gateway builds from engines' streams (``gateway.assembly``): the non-streamed
object from chunks, n > 1 served as n requests and merged, streams interleaved and
cancelled, the include_usage chunk, and the prompt text to count. No database."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway import sse
from gateway.assembly import (DONE_EVENT, EventTooLarge, StreamAssembler, kind_of, make_usage, merge_answers,
                              merge_streams, merge_usage, prompt_text, prompt_token_ids_count, reindex_chunk,
                              split_n, stream_chunks, usage_chunk)

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1764600000, "model": "qwen"}
TEXT_HEAD = {"id": "cmpl-1", "object": "text_completion", "created": 1764600000, "model": "qwen"}


def chat(*choices, **extra) -> dict:
    return {**HEAD, "choices": list(choices), **extra}


def delta(index: int = 0, finish_reason=None, logprobs=None, **fields) -> dict:
    choice = {"index": index, "delta": fields, "finish_reason": finish_reason}
    if logprobs is not None:
        choice["logprobs"] = logprobs
    return choice


def text(piece: str, index: int = 0, finish_reason=None, logprobs=None) -> dict:
    return {**TEXT_HEAD, "choices": [{"index": index, "text": piece, "logprobs": logprobs,
                                      "finish_reason": finish_reason}]}


def assemble(kind: str, chunks: list[dict], **kw) -> dict:
    assembler = StreamAssembler(kind)
    for chunk in chunks:
        assembler.feed(chunk)
    return assembler.answer(**kw)


def token(t: str, lp: float) -> dict:
    return {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}


CALL_PIECES = [
    chat(delta(role="assistant", content=None)),
    chat(delta(tool_calls=[{"index": 0, "id": "call_a", "type": "function",
                            "function": {"name": "get_weather", "arguments": ""}}])),
    chat(delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}])),
    chat(delta(tool_calls=[{"index": 1, "id": "call_b", "type": "function",
                            "function": {"name": "get_time", "arguments": "{}"}}])),
    chat(delta(tool_calls=[{"index": 0, "function": {"arguments": '"Oslo"}'}}])),
    chat(delta(finish_reason="tool_calls")),
]
# llama-cpp-python repeats id, type and name in every chunk of a call.
REPEATED_NAME_PIECES = [
    chat(delta(role="assistant")),
    *[chat(delta(tool_calls=[{"index": 0, "id": "call_x", "type": "function",
                              "function": {"name": "lookup", "arguments": piece}}]))
      for piece in ('{"q"', ': "llm', 'gw"}')],
    chat(delta(finish_reason="tool_calls")),
]

CHAT_CASES = [
    pytest.param(
        [chat(delta(role="assistant", content="")), chat(delta(content="Hel")), chat(delta(content="lo")),
         chat(delta(finish_reason="stop"))],
        [{"index": 0, "message": {"role": "assistant", "content": "Hello", "refusal": None},
          "logprobs": None, "finish_reason": "stop"}],
        id="text"),
    pytest.param(
        CALL_PIECES,
        [{"index": 0, "message": {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
          "logprobs": None, "finish_reason": "tool_calls"}],
        id="tool calls split across chunks"),
    pytest.param(
        REPEATED_NAME_PIECES,
        [{"index": 0, "message": {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
            {"id": "call_x", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "llmgw"}'}}]},
          "logprobs": None, "finish_reason": "tool_calls"}],
        id="a tool name repeated in every chunk"),
    pytest.param(
        [chat(delta(role="assistant", function_call={"name": "f", "arguments": "{"})),
         chat(delta(function_call={"arguments": "}"})), chat(delta(finish_reason="function_call"))],
        [{"index": 0, "message": {"role": "assistant", "content": None, "refusal": None,
                                  "function_call": {"name": "f", "arguments": "{}"}},
          "logprobs": None, "finish_reason": "function_call"}],
        id="deprecated function_call"),
    pytest.param(
        [chat(delta(role="assistant", refusal="I can")), chat(delta(refusal="not.")),
         chat(delta(finish_reason="stop"))],
        [{"index": 0, "message": {"role": "assistant", "content": None, "refusal": "I cannot."},
          "logprobs": None, "finish_reason": "stop"}],
        id="refusal"),
    pytest.param(
        [chat(delta(role="assistant", content="A", logprobs={"content": [token("A", -0.1)], "refusal": None})),
         chat(delta(content="B", logprobs={"content": [token("B", -0.2)]})),
         chat(delta(finish_reason="length"))],
        [{"index": 0, "message": {"role": "assistant", "content": "AB", "refusal": None},
          "logprobs": {"content": [token("A", -0.1), token("B", -0.2)], "refusal": None},
          "finish_reason": "length"}],
        id="logprobs concatenated"),
    pytest.param(
        [chat(delta(1, role="assistant", content="b1")), chat(delta(0, role="assistant", content="a1")),
         chat(delta(1, content="b2"), delta(0, content="a2")),
         chat(delta(0, finish_reason="stop")), chat(delta(1, finish_reason="length"))],
        [{"index": 0, "message": {"role": "assistant", "content": "a1a2", "refusal": None},
          "logprobs": None, "finish_reason": "stop"},
         {"index": 1, "message": {"role": "assistant", "content": "b1b2", "refusal": None},
          "logprobs": None, "finish_reason": "length"}],
        id="several choices interleaved"),
    pytest.param(
        [chat(delta(role="assistant", reasoning_content="think")), chat(delta(content="ok")),
         chat(delta(finish_reason="stop"))],
        [{"index": 0, "message": {"role": "assistant", "content": "ok", "refusal": None,
                                  "reasoning_content": "think"},
          "logprobs": None, "finish_reason": "stop"}],
        id="reasoning content kept"),
    pytest.param(
        [chat(delta(role="assistant")), chat(delta(finish_reason="length"))],
        [{"index": 0, "message": {"role": "assistant", "content": "", "refusal": None},
          "logprobs": None, "finish_reason": "length"}],
        id="nothing said"),
]


@pytest.mark.parametrize("chunks, choices", CHAT_CASES)
def test_a_chat_stream_assembles_into_the_answer_openai_sends(chunks, choices):
    answer = assemble("chat", chunks)
    assert answer["choices"] == choices
    assert {key: answer[key] for key in ("id", "object", "created", "model")} == {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1764600000, "model": "qwen"}
    json.dumps(answer)  # it is sent as JSON


def test_the_last_non_null_finish_reason_stands_and_the_fingerprint_is_kept():
    answer = assemble("chat", [chat(delta(content="x"), system_fingerprint="fp_1"),
                               chat(delta(finish_reason="stop")), chat(delta(finish_reason=None))])
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["system_fingerprint"] == "fp_1"


COMPLETION_CASES = [
    pytest.param(
        [text("Once"), text(" upon"), text("", finish_reason="length")],
        [{"index": 0, "text": "Once upon", "logprobs": None, "finish_reason": "length"}],
        id="text"),
    pytest.param(
        [text("A", logprobs={"tokens": ["A"], "token_logprobs": [-0.5], "top_logprobs": [{"A": -0.5}],
                             "text_offset": [7]}),
         text("B", logprobs={"tokens": ["B"], "token_logprobs": [-0.25], "top_logprobs": [{"B": -0.25}],
                             "text_offset": [8]}, finish_reason="stop")],
        [{"index": 0, "text": "AB", "finish_reason": "stop",
          "logprobs": {"tokens": ["A", "B"], "token_logprobs": [-0.5, -0.25],
                       "top_logprobs": [{"A": -0.5}, {"B": -0.25}], "text_offset": [7, 8]}}],
        id="logprobs concatenated"),
    pytest.param(
        [text("x", index=1), text("y", index=0), text("z", index=1, finish_reason="stop"),
         text("", index=0, finish_reason="stop")],
        [{"index": 0, "text": "y", "logprobs": None, "finish_reason": "stop"},
         {"index": 1, "text": "xz", "logprobs": None, "finish_reason": "stop"}],
        id="several choices"),
]


@pytest.mark.parametrize("chunks, choices", COMPLETION_CASES)
def test_a_completion_stream_assembles_into_a_text_completion(chunks, choices):
    answer = assemble("completion", chunks)
    assert answer["object"] == "text_completion" and answer["id"] == "cmpl-1"
    assert answer["choices"] == choices


def test_without_usage_the_content_chunks_count_as_completion_tokens():
    chunks = [chat(delta(role="assistant", content="")), chat(delta(content="a")), chat(delta(content="b")),
              chat(delta(content="c")), chat(delta(finish_reason="stop"))]
    assembler = StreamAssembler("chat")
    for chunk in chunks:
        assembler.feed(chunk)
    assert assembler.content_chunks == 3 and assembler.usage is None
    assert assembler.answer()["usage"] == {"prompt_tokens": 0, "completion_tokens": 3, "total_tokens": 3}
    assert assembler.answer(prompt_tokens=11)["usage"] == {"prompt_tokens": 11, "completion_tokens": 3,
                                                           "total_tokens": 14}
    given = make_usage(5, 2)
    assert assembler.answer(given)["usage"] == given


def test_tool_call_chunks_count_as_generated_output():
    assembler = StreamAssembler("chat")
    for chunk in CALL_PIECES:
        assembler.feed(chunk)
    assert assembler.content_chunks == 4


def test_the_engines_usage_chunk_is_used_when_no_usage_is_given():
    assembler = StreamAssembler("chat")
    for chunk in [chat(delta(content="hi")), chat(delta(finish_reason="stop")),
                  {**HEAD, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}]:
        assembler.feed(chunk)
    assert assembler.completion_tokens == 4
    assert assembler.answer()["usage"] == {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}


@pytest.mark.parametrize("odd", [
    None, "text", 3, {"choices": "x"}, {"choices": [None, 5, {"index": "0", "delta": {"content": "no"}}]},
    {"choices": [{"index": -1, "delta": {"content": "no"}}]},
    {"choices": [{"index": 0, "delta": {"content": 5, "tool_calls": [None, {"index": True}]}}]},
])
def test_odd_chunks_are_skipped_without_raising(odd):
    assembler = StreamAssembler("chat")
    assembler.feed(odd)
    assembler.feed(chat(delta(content="kept")))
    assert [c["message"]["content"] for c in assembler.answer()["choices"]] == ["kept"]


def test_an_error_event_is_kept_for_the_caller():
    assembler = StreamAssembler("chat")
    assembler.feed(chat(delta(content="a")))
    assembler.feed({"error": {"message": "boom", "type": "api_error", "param": None, "code": None}})
    assert assembler.error["message"] == "boom"


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError):
        StreamAssembler("embedding")
    with pytest.raises(ValueError):
        usage_chunk(None, make_usage(1, 1), "embedding")


def test_an_empty_stream_still_answers_openais_shape():
    answer = assemble("completion", [], prompt_tokens=3)
    assert answer["id"].startswith("cmpl-") and isinstance(answer["created"], int)
    assert answer["choices"] == [] and answer["usage"]["total_tokens"] == 3


@pytest.mark.parametrize("path, kind", [("chat/completions", "chat"), ("/v1/chat/completions", "chat"),
                                        ("completions", "completion"), ("v1/completions", "completion"),
                                        ("embeddings", None), ("chat/completions/", "chat")])
def test_kind_of_a_path(path, kind):
    assert kind_of(path) == kind


# --- n > 1 --------------------------------------------------------------------------------


def test_split_n_drops_n_and_steps_the_seed():
    body = {"model": "m", "n": 3, "seed": 40, "messages": []}
    assert split_n(body, 3) == [{"model": "m", "seed": 40, "messages": []}, {"model": "m", "seed": 41, "messages": []},
                                {"model": "m", "seed": 42, "messages": []}]
    assert body["n"] == 3 and body["seed"] == 40  # the client's body is left alone


def test_split_n_without_a_seed_sends_the_same_body():
    assert split_n({"model": "m", "n": 2, "seed": None}, 2) == [{"model": "m", "seed": None}] * 2


@pytest.mark.parametrize("n", [0, -1, True, 1.5])
def test_split_n_refuses_a_count_that_is_not_positive(n):
    with pytest.raises(ValueError):
        split_n({"model": "m"}, n)


def answer_of(content: str, prompt: int, completion: int, id_: str = "chatcmpl-a") -> dict:
    return {"id": id_, "object": "chat.completion", "created": 5, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": make_usage(prompt, completion)}


def test_merged_answers_are_reindexed_and_count_the_prompt_once():
    merged = merge_answers([answer_of("a", 10, 3), answer_of("b", 10, 4, "chatcmpl-b"), answer_of("c", 10, 5, "x")])
    assert merged["id"] == "chatcmpl-a" and merged["object"] == "chat.completion"
    assert [(c["index"], c["message"]["content"]) for c in merged["choices"]] == [(0, "a"), (1, "b"), (2, "c")]
    assert merged["usage"] == {"prompt_tokens": 10, "completion_tokens": 12, "total_tokens": 22}


def test_merged_answers_without_usage_have_none():
    one = answer_of("a", 1, 1)
    del one["usage"]
    assert "usage" not in merge_answers([one, dict(one)])
    with pytest.raises(ValueError):
        merge_answers([])


def test_merge_usage_skips_what_is_missing():
    assert merge_usage([None, make_usage(7, 2), {"completion_tokens": "x"}]) == make_usage(7, 2)
    assert merge_usage([None]) is None


def test_reindex_chunk_sets_every_choice_index_and_leaves_the_input():
    chunk = chat(delta(0, content="a"))
    again = reindex_chunk(chunk, 2)
    assert again["choices"][0]["index"] == 2 and chunk["choices"][0]["index"] == 0
    assert reindex_chunk({**HEAD, "choices": [], "usage": {}}, 3)["choices"] == []


# --- merge_streams ---------------------------------------------------------------------------


class Stream:
    """An async iterator of chunks that records whether it was closed, optionally waiting on
    an event between chunks or failing after them."""

    def __init__(self, chunks: list[dict], gate: asyncio.Event | None = None, fail: Exception | None = None,
                 endless: bool = False) -> None:
        self.chunks, self.gate, self.fail, self.endless = chunks, gate, fail, endless
        self.closed = False
        self.sent = 0
        self._gen = self._run()

    async def _run(self):
        try:
            for chunk in self.chunks:
                if self.gate is not None:
                    await self.gate.wait()
                self.sent += 1
                yield chunk
            if self.fail is not None:
                raise self.fail
            while self.endless:
                await asyncio.sleep(3600)
        finally:
            self.closed = True

    def __aiter__(self):
        return self

    def __anext__(self):
        return self._gen.__anext__()

    async def aclose(self):
        await self._gen.aclose()


def stream_of(id_: str, *pieces: str, usage: dict | None = None) -> list[dict]:
    head = {"id": id_, "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [{**head, "choices": [delta(role="assistant", content="")]}]
    chunks += [{**head, "choices": [delta(content=piece)]} for piece in pieces]
    chunks.append({**head, "choices": [delta(finish_reason="stop")]})
    if usage is not None:
        chunks.append({**head, "choices": [], "usage": usage})
    return chunks


async def collect(merged) -> list[dict]:
    return [chunk async for chunk in merged]


async def test_merged_streams_reindex_each_stream_and_combine_usage():
    a = Stream(stream_of("chatcmpl-a", "x", "y", usage=make_usage(6, 2)))
    b = Stream(stream_of("chatcmpl-b", "z", usage=make_usage(6, 1)))
    chunks = await asyncio.wait_for(collect(merge_streams([a, b])), 30)
    assert {chunk["id"] for chunk in chunks} == {chunks[0]["id"]}  # one completion to the client
    assembler = StreamAssembler("chat")
    for chunk in chunks:
        assembler.feed(chunk)
    answer = assembler.answer()
    assert [(c["index"], c["message"]["content"]) for c in answer["choices"]] == [(0, "xy"), (1, "z")]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == make_usage(6, 3)
    assert sum(1 for chunk in chunks if "usage" in chunk) == 1
    assert a.closed and b.closed


async def test_merged_streams_without_usage_add_no_usage_chunk():
    streams = [Stream(stream_of("a", "1")), Stream(stream_of("b", "2"))]
    chunks = await asyncio.wait_for(collect(merge_streams(streams)), 30)
    assert all("usage" not in chunk for chunk in chunks) and len(chunks) == 6


async def test_chunks_are_yielded_as_they_come_not_stream_after_stream():
    gate = asyncio.Event()
    slow = Stream(stream_of("slow", "late"), gate=gate)
    fast = Stream(stream_of("fast", "early"))
    merged = merge_streams([slow, fast])
    first = [await asyncio.wait_for(merged.__anext__(), 30) for _ in range(3)]
    assert [chunk["choices"][0]["index"] for chunk in first] == [1, 1, 1]  # all of the fast one, first
    gate.set()
    rest = await asyncio.wait_for(collect(merged), 30)
    assert {chunk["choices"][0]["index"] for chunk in rest} == {0}


async def test_an_error_in_one_stream_cancels_and_closes_the_others():
    hanging = Stream(stream_of("a", "1"), endless=True)
    failing = Stream(stream_of("b", "2"), fail=ConnectionResetError("engine went away"))
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(collect(merge_streams([hanging, failing])), 30)
    assert hanging.closed and failing.closed


async def test_a_consumer_that_stops_early_closes_every_stream():
    streams = [Stream(stream_of(f"s{i}", "a", "b"), endless=True) for i in range(3)]
    merged = merge_streams(streams)
    await asyncio.wait_for(merged.__anext__(), 30)
    await asyncio.wait_for(merged.aclose(), 30)
    assert all(stream.closed for stream in streams)


async def test_a_cancelled_consumer_closes_every_stream():
    streams = [Stream(stream_of(f"s{i}"), endless=True) for i in range(2)]

    async def consume():
        async for _ in merge_streams(streams):
            pass

    task = asyncio.ensure_future(consume())
    for _ in range(200):  # until both have sent everything they had
        if all(stream.sent == len(stream.chunks) for stream in streams):
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    assert all(stream.closed for stream in streams)


# --- stream_chunks ----------------------------------------------------------------------------


async def byte_source(*pieces: bytes):
    for piece in pieces:
        yield piece


async def test_stream_chunks_parse_events_split_anywhere_and_stop_at_done():
    events = [b"data: " + json.dumps(c, ensure_ascii=False).encode() + b"\n\n" for c in stream_of("a", "hé")]
    body = b": keep-alive\n\n" + b"".join(events) + DONE_EVENT + b'data: {"after": 1}\n\n'
    # 7-byte pieces cut the two-byte "é" too.
    pieces = [body[i:i + 7] for i in range(0, len(body), 7)]
    chunks = [chunk async for chunk in stream_chunks(byte_source(*pieces))]
    assert chunks == stream_of("a", "hé")


async def test_stream_chunks_refuse_an_event_over_the_limit():
    with pytest.raises(EventTooLarge):
        async for _ in stream_chunks(byte_source(b"data: " + b"x" * 100), max_event_bytes=50):
            pass


# --- usage_chunk and the prompt --------------------------------------------------------------


def test_the_usage_chunk_is_one_sse_event_in_openais_shape():
    last = {**HEAD, "system_fingerprint": "fp_9", "choices": [delta(finish_reason="stop")]}
    event = usage_chunk(last, {"prompt_tokens": 12, "completion_tokens": 5}, "chat")
    events, rest = sse.split_events(event)
    assert events == [event] and rest == b""
    data = sse.event_json(event)
    assert data == {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1764600000, "model": "qwen",
                    "system_fingerprint": "fp_9", "choices": [],
                    "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}}
    assert sse.is_usage_only(data)


def test_the_usage_chunk_without_a_last_chunk_names_the_model():
    data = sse.event_json(usage_chunk(None, {"prompt_tokens": -3, "completion_tokens": 2}, "completion", model="m"))
    assert data["object"] == "text_completion" and data["id"].startswith("cmpl-") and data["model"] == "m"
    assert data["usage"] == {"prompt_tokens": 0, "completion_tokens": 2, "total_tokens": 2}


PROMPTS = [
    ("completions", {"prompt": "Say hi"}, "Say hi", None),
    ("completions", {"prompt": ["one", "two"]}, "one\ntwo", None),
    ("completions", {"prompt": [1, 2, 3]}, "", 3),
    ("completions", {"prompt": [[1, 2], [3]]}, "", 3),
    ("completions", {}, "", None),
    ("chat/completions", {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "image_url", "image_url": {}},
                                     {"type": "text", "text": "this?"}]},
        {"role": "assistant", "content": None, "tool_calls": []}, "odd"]},
     "Be brief.\nWhat is\nthis?", None),
    ("chat/completions", {"messages": "x"}, "", None),
    ("embeddings", {"input": "x"}, "", None),
]


@pytest.mark.parametrize("path, body, text_, token_ids", PROMPTS)
def test_the_prompt_to_count(path, body, text_, token_ids):
    assert prompt_text(path, body) == text_
    assert prompt_token_ids_count(path, body) == token_ids


async def test_no_streams_merge_into_an_empty_stream():
    assert await asyncio.wait_for(collect(merge_streams([])), 30) == []


def test_split_events_cuts_where_a_blank_line_ends_an_event_with_or_without_carriage_returns():
    """The fast path (no ``\\r``) cuts exactly where the SSE rule does: every buffer of up to
    seven of ``a``, ``\\n``, ``\\r``, against the regular expression of all three line ends."""
    import itertools
    import re

    from gateway import sse

    boundary = re.compile(rb"\r\n\r\n|\n\n|\r\r")

    def by_rule(buffer: bytes) -> tuple[list[bytes], bytes]:
        events, start = [], 0
        for match in boundary.finditer(buffer):
            events.append(buffer[start:match.end()])
            start = match.end()
        return events, buffer[start:]

    for size in range(8):
        for pieces in itertools.product([b"a", b"\n", b"\r"], repeat=size):
            buffer = b"".join(pieces)
            assert sse.split_events(buffer) == by_rule(buffer), buffer
    assert sse.split_events(b"data: 1\n\ndata: 2\n\ndata: [DO") == ([b"data: 1\n\n", b"data: 2\n\n"], b"data: [DO")
