"""Calls to replicas: one upstream request (retried once on another replica when refused),
or several streams that the gateway composes into the one answer the client asked for
(docs/architecture.md, "Gateway rules": engines).

An engine does not always do what OpenAI does with a request, so the gateway does it
instead (:func:`compose`), from the engine's streams (``gateway.assembly``):

* **n > 1** on an engine that ignores ``n`` (llama.cpp's servers): n requests with
  ``n`` = 1, spread over the model's replicas (least loaded first), their choices merged
  as choices 0..n-1, the prompt's tokens counted once;
* **a non-streamed request** to an engine that cannot cancel one (llama-cpp-python
  generates to the end after its client left): asked for as a stream and assembled here,
  so that closing the stream stops the engine when the client hangs up;
* **the usage chunk** a streamed request asked for (``stream_options.include_usage``) from
  an engine that sends none: completion tokens counted from the chunks, prompt tokens from
  the engine's tokenizer endpoint where it has one (``gateway.tokenize``), else 0.

Every leg counts as a request in flight on its replica until its stream ends; when the
client hangs up, every leg's upstream connection is closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

import aiohttp
from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse

from fleet import live
from fleet.live import Endpoint
from gateway import assembly, sse
from gateway.bodies import developer_as_system, requested_tokens, system_into_first_user
from gateway.errors import openai_error
from gateway.exchange import Exchange
from gateway.relay import contained_error_event, engine_error_response, relay
from gateway.routing import choose
from gateway.upstream import (Refused, copy_headers, open_upstream, read_bounded, timeout_words, upstream_url,
                              what_broke)
from gateway.validation import without_empty_stops

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outgoing:
    """What goes upstream for one request: the endpoint (``chat/completions``), the client's
    query string as sent, the body's bytes, the headers, and whether the gateway asked for
    the stream's usage chunk itself (then it is dropped again before the client sees it)."""

    path: str
    query: bytes
    content: bytes
    headers: dict[str, str]
    strip_usage: bool


async def open_on_replica(model, out: Outgoing, endpoint: Endpoint,
                          ex: Exchange) -> tuple[aiohttp.ClientResponse, Endpoint] | HttpResponse:
    """``out`` sent to ``endpoint`` (a ready replica of ``model``): the upstream response
    (headers read) and the replica that gave it, counted in flight there until the caller
    ends it (``live.end_request``); or the error answer (502 unreachable or failed, 504
    timeout; naming the model and the agent, never an address: :func:`unreachable_message`),
    already counted out. A connection refused before any byte is retried once on
    another ready replica; nothing else is sent twice (the engine may have read it). Raises
    CancelledError when the client leaves meanwhile."""
    tried: set[int] = set()
    refusals: list[tuple[str, str]] = []  # (agent, why) of each replica that took no connection
    while True:
        tried.add(endpoint.replica_id)
        if not ex.take_count(endpoint.replica_id):
            live.begin_request(endpoint.replica_id)
        ex.replica_id = endpoint.replica_id
        try:
            # The replica's engine key, never the client's credentials (docs/architecture.md,
            # "Gateway rules": external models; "Security": engine keys).
            headers = {**out.headers, "authorization": f"Bearer {endpoint.key}"} if endpoint.key else out.headers
            upstream = await open_upstream(upstream_url(f"{endpoint.url}/v1/{out.path}", out.query), out.content,
                                           headers)
            return upstream, endpoint
        except asyncio.CancelledError:
            # The client went away before the engine's headers (a non-streamed answer sends
            # them only when done): count the request out, or the replica never looks idle.
            live.end_request(endpoint.replica_id)
            raise
        except Refused as exc:
            live.end_request(endpoint.replica_id)
            live.refused(endpoint.replica_id)  # nothing listens there now: not routed for a moment
            log.warning("replica %s of %s on %s took no connection: %s", endpoint.replica_id, model.name,
                        endpoint.agent_name, exc)
            refusals.append((endpoint.agent_name, exc.reason))
            other = choose(live.current_view().routes.get(model.id, ()), exclude=tried,
                           policy=model.routing_policy, keys=ex.route_keys, model_name=model.name)
            if other is None or len(tried) >= 2:
                return openai_error(502, unreachable_message(model.name, refusals), code="upstream_unreachable")
            endpoint = other
        except asyncio.TimeoutError as exc:
            live.end_request(endpoint.replica_id)
            log.warning("replica %s of %s on %s: %s", endpoint.replica_id, model.name, endpoint.agent_name,
                        exc or type(exc).__name__)
            return openai_error(504, f"The replica of '{model.name}' on {endpoint.agent_name} {timeout_words(exc)}.",
                                code="upstream_timeout")
        except aiohttp.ClientError as exc:
            live.end_request(endpoint.replica_id)
            log.warning("replica %s of %s on %s failed: %s", endpoint.replica_id, model.name, endpoint.agent_name,
                        exc or type(exc).__name__)
            return openai_error(502, f"The replica of '{model.name}' on {endpoint.agent_name} failed: "
                                     f"{what_broke(exc)}.", code="upstream_error")


def unreachable_message(model_name: str, refusals: list[tuple[str, str]]) -> str:
    """The client's words for replicas that took no connection: ``refusals`` holds
    ``(agent name, why)`` per replica tried, in order (:func:`gateway.upstream.connect_failure`).
    One: "The replica of 'm' on gpu-1 did not answer: connection refused." Several: "The
    replicas of 'm' on gpu-1 and gpu-2 did not answer: connection refused." (each agent's
    reason when they differ). No address or port: those are in the log."""
    if len(refusals) == 1:
        agent, why = refusals[0]
        return f"The replica of '{model_name}' on {agent} did not answer: {why}."
    agents = list(dict.fromkeys(agent for agent, _ in refusals))
    reasons = list(dict.fromkeys(why for _, why in refusals))
    where = agents[0] if len(agents) == 1 else ", ".join(agents[:-1]) + f" and {agents[-1]}"
    if len(reasons) == 1:
        return f"The replicas of '{model_name}' on {where} did not answer: {reasons[0]}."
    return (f"The replicas of '{model_name}' on {where} did not answer: "
            + "; ".join(f"{agent}: {why}" for agent, why in refusals) + ".")


def _replica_headers(endpoint: Endpoint, ex: Exchange) -> dict[str, str]:
    return {"X-Llmgw-Replica": f"{endpoint.replica_id}@{endpoint.agent_name}",
            "X-Llmgw-Overhead-Ms": f"{ex.overhead_s * 1000:.2f}"}


async def forward(model, out: Outgoing, endpoint: Endpoint, ex: Exchange, body: dict,
                  add_usage: bool = False) -> HttpResponse:
    """``out`` sent to ``endpoint`` and the answer relayed as the engine gives it
    (``gateway.relay``). ``add_usage``: the client asked for the usage chunk; one is added
    if the engine's stream has none. A stream that ends before its first event is answered
    by :func:`probe` (``body`` is the client's)."""
    ex.note_overhead()  # our own work before the upstream call
    try:
        opened = await open_on_replica(model, out, endpoint, ex)
    except asyncio.CancelledError:
        ex.finish(ex.gone_status())
        raise
    if isinstance(opened, HttpResponse):
        return ex.answer(opened)
    upstream, endpoint = opened
    ex.replica_id = endpoint.replica_id

    async def on_empty() -> HttpResponse:
        return await probe(model, out.path, body, out.query, out.headers, endpoint, ex)

    return await relay(upstream, ex, endpoint.replica_id, out.strip_usage, _replica_headers(endpoint, ex),
                       add_usage=add_usage, on_empty=on_empty)


async def probe(model, path: str, body: dict, query: bytes, headers: dict[str, str], endpoint: Endpoint,
                ex: Exchange) -> HttpResponse:
    """Why an engine ended a stream before its first event (llama-cpp-python raises inside
    a stream that has started, e.g. for a prompt over its context): the request asked again
    without a stream (and one choice of the prompt), so the engine's own error comes back, mapped
    (``gateway.relay``); 502 ``engine_error`` if it then answers."""
    asked = {k: v for k, v in body.items() if k not in ("n", "stream", "stream_options")}
    asked["max_tokens"] = requested_tokens(body, None) or 1  # as asked: an error then names it
    if isinstance(asked.get("prompt"), list) and asked["prompt"] and isinstance(asked["prompt"][0], str):
        asked["prompt"] = asked["prompt"][0]
    opened = await open_on_replica(model, Outgoing(path, query, json.dumps(asked).encode(), headers, False),
                                   endpoint, ex)
    if isinstance(opened, HttpResponse):
        return ex.answer(opened)
    upstream, endpoint = opened
    if upstream.status >= 400:
        return await relay(upstream, ex, endpoint.replica_id, False, _replica_headers(endpoint, ex))
    upstream.close()
    live.end_request(endpoint.replica_id)
    return ex.answer(openai_error(502, f"The engine serving '{model.name}' ended its stream without an answer.",
                                  code="engine_error"))


@dataclass(frozen=True)
class Composition:
    """How :func:`compose` builds one answer: ``n`` choices per prompt from as many upstream
    streams, for each of ``prompts`` (None: the body's own prompt or messages, once);
    ``client_stream`` whether the client gets a stream (else one JSON answer);
    ``include_usage`` whether the client's stream asked for the usage chunk;
    ``prompt_tokens`` the prompt's count where the gateway has it (the engine's tokenizer),
    ``echo`` the prompt put before each completion (an engine that drops ``echo`` in
    streams), ``developer_as_system`` (an engine that does not know that role)."""

    n: int
    client_stream: bool
    include_usage: bool
    prompts: tuple[str, ...] | None = None
    prompt_tokens: int | None = None
    echo: bool = False
    developer_as_system: bool = False
    #: The request used the legacy ``functions`` (not ``tools``): the answer's call is a
    #: ``function_call`` with ``finish_reason`` "function_call", as OpenAI answers it.
    legacy_functions: bool = False
    #: System messages folded into the first user turn (an engine whose chat template drops
    #: them: ``gateway.bodies.system_into_first_user``).
    system_into_user: bool = False

    @property
    def legs(self) -> int:
        return self.n * (len(self.prompts) if self.prompts else 1)


def leg_bodies(body: dict, how: Composition, max_tokens: int | None) -> list[bytes]:
    """The bodies of a composition's upstream streams, in choice order (prompt i's choice j
    is choice ``i * n + j``, as OpenAI orders them): ``n`` = 1 each (the seed stepped,
    :func:`gateway.assembly.split_n`), a stream asking for usage, ``max_tokens`` set when
    given (``gateway.bodies.token_bound``)."""
    body = without_empty_stops(body)
    bodies = []
    for prompt in how.prompts or (None,):
        one = dict(body) if prompt is None else {**body, "prompt": prompt}
        bodies += assembly.split_n(one, how.n) if how.n > 1 else [one]
    encoded = []
    for leg in bodies:
        leg.pop("n", None)
        if how.echo:
            leg.pop("echo", None)  # put back by the gateway
        leg["stream"] = True
        options = leg.get("stream_options") if isinstance(leg.get("stream_options"), dict) else {}
        leg["stream_options"] = {**options, "include_usage": True}
        if max_tokens is not None:
            leg["max_tokens"] = max_tokens
        if how.developer_as_system and (messages := developer_as_system(leg.get("messages"))):
            leg["messages"] = messages
        if how.system_into_user and (messages := system_into_first_user(leg.get("messages"))):
            leg["messages"] = messages
        encoded.append(json.dumps(leg).encode())
    return encoded


class StreamEnded(Exception):
    """An upstream stream ended without its ``[DONE]``: before any event (``empty``: the
    engine failed to start the answer) or in the middle of it."""

    def __init__(self, empty: bool) -> None:
        super().__init__("the engine's stream ended before any event" if empty else
                         "the engine's stream ended before [DONE]")
        self.empty = empty


async def _leg_chunks(upstream: aiohttp.ClientResponse, replica_id: int, ex: Exchange):
    """One leg's chunks (parsed JSON) until its ``[DONE]`` (:class:`StreamEnded` if none
    comes); the upstream released when whole, closed otherwise (the engine sees the request
    end), and counted out of its replica."""
    whole = False
    limit = settings.LLMGW_MAX_UPSTREAM_BODY_BYTES
    try:
        buffer, events_seen = b"", 0
        async for piece in upstream.content.iter_any():
            buffer += piece
            events, buffer = sse.split_events(buffer)
            if len(buffer) > limit:
                raise assembly.EventTooLarge(f"an event is over {limit} bytes")
            for event in events:
                if (b"[DONE]" in event or b"event:" in event) and sse.is_done(event):
                    whole = True
                    return
                data = sse.event_json(event)
                if data is not None:
                    events_seen += 1
                    if ex.ttft_s is None:
                        ex.ttft_s = time.monotonic() - ex.started
                    yield data
        raise StreamEnded(empty=events_seen == 0)
    finally:
        if whole:
            upstream.release()
        else:
            upstream.close()
        live.end_request(replica_id)


_BROKEN = (aiohttp.ClientError, asyncio.TimeoutError, assembly.EventTooLarge, StreamEnded)


class LegFailed(Exception):
    """A leg of a composition could not be served: ``answer`` is the client's (the engine's
    error mapped, or the gateway's 502/504)."""

    def __init__(self, answer: HttpResponse) -> None:
        super().__init__(answer.status_code)
        self.answer = answer


async def _leg(model, out: Outgoing, pick, ex: Exchange, opened: dict, index: int):
    """One leg: sent to the replica ``pick()`` chooses when the leg starts (earlier legs are
    in flight by then, so legs spread over replicas), its chunks until ``[DONE]``. Each leg
    is read as soon as it answers, whatever the others do: an engine that serves one request
    at a time must be able to finish one leg while the next waits, or neither would end.
    Raises :class:`LegFailed` for an error answer, :class:`StreamEnded` for a broken stream.
    ``opened[index]`` gets its ``(upstream, endpoint)``."""
    answered = await open_on_replica(model, out, pick(), ex)
    if isinstance(answered, HttpResponse):
        raise LegFailed(answered)
    upstream, endpoint = answered
    opened[index] = answered
    content_type = upstream.headers.get("content-type", "")
    if upstream.status >= 400 or "text/event-stream" not in content_type:
        try:
            raw = await read_bounded(upstream)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            raw = b""
        finally:
            upstream.close()
            live.end_request(endpoint.replica_id)
        if upstream.status >= 400:
            raise LegFailed(engine_error_response(upstream.status, content_type, raw, ex))
        raise LegFailed(openai_error(502, f"The engine serving '{model.name}' answered a stream request without a "
                                          "stream.", code="engine_error"))
    async for data in _leg_chunks(upstream, endpoint.replica_id, ex):
        yield data


async def compose(model, path: str, body: dict, query: bytes, headers: dict[str, str], endpoint: Endpoint,
                  ex: Exchange, how: Composition, max_tokens: int | None) -> HttpResponse:
    """One answer for ``body`` built from ``how.legs`` upstream streams (see the module
    docstring), the first on ``endpoint``, the others where the model's routing policy sends them,
    all read at once. An upstream that answers an error is answered as any engine error
    (mapped), one that ends before its first event is asked why (:func:`probe`); the other
    legs are closed."""
    kind = assembly.kind_of(path)
    ex.note_overhead()
    opened: dict[int, tuple[aiohttp.ClientResponse, Endpoint]] = {}

    def pick(i: int):
        return lambda: endpoint if i == 0 else (choose(live.current_view().routes.get(model.id, ()),
                                                       policy=model.routing_policy, keys=ex.route_keys,
                                                       model_name=model.name) or endpoint)

    streams = [_leg(model, Outgoing(path, query, content, headers, False), pick(i), ex, opened, i)
               for i, content in enumerate(leg_bodies(body, how, max_tokens))]
    merged = assembly.merge_streams(streams)

    def extra_of() -> dict[str, str]:  # the first leg's replica that answered
        return _replica_headers(opened[min(opened)][1] if opened else endpoint, ex)
    try:
        head = await merged.__anext__()  # the answer's status is known once it has begun
    except StopAsyncIteration:
        head = None
    except asyncio.CancelledError:
        await merged.aclose()
        ex.finish(ex.gone_status())
        raise
    except LegFailed as failed:
        await merged.aclose()
        return _with_headers(ex.answer(failed.answer), extra_of())
    except _BROKEN as exc:
        await merged.aclose()
        if isinstance(exc, StreamEnded) and exc.empty:
            return await probe(model, path, body, query, headers, opened[min(opened)][1] if opened else endpoint, ex)
        log.warning("upstream stream broke: %s", exc or type(exc).__name__)
        return _with_headers(ex.answer(openai_error(502, f"The engine's answer broke off: {what_broke(exc)}.",
                                                    code="upstream_error")), extra_of())
    first, first_endpoint = opened[min(opened)]
    ex.replica_id = first_endpoint.replica_id
    ex.upstream_status = first.status
    extra = _replica_headers(first_endpoint, ex)
    if how.client_stream:
        response = _streamed(head, merged, ex, kind, how)
    else:
        response = await _assembled(head, merged, ex, kind, how)
    if response.status_code == 200:
        copy_headers(first, response, extra)
        if "openai-processing-ms" in response:  # the first leg's, not the answer's
            del response["openai-processing-ms"]
        return response
    return _with_headers(response, extra)


def _with_headers(response: HttpResponse, headers: dict[str, str]) -> HttpResponse:
    for name, value in headers.items():
        response[name] = value
    return response


def _produces(data: dict) -> bool:
    """A chunk that carries generated output: text, content, or a piece of a tool call."""
    if sse.has_content(data):
        return True
    return any(isinstance(c, dict) and isinstance(c.get("delta"), dict)
               and (c["delta"].get("tool_calls") or c["delta"].get("function_call"))
               for c in data.get("choices") or ())


def _tidy_tool_calls(data: dict, seen: set[tuple[int, int]], legacy: bool = False) -> dict:
    """``data`` with a tool call's ``id``, ``type`` and function ``name`` only in its first
    delta, as OpenAI streams them: llama-cpp-python repeats them in every delta, and the
    SDK's stream helpers concatenate what comes ("get_weatherget_weather…"). ``seen``
    holds the (choice index, tool call index) pairs already begun. ``legacy``: the request
    used ``functions``, so the call goes as ``function_call`` deltas instead."""
    if legacy:
        return _as_function_call(data, seen)
    choices = data.get("choices")
    if not isinstance(choices, list) or not any(
            isinstance(c, dict) and isinstance(c.get("delta"), dict) and c["delta"].get("tool_calls") for c in choices):
        return data
    tidied = []
    for choice in choices:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        calls = delta.get("tool_calls") if isinstance(delta, dict) else None
        if not isinstance(calls, list):
            tidied.append(choice)
            continue
        new_calls = []
        for call in calls:
            if not isinstance(call, dict):
                new_calls.append(call)
                continue
            key = (choice.get("index", 0), call.get("index", 0))
            if key in seen:
                call = {k: v for k, v in call.items() if k not in ("id", "type")}
                if isinstance(call.get("function"), dict):
                    call["function"] = {k: v for k, v in call["function"].items() if k != "name"}
            else:
                seen.add(key)
            new_calls.append(call)
        # The legacy function_call beside tool_calls (llama-cpp-python sends both): OpenAI never does.
        tidied.append({**choice, "delta": {**{k: v for k, v in delta.items() if k != "function_call"},
                                           "tool_calls": new_calls}})
    return {**data, "choices": tidied}


def _as_function_call(data: dict, seen: set[tuple[int, int]]) -> dict:
    """A chunk of a legacy ``functions`` request as OpenAI streams it: ``function_call``
    deltas (the name in the first only), no ``tool_calls``, ``finish_reason``
    "function_call"."""
    choices = data.get("choices")
    if not isinstance(choices, list):
        return data
    tidied = []
    for choice in choices:
        if not isinstance(choice, dict):
            tidied.append(choice)
            continue
        choice = dict(choice)
        if choice.get("finish_reason") == "tool_calls":
            choice["finish_reason"] = "function_call"
        delta = choice.get("delta")
        if isinstance(delta, dict) and (delta.get("tool_calls") or delta.get("function_call")):
            call = delta.get("function_call")
            if not isinstance(call, dict):
                first = delta["tool_calls"][0] if isinstance(delta.get("tool_calls"), list) else None
                call = first.get("function") if isinstance(first, dict) else None
            delta = {k: v for k, v in delta.items() if k not in ("tool_calls", "function_call")}
            if isinstance(call, dict):
                key = (choice.get("index", 0), -1)
                if key in seen:
                    call = {k: v for k, v in call.items() if k != "name"}
                seen.add(key)
                delta["function_call"] = call
            choice["delta"] = delta
        tidied.append(choice)
    return {**data, "choices": tidied}


def _legacy_answer(answer: dict) -> dict:
    """An assembled answer to a legacy ``functions`` request: the call as ``function_call``."""
    for choice in answer.get("choices") or ():
        message = choice.get("message") or {}
        calls = message.pop("tool_calls", None)
        if calls and not message.get("function_call"):
            message["function_call"] = calls[0].get("function")
        if choice.get("finish_reason") == "tool_calls":
            choice["finish_reason"] = "function_call"
    return answer


def _usage_of(data: dict) -> dict | None:
    return data["usage"] if not data.get("choices") and isinstance(data.get("usage"), dict) else None


async def _assembled(head: dict | None, merged, ex: Exchange, kind: str, how: Composition) -> HttpResponse:
    assembler = assembly.StreamAssembler(kind)
    try:
        if head is not None:
            assembler.feed(head)
        async for data in merged:
            assembler.feed(data)
    except asyncio.CancelledError:
        ex.completion_tokens = assembler.content_chunks  # what the engine made before the client left
        ex.finish(ex.gone_status())  # every leg's upstream is closed
        raise
    except LegFailed as failed:
        return ex.answer(failed.answer)
    except _BROKEN as exc:
        log.warning("upstream stream broke: %s", exc or type(exc).__name__)
        return ex.answer(openai_error(502, f"The engine's answer broke off: {what_broke(exc)}.",
                                      code="upstream_error"))
    finally:
        await merged.aclose()
    if assembler.error is not None:
        return ex.answer(engine_error_response(500, "application/json",
                                               json.dumps({"error": assembler.error}).encode(), ex))
    usage = None
    if assembler.usage is None:
        usage = assembly.make_usage(how.prompt_tokens or 0, assembler.content_chunks)
    answer = assembler.answer(usage)
    if how.legacy_functions:
        answer = _legacy_answer(answer)
    if how.echo and kind == "completion":
        prompts = how.prompts or ()
        for choice in answer["choices"]:
            index = choice["index"] // how.n
            if index < len(prompts):
                choice["text"] = prompts[index] + choice["text"]
    ex.note_usage(answer)
    return ex.answer(HttpResponse(json.dumps(answer), content_type="application/json"))


def _streamed(head: dict | None, merged, ex: Exchange, kind: str, how: Composition) -> StreamingHttpResponse:

    async def chunks():
        if head is not None:
            yield head
        async for data in merged:
            yield data

    async def events():
        status = 200
        last: dict | None = None
        usage: dict | None = None
        done = False
        try:
            seen_calls: set[tuple[int, int]] = set()
            async for data in chunks():
                if (found := _usage_of(data)) is not None:
                    usage = found
                    continue
                if "error" in data and not data.get("choices"):
                    # The engine failed in the middle: its error, on one line, ends the stream.
                    status = 502
                    yield contained_error_event(assembly.encode_event({"error": data["error"]}), ex)
                    return
                data = _tidy_tool_calls(data, seen_calls, how.legacy_functions)
                last = data
                if _produces(data):
                    ex.content_chunks += 1
                yield assembly.encode_event(data)
            if usage is None:
                usage = assembly.make_usage(how.prompt_tokens or 0, ex.content_chunks)
            ex.note_usage({"usage": usage})
            if how.include_usage:
                yield assembly.usage_chunk(last, usage, kind, model=ex.model_label)
            done = True
            yield assembly.DONE_EVENT
        except LegFailed as failed:  # another leg's engine refused after this stream began
            status = failed.answer.status_code
            yield contained_error_event(b"data: " + failed.answer.content + b"\n\n", ex)
        except _BROKEN as exc:
            log.warning("upstream stream broke: %s", exc or type(exc).__name__)
            status = 502
            error = {"error": {"message": f"The engine's stream broke off: {what_broke(exc)}.",
                               "type": "api_error", "param": None, "code": "upstream_stream_broken"}}
            yield assembly.encode_event(error)
        except (asyncio.CancelledError, GeneratorExit):
            if not done:
                status = ex.gone_status()
            raise
        finally:
            await merged.aclose()
            if ex.completion_tokens is None:
                ex.completion_tokens = ex.content_chunks
            ex.finish(status)

    response = StreamingHttpResponse(events(), status=200, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
