"""The ``/v1/`` proxy: authenticate, parse, resolve the model, find (or wait for) a ready
replica, and decide how the answer is made (docs/architecture.md, "Gateway rules").

Order of answers: 413 / 408 (body too large or too slow: ``llmgw.limits``, before Django),
404 ``unknown_url`` (not exactly one of ``gateway.endpoints``: the view), 401 (key), 400
(JSON, invalid Unicode, ``model``: ``gateway.bodies``), 503 ``system_stopped``, 404
``model_not_found``, 403 (key not allowed for the model), 404 ``unknown_url`` (the model
does not serve that endpoint, naming those it does), 400 (OpenAI's rules and the model's
limits, and what its engine would ignore: ``gateway.validation``; a bad
``X-Llmgw-Priority``), 429 / 503 (the key's and team's limits, ``gateway.tenants``), 429
``model_at_capacity`` (a wait in the admission queue that ran out, ``gateway.queueing``),
then the upstream's answer, mapped (``gateway.relay``), 502 for a replica that cannot be
reached, 503 for a model with no replica (with the planner's reason) or still loading.

An external model, or an engine that answers as OpenAI does, gets the request as the client
wrote it and its answer is relayed (``gateway.calls.forward``); for an engine that does not
(llama-cpp-python: ``n``, usage, cancel, prompt lists…), the prompt is counted first and the
answer composed from its streams (``gateway.calls.compose``).

No database on the hot path: keys and models, external ones included, come from
``gateway.cache`` (loaded with the routing table). What the cache cannot answer for sure —
an unknown key or name, a model with no ready replica, a key not allowed the model — is
looked up in the database before answering.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp
from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from catalog.models import NAME_RE, Model
from fleet import live
from fleet.live import Endpoint, ModelStatus, RouteKeys
from gateway import assembly, cache, calls, endpoints, held, queueing, routing, tenants, validation
from gateway.auth import authenticate, forbidden
from gateway.database import checked, database_checked
from gateway.bodies import (asks_usage, body_limit_error, context_problem, parse_body, requested_tokens,
                            token_bound, upstream_body)
from gateway.errors import openai_error
from gateway.exchange import Exchange
from gateway.relay import relay
from gateway.routing import choose
from gateway.tokenize import count_tokens
from gateway.upstream import (Refused, client_query, open_upstream, request_headers, timeout_words, upstream_client,
                              upstream_url, what_broke)

log = logging.getLogger(__name__)

_STREAMABLE = ("chat/completions", "completions")


async def proxy(request: HttpRequest, path: str) -> HttpResponse:
    """Serve one POST to the endpoint ``path`` (one of ``gateway.endpoints``, matched
    exactly by the view; the upstream URL is built from it). Every answer after the
    tenants' limits were checked carries OpenAI's ``x-ratelimit-*`` headers."""
    ex = Exchange(path, request)
    try:
        response = await _serve(request, path, ex)
    except BaseException:
        if (ex.admitted is not None or ex.on_finish or ex.counted_on is not None
                or ex.in_flight_label is not None) and not ex.recorded:
            ex.finish(ex.gone_status())  # settle: the counters and the queue must not keep a request that is gone
        raise
    for name, value in ex.rate_headers.items():
        response[name] = value
    if not ex.recorded:
        # A streamed answer ends in its generator; one the server closes unread (the client
        # left first) ends here. Django closes responses from a worker thread: the end runs
        # on the event loop, where the queue's gates live.
        loop = asyncio.get_running_loop()

        def closed() -> None:
            if not ex.recorded:
                try:
                    loop.call_soon_threadsafe(ex.finish, ex.gone_status())
                except RuntimeError:  # the loop is gone (shutdown): nothing left to release
                    pass

        response._resource_closers.append(closed)
    return response


async def _serve(request: HttpRequest, path: str, ex: Exchange) -> HttpResponse:
    too_big = body_limit_error(request)
    if too_big is not None:
        return ex.answer(too_big)
    live.current_view()  # starts this process's watcher on first use
    caller = await authenticate(request)
    if isinstance(caller, HttpResponse):
        return ex.answer(caller)
    ex.caller = caller
    body = parse_body(request)
    if isinstance(body, HttpResponse):
        return ex.answer(body)
    name = body.get("model")
    if name is None or name == "":
        return ex.answer(openai_error(400, "You must provide a model parameter.", code="missing_model", param="model"))
    if not isinstance(name, str):
        return ex.answer(openai_error(400, f"Invalid type for 'model': expected a string, but got "
                                           f"{validation.kind_of(name)} instead.", code="invalid_type", param="model"))
    known_name = bool(NAME_RE.match(name))
    # A name no model can have is kept escaped: a NUL is not stored (PostgreSQL refuses it), a
    # newline not echoed.
    ex.model_name = name if known_name else json.dumps(name)[1:-1][:128]
    view = await live.fresh_view()
    if view.stopped:
        return ex.answer(openai_error(503, "The cluster is stopped by its operators; no model is being served.",
                                      code="system_stopped"))
    model: Model | cache.CachedModel | None = cache.model(name)
    if not known_name:
        model = None  # no model can be called that (a NUL, a newline…): never a database question
    elif model is None or not caller.may_use(model.id) or (not model.is_external and not view.routes.get(model.id)):
        await database_checked()
        model = await Model.aresolve(name)  # not sure from memory: ask the database
    if model is None:
        return ex.answer(openai_error(404, f"The model '{ex.model_name[:200]}' does not exist.", code="model_not_found",
                                      param="model"))
    ex.model_name = ex.model_label = model.name  # recorded by its catalog name, not the alias asked for
    if not caller.may_use(model.id):
        return ex.answer(forbidden(model.name))
    if not endpoints.served_by(model, path):  # before any upstream call, and the external key
        served = ", ".join(f"/v1/{e}" for e in sorted(model.served_endpoints)) or "nothing"
        return ex.answer(openai_error(404, f"The model '{model.name}' does not serve /v1/{path}; it serves "
                                           f"{served}.", code="unknown_url"))
    problem = validation.check(path, body, model.token_limits())
    if problem is None and not model.is_external:
        problem = validation.engine_problem(path, body, model.engine_traits, model.name)
    if problem is not None:
        param, message, code = problem
        return ex.answer(openai_error(400, message, code=code, param=param))
    generates = path in _STREAMABLE
    ex.stream = bool(body.get("stream")) and generates
    served_here = generates and not model.is_external
    traits = model.engine_traits
    if served_here and ex.stream and body.get("echo") is True and not traits.echoes_in_streams:
        return ex.answer(openai_error(400, f"The engine serving '{model.name}' cannot echo the prompt in a stream: "
                                           "use echo with stream false.", code="unsupported_value", param="echo"))
    tenancy = ex.caller.tenancy
    priority = queueing.priority_of(request, tenancy)
    if isinstance(priority, HttpResponse):
        return ex.answer(priority)
    ex.admitted, ex.rate_headers, refused = await tenants.admit(tenancy, model, path, body, len(request.body))
    if queueing.PRIORITY_HEADER in request.headers:  # say which class applied (never higher than the key's)
        ex.rate_headers = {**ex.rate_headers, queueing.PRIORITY_HEADER: queueing.priority_name(priority)}
    if refused is not None:
        return ex.answer(refused)
    content, strip_usage = upstream_body(body, request.body, ex.stream, served_here, model.default_max_tokens,
                                         traits if served_here else None)
    headers = request_headers(request, model)
    query = client_query(request)
    if model.is_external:
        if model.external_api_key:
            headers["authorization"] = f"Bearer {model.external_api_key}"
        url = upstream_url(f"{model.external_base_url.rstrip('/')}/{path}", query)
        ex.note_overhead()
        try:
            upstream = await open_upstream(url, content, headers)
        except (Refused, aiohttp.ClientError, asyncio.TimeoutError) as exc:
            # Its address (an internal host name, a port) is for the log, not the client.
            log.warning("external service for %s not reachable: %s", model.name, exc or type(exc).__name__)
            return ex.answer(external_failure(model.name, exc))
        except asyncio.CancelledError:
            ex.finish(ex.gone_status())  # the client went away before the answer's headers
            raise
        return await relay(upstream, ex, None, strip_usage, {"X-Llmgw-Replica": "external"})
    default_max_tokens = model.default_max_tokens
    try:
        full = await queueing.wait_for_slot(model, ex, tenancy, priority, lambda: (
            ex.admitted.reserved if ex.admitted is not None else tenants.reservation(
                path, body, len(request.body), model)))
        if full is not None:
            return ex.answer(full)
        ex.route_keys = routing.route_keys(model.routing_policy, path, body, request.headers)
        found = await _find_replica(model, ex.route_keys, ex)
        if isinstance(found, Endpoint):
            ex.count_on(found.replica_id)  # in flight there from now: the next choice sees it
        if served_here and traits.tokenize_path and not traits.streams_usage:
            counted = await _count_prompt(model, path, body, found, ex)
            if isinstance(counted, HttpResponse):
                return ex.answer(counted)
            if counted is not None:  # the default, cut to what the context has left
                default_max_tokens = counted
                content, strip_usage = upstream_body(body, request.body, ex.stream, served_here, counted, traits)
    except asyncio.CancelledError:
        ex.finish(ex.gone_status())  # the client went away while held (the server cancels the view)
        raise
    if isinstance(found, HttpResponse):
        return ex.answer(found)
    how = _composition(model, body, ex.stream, ex.prompt_tokens) if served_here else None
    if how is not None:
        if how.legs > MAX_LEGS:
            return ex.answer(openai_error(400, f"The engine serving '{model.name}' answers one prompt and one choice "
                                               f"at a time: at most {MAX_LEGS} prompts × n in one request, not "
                                               f"{how.legs}.", code="invalid_value", param="n"))
        return await calls.compose(model, path, body, query, headers, found, ex, how,
                                   token_bound(body, default_max_tokens))
    add_usage = ex.stream and asks_usage(body)
    return await calls.forward(model, calls.Outgoing(path, query, content, headers, strip_usage), found, ex, body,
                               add_usage=add_usage)


def external_failure(model_name: str, exc: BaseException) -> HttpResponse:
    """The client's answer when an external model's service could not be asked: 502
    ``upstream_unreachable`` ("The external service for 'm' did not answer: its host name
    did not resolve."), 504 ``upstream_timeout`` ("…did not answer within 600 s."), 502
    ``upstream_error`` for a connection that broke. Never the service's address."""
    subject = f"The external service for '{model_name}'"
    if isinstance(exc, Refused):
        return openai_error(502, f"{subject} did not answer: {exc.reason}.", code="upstream_unreachable")
    if isinstance(exc, asyncio.TimeoutError):
        return openai_error(504, f"{subject} {timeout_words(exc)}.", code="upstream_timeout")
    return openai_error(502, f"{subject} failed: {what_broke(exc)}.", code="upstream_error")


#: The most upstream requests one composed answer may make (prompts × n; OpenAI's own n is
#: at most 128).
MAX_LEGS = 128


async def _count_prompt(model, path: str, body: dict, endpoint, ex: Exchange) -> HttpResponse | int | None:
    """The prompt's tokens counted before the request goes to an engine that reports no
    usage in streams (llama-cpp-python, whose tokenizer answers between generations: asked
    first, it costs a few milliseconds rather than waiting behind the answer), kept in
    ``ex.prompt_tokens`` (a list of prompts: each counted, summed). Answers OpenAI's 400
    ``context_length_exceeded`` when a prompt and the completion the client asked for do
    not fit the model's context (llama-cpp-python would end a stream it has begun, or cut
    the answer short); returns the model's ``default_max_tokens`` cut to what the context
    leaves when the client named no limit and the default would not fit; else None."""
    if not isinstance(endpoint, Endpoint):
        return None
    traits = model.engine_traits
    count = assembly.prompt_token_ids_count(path, body)
    longest = count
    if count is None:
        prompt = body.get("prompt")
        texts = prompt if (isinstance(prompt, list) and len(prompt) > 1 and len(prompt) <= MAX_LEGS
                           and all(isinstance(p, str) for p in prompt)) else [assembly.prompt_text(path, body)]
        surely_over = _surely_over_context(path, texts, model.context_limit)
        if surely_over is not None:
            return surely_over
        asked_at = time.monotonic()
        counts = await asyncio.gather(*(count_tokens(upstream_client(), endpoint.url, endpoint.key,
                                                     traits.tokenize_path, text, timeout_s=_TOKENIZE_TIMEOUT_S,
                                                     engine=traits.engine) for text in texts))
        ex.waited(time.monotonic() - asked_at)  # the engine's work (maybe behind a generation), not ours
        if any(c is None for c in counts):
            return None
        count, longest = sum(counts), max(counts)
    asked = requested_tokens(body, None)  # what the client named; the model's default is ours to fit
    problem = context_problem(path, longest, asked, model.context_limit)
    if problem is not None:
        param, message, code = problem
        return openai_error(400, message, code=code, param=param)
    # Only a request that goes on is charged its prompt (usage record, metrics, budgets): a
    # refused one costs its key nothing.
    ex.prompt_tokens = count
    default, context = model.default_max_tokens, model.context_limit
    if not asked and default and context and longest + default > context:
        return max(1, context - longest)
    return None


#: The most bytes of UTF-8 text one token stands for, in any vocabulary the engines use (their
#: longest tokens are runs of a few dozen characters): a prompt longer than the context times
#: this is over the context whatever the tokenizer. Such a prompt is refused at once, without
#: asking the engine's tokenizer — megabytes cost it tens of seconds, during which the replica
#: serves no one, and a second such prompt waiting behind it would time out and go uncounted.
MAX_BYTES_PER_TOKEN = 128


def _surely_over_context(path: str, texts: list[str], context_length: int | None) -> HttpResponse | None:
    """OpenAI's 400 ``context_length_exceeded`` for a prompt of ``texts`` (one per leg) whose
    longest is more than ``context_length`` × :data:`MAX_BYTES_PER_TOKEN` bytes; else None."""
    if not context_length:
        return None
    longest = max((len(text.encode("utf-8", "surrogatepass")) for text in texts), default=0)
    if longest <= context_length * MAX_BYTES_PER_TOKEN:
        return None
    param, where, are = ("messages", "messages", "are") if path == "chat/completions" else ("prompt", "prompt", "is")
    return openai_error(400, f"This model's maximum context length is {context_length} tokens. However, your "
                             f"{where} {are} {longest:,} bytes of text, more than {context_length} tokens in any "
                             f"tokenizer. Please reduce the length of the {where}.",
                        code="context_length_exceeded", param=param)


#: How long the prompt's count may wait for the engine's tokenizer (behind a generation in
#: progress on llama-cpp-python); past it, the request goes on uncounted.
_TOKENIZE_TIMEOUT_S = 30.0


def _composition(model, body: dict, stream: bool, prompt_tokens: int | None) -> calls.Composition | None:
    """How the gateway builds the answer itself for an engine that would not give it as
    OpenAI does (``gateway.calls``), or None to relay the engine's own: ``n`` > 1 on an
    engine that ignores it, a list of prompts to one that takes one, a non-streamed request
    to one that cannot cancel it, any stream of one whose streams carry no usage (its usage is
    counted here; its tool-call deltas tidied) (``model.engine_traits``,
    ``catalog.engines``)."""
    traits = model.engine_traits
    n = body.get("n")
    legs = int(n) if validation.is_integer(n) and n > 1 and not traits.serves_n else 1
    prompt = body.get("prompt")
    prompts = None
    if (not traits.serves_prompt_lists and isinstance(prompt, list) and len(prompt) > 1
            and all(isinstance(p, str) for p in prompt)):
        prompts = tuple(prompt)
    include_usage = stream and asks_usage(body)
    if (legs > 1 or prompts or (not stream and not traits.cancels_unstreamed)
            or (stream and not traits.streams_usage)):
        echo = body.get("echo") is True and not traits.echoes_in_streams
        if echo and prompts is None and isinstance(prompt, str):
            prompts = (prompt,)
        return calls.Composition(legs, stream, include_usage, prompts, prompt_tokens, echo,
                                 not traits.knows_developer_role, "functions" in body and "tools" not in body,
                                 traits.drops_system_messages)
    return None


async def _find_replica(model: Model | cache.CachedModel, keys: RouteKeys, ex: Exchange) -> Endpoint | HttpResponse:
    """A ready replica of ``model`` chosen by its routing policy and the request's ``keys``
    (``gateway.routing``), holding the request while one may come (cold start):
    until a route appears, ``gateway.held.verdict`` answers from a refresh of the view, or
    the cold-start timeout runs out (503 ``model_loading``). docs/architecture.md,
    "Gateway rules": cold start. The hold, from the want on, is ``ex``'s wait, not its
    overhead (:meth:`Exchange.waited`)."""
    view = live.current_view()
    endpoints = view.routes.get(model.id)
    if endpoints:
        return choose(endpoints, policy=model.routing_policy, keys=keys, model_name=model.name)
    status = view.status.get(model.id, ModelStatus())
    early = held.verdict(model.name, model.on_demand, status, view, timezone.now())
    if early is not None:
        return early
    waiting_since = time.monotonic()
    try:
        return await _hold(model, keys, status, waiting_since, view.cold_start_timeout_s)
    finally:
        ex.waited(time.monotonic() - waiting_since)


async def _hold(model: Model | cache.CachedModel, keys: RouteKeys, status: ModelStatus, trust_after: float,
                timeout_s: float) -> Endpoint | HttpResponse:
    """:func:`_find_replica`'s hold: want the model (on demand), then wait up to
    ``timeout_s`` (the cold-start timeout) for a route or a verdict."""
    if model.on_demand:
        await _want(model.id)
        trust_after = time.monotonic()
    hold = held.hold_start(status, trust_after)
    log.info("holding a request for %s while it starts (up to %.0f s)", model.name, timeout_s)
    deadline = time.monotonic() + timeout_s
    began = held.began_holding(model.name)
    try:
        async with live.holding():
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await live.wait_for_change(remaining)
                view = live.current_view()
                endpoints = view.routes.get(model.id)
                if endpoints:
                    return choose(endpoints, policy=model.routing_policy, keys=keys, model_name=model.name)
                answer = held.verdict(model.name, model.on_demand, view.status.get(model.id, ModelStatus()), view,
                                      timezone.now(), hold)
                if answer is not None:
                    return answer
    finally:
        held.ended_holding(model.name, began)
    retry_after = max(1, int(min(timeout_s, 30)))
    return openai_error(
        503,
        f"The model '{model.name}' is still loading (waited {timeout_s:.0f} s); retry shortly.",
        code="model_loading",
        headers={"Retry-After": str(retry_after)},
    )


#: Model id → the want in progress for it: concurrent held requests of a model share one
#: (one ``ModelState`` write and one pass request for a burst, not one each).
_wants: dict[int, asyncio.Future] = {}


async def _want(model_id: int) -> None:
    """``live.want_model`` for ``model_id``, joined by every request that asks while it
    runs; a request cancelled meanwhile (its client gone) leaves the want to the others."""
    loop = asyncio.get_running_loop()
    task = _wants.get(model_id)
    if task is None or task.done() or task.get_loop() is not loop:
        task = loop.create_task(sync_to_async(checked(live.want_model))(model_id))
        _wants[model_id] = task

        def done(t: asyncio.Future, key: int = model_id) -> None:
            if _wants.get(key) is t:
                del _wants[key]
            if not t.cancelled():
                t.exception()  # retrieved: every waiter that is left raises it

        task.add_done_callback(done)
    await asyncio.shield(task)


def _model_object(model: Model) -> dict:
    """OpenAI's model object, with what the gateway knows besides (extra fields, which the
    ``openai`` SDK keeps): the endpoints it serves, and its token limits where known."""
    context_length, max_output_tokens = model.token_limits()
    return {"id": model.name, "object": "model", "created": int(model.created_at.timestamp()),
            "owned_by": "external" if model.is_external else "llmgw",
            "capabilities": sorted(model.served_endpoints), "context_length": context_length,
            "max_output_tokens": max_output_tokens}


async def list_models(request: HttpRequest) -> HttpResponse:
    """GET /v1/models: every model in the catalog (that the key may use), OpenAI's shape."""
    caller = await authenticate(request)
    if isinstance(caller, HttpResponse):
        return caller
    data = []
    await database_checked()
    async for model in Model.objects.select_related("profile").order_by("name"):
        if caller.may_use(model.id):
            data.append(_model_object(model))
    return HttpResponse(json.dumps({"object": "list", "data": data}), content_type="application/json")


async def retrieve_model(request: HttpRequest, name: str) -> HttpResponse:
    """GET /v1/models/NAME: the model called NAME (or an alias of it); 404 if there is
    none, 403 if the key may not use it."""
    caller = await authenticate(request)
    if isinstance(caller, HttpResponse):
        return caller
    model = None
    if NAME_RE.match(name):
        await database_checked()
        model = await Model.aresolve(name)
    if model is None:
        shown = json.dumps(name[:200])[1:-1]  # escaped: a control character is not echoed as it came
        return openai_error(404, f"The model '{shown}' does not exist.", code="model_not_found", param="model")
    if not caller.may_use(model.id):
        return forbidden(model.name)
    return HttpResponse(json.dumps(_model_object(model)), content_type="application/json")
