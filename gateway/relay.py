"""Relaying an upstream's answer to the client: a whole JSON answer (bounded), or a stream of
server-sent events event by event (``gateway.sse``); an engine's error in OpenAI's shape.

A client that disconnects cancels the upstream request: the relay closes the upstream
connection, so the engine sees the request end and frees its slot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable

import aiohttp
from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse

from fleet import live
from gateway import assembly, sse
from gateway.engine_errors import map_engine_error, one_line
from gateway.errors import openai_error
from gateway.exchange import Exchange
from gateway.upstream import UpstreamAnswerTooLarge, copy_headers, read_bounded, what_broke

log = logging.getLogger(__name__)


def engine_error_response(status: int, content_type: str, raw: bytes, ex: Exchange) -> HttpResponse:
    """An upstream's error answer (``status`` ≥ 400, its body ``raw``) as the client gets it,
    by ``gateway.engine_errors.map_engine_error``: OpenAI's shape, a 4xx kept as a 4xx (422
    as 400), an engine's validation failure a 400, a context-length complaint 400
    ``context_length_exceeded``, any other 5xx (and the engine refusing the gateway's own
    key) a 502 ``engine_error`` with the engine's message on one line (docs/architecture.md,
    "Gateway rules": errors). The usage record keeps the upstream's own status."""
    status, message, code, param = map_engine_error(status, content_type, raw, ex.model_label, ex.path)
    return openai_error(status, message, code=code, param=param)


def contained_error_event(event: bytes, ex: Exchange) -> bytes:
    """An engine's error event inside a stream (``data: {"error": ...}``), as OpenAI sends
    one: its message on one line without tracebacks or file paths
    (``gateway.engine_errors.one_line``), ``type`` and ``code`` kept or ``api_error`` /
    ``engine_error``. Any other event is returned as it came."""
    data = sse.event_json(event)
    if data is None or data.get("choices") or "error" not in data:
        return event
    error = data["error"]
    if isinstance(error, dict):
        message, kind, code, param = error.get("message"), error.get("type"), error.get("code"), error.get("param")
    else:
        message, kind, code, param = error, None, None, None
    shown = one_line(message if isinstance(message, str) else json.dumps(message)) or (
        f"The engine serving '{ex.model_label}' failed in the middle of the answer.")
    return assembly.encode_event({"error": {
        "message": shown, "type": kind if isinstance(kind, str) and kind else "api_error",
        "param": param if isinstance(param, str) else None,
        "code": code if isinstance(code, str) and code else "engine_error"}})


async def _opening(upstream: aiohttp.ClientResponse) -> bytes:
    """A stream's first bytes: read until its first event is complete (or the stream ends,
    or the bytes pass ``LLMGW_MAX_UPSTREAM_BODY_BYTES``)."""
    buffer = b""
    async for chunk in upstream.content.iter_any():
        buffer += chunk
        if sse.split_events(buffer)[0] or len(buffer) > settings.LLMGW_MAX_UPSTREAM_BODY_BYTES:
            break
    return buffer


async def relay(upstream: aiohttp.ClientResponse, ex: Exchange, replica_id: int | None, strip_usage: bool,
                extra: dict[str, str], add_usage: bool = False,
                on_empty: Callable[[], Awaitable[HttpResponse]] | None = None) -> HttpResponse:
    """The upstream's answer relayed to the client: a JSON answer read whole (bounded) and
    sent as it came, an error answer mapped (:func:`engine_error_response`), a stream event
    by event (``strip_usage``: drop the usage chunk the gateway asked for; ``add_usage``:
    the client asked for one, added before ``[DONE]`` if the engine sent none). ``extra``
    headers are set on the answer; ``replica_id``'s request is counted out at the end.

    A stream's status is given once its first event has come: one that ends before any is
    answered by ``on_empty`` (the engine asked why) or 502 ``upstream_stream_broken``; a
    chat or completions stream that ends without ``[DONE]`` ends with an error event."""
    content_type = upstream.headers.get("content-type", "application/json")
    ex.upstream_status = upstream.status
    if "text/event-stream" not in content_type or upstream.status >= 400:
        read = False
        try:
            body = await read_bounded(upstream)
            read = True
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            log.warning("upstream answer broke off: %s", exc or type(exc).__name__)
            return ex.answer(openai_error(502, f"The upstream answer broke off: {what_broke(exc)}.",
                                          code="upstream_error"))
        except asyncio.CancelledError:
            ex.finish(ex.gone_status())  # the client went away; closing the upstream tells the engine
            raise
        finally:
            if read:
                upstream.release()  # back to the pool
            else:
                upstream.close()  # drop the connection: the engine sees the request end
            if replica_id is not None:
                live.end_request(replica_id)
        ex.ttft_s = time.monotonic() - ex.started
        parsed = None
        if "json" in content_type:
            try:
                parsed = json.loads(body)
                ex.note_usage(parsed)
            except (ValueError, RecursionError):
                pass
        if upstream.status >= 400:
            error = engine_error_response(upstream.status, content_type, body, ex)
            copy_headers(upstream, error, extra)
            return ex.answer(error)
        if not isinstance(parsed, dict):  # a page, a traceback in text/plain: not an OpenAI answer
            kind_shown = content_type.split(";")[0].strip()[:60] or "no content type"
            log.warning("upstream for %s answered %s with %s, not a JSON object", ex.model_label, upstream.status,
                        kind_shown)
            return ex.answer(openai_error(502, f"The upstream serving '{ex.model_label}' answered with {kind_shown}, "
                                               "not an OpenAI answer.", code="engine_error"))
        response = HttpResponse(body, status=upstream.status, content_type=content_type)
        copy_headers(upstream, response, extra)
        return ex.answer(response)

    try:
        opening = await _opening(upstream)
        ex.ttft_s = time.monotonic() - ex.started
    except asyncio.CancelledError:
        upstream.close()
        if replica_id is not None:
            live.end_request(replica_id)
        ex.finish(ex.gone_status())
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        opening = b""
        log.warning("upstream stream broke before its first event: %s", exc or type(exc).__name__)
    if not opening.strip():
        upstream.close()
        if replica_id is not None:
            live.end_request(replica_id)
        if on_empty is not None:
            return await on_empty()
        return ex.answer(openai_error(502, f"The upstream serving '{ex.model_label}' ended its stream before any "
                                           "event.", code="upstream_stream_broken"))
    async def pieces():
        yield opening
        async for chunk in upstream.content.iter_any():
            yield chunk

    async def events():
        buffer = b""
        status = upstream.status
        complete_stream = False
        done_sent = False  # the client has the stream's last event: it may hang up now
        usage_seen = False
        kind = assembly.kind_of(ex.path)
        limit = settings.LLMGW_MAX_UPSTREAM_BODY_BYTES
        try:
            async for chunk in pieces():
                buffer += chunk
                complete, buffer = sse.split_events(buffer)
                if len(buffer) > limit:
                    raise UpstreamAnswerTooLarge(f"an event is over {limit} bytes")
                out = []
                ends = False
                for event in complete:
                    if b'"usage"' in event:  # only these are parsed (usage, and the chunk to strip)
                        data = sse.event_json(event)
                        if data is not None and sse.is_usage_only(data):
                            ex.note_usage(data)
                            usage_seen = True
                            if strip_usage:
                                continue
                        elif data is not None and sse.has_content(data):
                            ex.content_chunks += 1
                    elif sse.may_have_content(event):
                        ex.content_chunks += 1
                    if b'"error"' in event:
                        event = contained_error_event(event, ex)
                    if (b"[DONE]" in event or b"event:" in event) and sse.is_done(event):
                        ends = True
                        if add_usage and not usage_seen and kind is not None:
                            # The client asked for usage and the engine sent none: count it.
                            out.append(assembly.usage_chunk(None, assembly.make_usage(ex.prompt_tokens or 0, ex.content_chunks), kind,
                                                            model=ex.model_label))
                            usage_seen = True
                    out.append(event)
                if out:
                    yield b"".join(out)
                    done_sent = done_sent or ends  # handed to the server
            if buffer:
                yield buffer
                done_sent = done_sent or sse.is_done(buffer)  # a last event without its blank line
            complete_stream = True
            if kind is not None and not done_sent:
                # The engine stopped before [DONE] (it crashed, or raised inside the stream).
                log.warning("upstream stream for %s ended before [DONE]", ex.model_label)
                status = 502
                yield assembly.encode_event({"error": {
                    "message": f"The engine serving '{ex.model_label}' ended its answer before it was complete.",
                    "type": "api_error", "param": None, "code": "upstream_stream_broken"}})
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            if not done_sent:
                # Nothing can be retried after the first byte: say so in the stream itself
                # (an OpenAI-shaped error event) rather than end it as if it were complete.
                log.warning("upstream stream broke: %s", exc)
                status = 502
                error = {"error": {"message": f"The engine's stream broke off: {what_broke(exc)}.",
                                   "type": "api_error",
                                   "param": None, "code": "upstream_stream_broken"}}
                yield b"data: " + json.dumps(error).encode() + b"\n\n"
            # else: the stream was whole ([DONE] sent); only the engine's goodbye was rough
        except (asyncio.CancelledError, GeneratorExit):
            if not done_sent:  # after [DONE], a client closing before the engine's EOF is done
                status = ex.gone_status()  # the client went away; closing the upstream tells the engine
            raise
        finally:
            if complete_stream:
                upstream.release()
            else:
                upstream.close()  # drop the connection: the engine sees the request cancelled
            if replica_id is not None:
                live.end_request(replica_id)
            if ex.completion_tokens is None and ex.content_chunks:
                # Engines that send no usage chunk (llama-cpp-python): one token per chunk.
                ex.completion_tokens = ex.content_chunks
            ex.finish(status)

    response = StreamingHttpResponse(events(), status=upstream.status, content_type=content_type)
    copy_headers(upstream, response, extra)
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response

