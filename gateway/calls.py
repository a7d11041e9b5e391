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
from gateway import assembly, metrics, sse
from gateway.errors import openai_error
from gateway.exchange import Exchange
from gateway.relay import contained_error_event, engine_error_response, relay
from gateway.routing import choose
from gateway.tokenize import count_tokens
from gateway.upstream import Refused, copy_headers, open_upstream, upstream_client, upstream_url

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
    timeout), already counted out. A connection refused before any byte is retried once on
    another ready replica. Raises CancelledError when the client leaves meanwhile."""
    tried: set[int] = set()
    while True:
        tried.add(endpoint.replica_id)
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
            log.warning("replica %s refused the connection: %s", endpoint.replica_id, exc)
            other = choose(live.current_view().routes.get(model.id, ()), exclude=tried)
            if other is None or len(tried) >= 2:
                return openai_error(502, f"The replica serving '{model.name}' is not reachable.",
                                    code="upstream_unreachable")
            endpoint = other
        except asyncio.TimeoutError:
            live.end_request(endpoint.replica_id)
            return openai_error(504, f"The replica serving '{model.name}' did not answer in time.",
                                code="upstream_timeout")
        except aiohttp.ClientError as exc:
            live.end_request(endpoint.replica_id)
            log.warning("replica %s failed: %s", endpoint.replica_id, exc or type(exc).__name__)
            return openai_error(502, f"The replica serving '{model.name}' failed ({type(exc).__name__}).",
                                code="upstream_error")


def _replica_headers(endpoint: Endpoint, ex: Exchange) -> dict[str, str]:
    return {"X-Llmgw-Replica": f"{endpoint.replica_id}@{endpoint.agent_name}",
            "X-Llmgw-Overhead-Ms": f"{ex.overhead_s * 1000:.2f}"}


async def forward(model, out: Outgoing, endpoint: Endpoint, ex: Exchange, add_usage: bool = False) -> HttpResponse:
    """``out`` sent to ``endpoint`` and the answer relayed as the engine gives it
    (``gateway.relay``). ``add_usage``: the client asked for the usage chunk; one is added
    if the engine's stream has none."""
    ex.overhead_s = time.monotonic() - ex.started  # our own work before the upstream call
    try:
        opened = await open_on_replica(model, out, endpoint, ex)
    except asyncio.CancelledError:
        ex.finish(499)
        raise
    if isinstance(opened, HttpResponse):
        return ex.answer(opened)
    upstream, endpoint = opened
    ex.replica_id = endpoint.replica_id
    return await relay(upstream, ex, endpoint.replica_id, out.strip_usage, _replica_headers(endpoint, ex),
                       add_usage=add_usage)


@dataclass(frozen=True)
class Composition:
    """How :func:`compose` builds one answer: ``legs`` upstream streams (n for a fan-out, else
    1); ``client_stream`` whether the client gets a stream (else one JSON answer);
    ``include_usage`` whether the client's stream asked for the usage chunk; the engine's
    tokenizer path (None: prompt tokens are 0 unless the engine counts them) and kind."""

    legs: int
    client_stream: bool
    include_usage: bool
    tokenize_path: str | None = None
    engine: str | None = None


def leg_bodies(body: dict, legs: int, max_tokens: int | None) -> list[bytes]:
    """The bodies of a composition's upstream streams: ``body`` split into ``legs`` requests
    with ``n`` = 1 (:func:`gateway.assembly.split_n`) when ``legs`` > 1, each a stream asking
    for usage, with ``max_tokens`` set when given (``gateway.bodies.token_bound``)."""
    bodies = assembly.split_n(body, legs) if legs > 1 else [dict(body)]
    encoded = []
    for leg in bodies:
        leg.pop("n", None)
        leg["stream"] = True
        options = leg.get("stream_options") if isinstance(leg.get("stream_options"), dict) else {}
        leg["stream_options"] = {**options, "include_usage": True}
        if max_tokens is not None:
            leg["max_tokens"] = max_tokens
        encoded.append(json.dumps(leg).encode())
    return encoded


async def _leg_chunks(upstream: aiohttp.ClientResponse, replica_id: int, ex: Exchange):
    """One leg's chunks (parsed JSON) until its ``[DONE]``; the upstream released when whole,
    closed otherwise (the engine sees the request end), and counted out of its replica."""
    whole = False
    try:
        async for data in assembly.stream_chunks(upstream.content.iter_any(), settings.LLMGW_MAX_UPSTREAM_BODY_BYTES):
            if ex.ttft_s is None:
                ex.ttft_s = time.monotonic() - ex.started
            yield data
        whole = True
    finally:
        if whole:
            upstream.release()
        else:
            upstream.close()
        live.end_request(replica_id)


async def compose(model, path: str, body: dict, query: bytes, headers: dict[str, str], endpoint: Endpoint,
                  ex: Exchange, how: Composition, max_tokens: int | None) -> HttpResponse:
    """One answer for ``body`` built from ``how.legs`` upstream streams (see the module
    docstring), the first on ``endpoint``, the others on the model's least-loaded replicas.
    An upstream that answers an error first is relayed as any engine error (mapped); the
    other legs are closed."""
    kind = assembly.kind_of(path)
    ex.overhead_s = time.monotonic() - ex.started
    opened: list[tuple[aiohttp.ClientResponse, Endpoint]] = []

    def close_all() -> None:
        for upstream, leg_endpoint in opened:
            upstream.close()
            live.end_request(leg_endpoint.replica_id)
        opened.clear()

    try:
        for i, content in enumerate(leg_bodies(body, how.legs, max_tokens)):
            if i:
                endpoint = choose(live.current_view().routes.get(model.id, ())) or endpoint
            leg = await open_on_replica(model, Outgoing(path, query, content, headers, False), endpoint, ex)
            if isinstance(leg, HttpResponse):
                close_all()
                return ex.answer(leg)
            opened.append(leg)
            if leg[0].status >= 400 or "text/event-stream" not in leg[0].headers.get("content-type", ""):
                failed, failed_endpoint = opened.pop()
                close_all()
                ex.replica_id = failed_endpoint.replica_id
                return await relay(failed, ex, failed_endpoint.replica_id, False, _replica_headers(failed_endpoint, ex))
    except asyncio.CancelledError:
        close_all()
        ex.finish(499)
        raise
    first, first_endpoint = opened[0]
    ex.replica_id = first_endpoint.replica_id
    ex.upstream_status = first.status
    prompt = _prompt_count(path, body, first_endpoint, how)
    streams = [_leg_chunks(upstream, leg_endpoint.replica_id, ex) for upstream, leg_endpoint in opened]
    opened.clear()  # each leg's stream ends it now
    merged = assembly.merge_streams(streams)
    extra = _replica_headers(first_endpoint, ex)
    if how.client_stream:
        return _streamed(merged, prompt, first, ex, kind, how, extra)
    return await _assembled(merged, prompt, first, ex, kind, extra)


def _prompt_count(path: str, body: dict, endpoint: Endpoint, how: Composition) -> asyncio.Future | int | None:
    """The prompt's token count, or a task counting it with the engine's tokenizer (started
    now, beside generation), or None when nothing can count it."""
    given = assembly.prompt_token_ids_count(path, body)
    if given is not None:
        return given
    if how.tokenize_path is None:
        return None
    text = assembly.prompt_text(path, body)
    return asyncio.ensure_future(count_tokens(upstream_client(), endpoint.url, endpoint.key, how.tokenize_path, text,
                                              engine=how.engine))


async def _prompt_tokens(prompt: asyncio.Future | int | None) -> int:
    if isinstance(prompt, asyncio.Future):
        try:
            return await asyncio.wait_for(asyncio.shield(prompt), 2.0) or 0
        except asyncio.TimeoutError:
            prompt.cancel()
            return 0
    return prompt or 0


def _drop(prompt: asyncio.Future | int | None) -> None:
    if isinstance(prompt, asyncio.Future) and not prompt.done():
        prompt.cancel()


def _usage_of(data: dict) -> dict | None:
    return data["usage"] if not data.get("choices") and isinstance(data.get("usage"), dict) else None


async def _assembled(merged, prompt, first: aiohttp.ClientResponse, ex: Exchange, kind: str,
                     extra: dict[str, str]) -> HttpResponse:
    assembler = assembly.StreamAssembler(kind)
    try:
        async for data in merged:
            assembler.feed(data)
    except asyncio.CancelledError:
        _drop(prompt)
        ex.finish(499)  # the client went away; every leg's upstream is closed
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError, assembly.EventTooLarge) as exc:
        _drop(prompt)
        log.warning("upstream stream broke: %s", exc or type(exc).__name__)
        return ex.answer(openai_error(502, f"The engine's answer broke off ({type(exc).__name__}).",
                                      code="upstream_error"))
    finally:
        await merged.aclose()
    if assembler.error is not None:
        _drop(prompt)
        return ex.answer(engine_error_response(500, "application/json",
                                               json.dumps({"error": assembler.error}).encode(), ex))
    usage = None
    if assembler.usage is None:
        usage = assembly.make_usage(await _prompt_tokens(prompt), assembler.content_chunks)
    else:
        _drop(prompt)
    answer = assembler.answer(usage)
    ex.note_usage(answer)
    response = HttpResponse(json.dumps(answer), content_type="application/json")
    copy_headers(first, response, extra)
    return ex.answer(response)


def _streamed(merged, prompt, first: aiohttp.ClientResponse, ex: Exchange, kind: str, how: Composition,
              extra: dict[str, str]) -> StreamingHttpResponse:
    if ex.model_label != "unknown":
        metrics.IN_FLIGHT.labels(ex.model_label).inc()

    async def events():
        status = 200
        last: dict | None = None
        usage: dict | None = None
        done = False
        try:
            async for data in merged:
                if (found := _usage_of(data)) is not None:
                    usage = found
                    continue
                last = data
                if sse.has_content(data):
                    ex.content_chunks += 1
                event = assembly.encode_event(data)
                yield contained_error_event(event, ex) if "error" in data else event
            if usage is None:
                usage = assembly.make_usage(await _prompt_tokens(prompt), ex.content_chunks)
            else:
                _drop(prompt)
            ex.note_usage({"usage": usage})
            if how.include_usage:
                yield assembly.usage_chunk(last, usage, kind, model=ex.model_label)
            done = True
            yield assembly.DONE_EVENT
        except (aiohttp.ClientError, asyncio.TimeoutError, assembly.EventTooLarge) as exc:
            log.warning("upstream stream broke: %s", exc or type(exc).__name__)
            status = 502
            error = {"error": {"message": f"The engine's stream broke off ({type(exc).__name__}).",
                               "type": "api_error", "param": None, "code": "upstream_stream_broken"}}
            yield assembly.encode_event(error)
        except (asyncio.CancelledError, GeneratorExit):
            if not done:
                status = 499
            raise
        finally:
            _drop(prompt)
            await merged.aclose()
            if ex.model_label != "unknown":
                metrics.IN_FLIGHT.labels(ex.model_label).dec()
            ex.finish(status)

    response = StreamingHttpResponse(events(), status=200, content_type="text/event-stream")
    copy_headers(first, response, extra)
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
