"""What a client reads when an upstream cannot be asked: plain words naming the model, the
agent and what happened ("did not answer: connection refused", "did not answer within
0.5 s") — never aiohttp's class names or text ("Cannot connect to host 127.0.0.1:1234
ssl:default [Connect call failed ...]"), never an address or port; those stay in the log
(``gateway.upstream``, ``gateway.calls.unreachable_message``, ``gateway.proxy.external_failure``)."""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import time
from types import SimpleNamespace

import aiohttp
import pytest
from django.test import AsyncClient

from catalog.models import Model
from gateway import upstream
from gateway.calls import unreachable_message
from gateway.models import ApiKey
from gateway.upstream import (
    Refused,
    connect_failure,
    open_upstream,
    timeout_words,
    what_broke,
)
from gateway.usage import usage_records
from tests.processes import free_port
from tests.replicas import serve

HI = [{"role": "user", "content": "x"}]
#: What a client must never read: the library's words and the machine's address.
INTERNALS = ("aiohttp", "Client", "Cannot connect", "ssl:default", "Connect call failed", "127.0.0.1", "Errno")


def assert_plain(message: str, *ports: int) -> None:
    for word in INTERNALS:
        assert word not in message, message
    for port in ports:
        assert str(port) not in message, message


def connector_error(cls, number: int, text: str) -> aiohttp.ClientConnectorError:
    key = SimpleNamespace(host="10.0.0.5", port=8000, ssl=True)
    return cls(key, OSError(number, text))


# --- words ------------------------------------------------------------------------------------


def test_connection_failures_are_told_in_words():
    assert connect_failure(connector_error(aiohttp.ClientConnectorError, errno.ECONNREFUSED, "refused")) == (
        "connection refused")
    assert connect_failure(connector_error(aiohttp.ClientConnectorError, errno.EHOSTUNREACH, "x")) == (
        "no route to its host")
    assert connect_failure(connector_error(aiohttp.ClientConnectorDNSError, -2, "Name or service not known")) == (
        "its host name did not resolve")
    assert connect_failure(connector_error(aiohttp.ClientConnectorError, 9999, "odd")) == "the connection failed"


def test_timeouts_name_the_limit_that_ran_out(settings):
    settings.LLMGW_UPSTREAM_CONNECT_TIMEOUT_S = 5.0
    settings.LLMGW_UPSTREAM_READ_TIMEOUT_S = 600.0
    assert timeout_words(aiohttp.ConnectionTimeoutError()) == "did not accept a connection within 5 s"
    assert timeout_words(aiohttp.SocketTimeoutError()) == "did not answer within 600 s"
    assert what_broke(TimeoutError()) == "it did not answer within 600 s"


def test_replicas_that_took_no_connection_are_named_by_agent():
    assert unreachable_message("m", [("gpu-1", "connection refused")]) == (
        "The replica of 'm' on gpu-1 did not answer: connection refused.")
    assert unreachable_message("m", [("gpu-1", "connection refused"), ("gpu-2", "connection refused")]) == (
        "The replicas of 'm' on gpu-1 and gpu-2 did not answer: connection refused.")
    assert unreachable_message("m", [("gpu-1", "connection refused"), ("gpu-1", "connection refused")]) == (
        "The replicas of 'm' on gpu-1 did not answer: connection refused.")
    assert unreachable_message("m", [("gpu-1", "connection refused"), ("gpu-2", "no route to its host")]) == (
        "The replicas of 'm' on gpu-1 and gpu-2 did not answer: gpu-1: connection refused; "
        "gpu-2: no route to its host.")


async def test_a_closed_port_is_refused_in_words_and_the_address_kept_for_the_log():
    port = free_port()
    try:
        with pytest.raises(Refused) as caught:
            await open_upstream(f"http://127.0.0.1:{port}/v1/chat/completions", b"{}", {})
    finally:
        await upstream.upstream_client().close()
    assert caught.value.reason == "connection refused"
    assert str(port) in str(caught.value)  # the log's words


@pytest.fixture
def silent_server():
    """A port that accepts connections and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield server.getsockname()[1]


async def test_an_upstream_that_never_answers_is_a_timeout_naming_the_limit(settings, silent_server):
    settings.LLMGW_UPSTREAM_READ_TIMEOUT_S = 0.3
    try:
        with pytest.raises(TimeoutError) as caught:
            await open_upstream(f"http://127.0.0.1:{silent_server}/v1/chat/completions", b"{}", {})
    finally:
        await upstream.upstream_client().close()
    assert timeout_words(caught.value) == "did not answer within 0.3 s"


# --- through the gateway ----------------------------------------------------------------------


@pytest.fixture
def key(transactional_db):
    """A key; the usage these in-process requests recorded is written before the test's
    rows are flushed (else the process's exit would write it to a dropped database)."""
    yield ApiKey.create_key("messages")[1]
    usage_records.flush()


async def chat_until(client: AsyncClient, key: str, model: str, status: int, timeout_s: float = 20) -> dict:
    """POST a chat for ``model`` until the gateway answers ``status`` (its watcher must have
    read this test's rows first); the answer's JSON."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = await client.post("/v1/chat/completions", data=json.dumps({"model": model, "messages": HI}),
                                   content_type="application/json", headers={"Authorization": f"Bearer {key}"})
        if answer.status_code == status or time.monotonic() > deadline:
            assert answer.status_code == status, answer.content
            return answer.json()
        await asyncio.sleep(0.1)


@pytest.mark.django_db(transaction=True)
async def test_a_replica_that_refuses_is_named_with_its_agent_not_its_address(watcher_cleanup, make_model, key):
    ports = free_port(), free_port()
    model = await Model.objects.aget(pk=(await asyncio.to_thread(make_model, "gone")).pk)
    for port in ports:
        await asyncio.to_thread(serve, model, port)
    try:
        body = await chat_until(AsyncClient(), key, "gone", 502)
    finally:
        await upstream.upstream_client().close()
    assert body["error"]["code"] == "upstream_unreachable"
    message = body["error"]["message"]
    assert message in ("The replicas of 'gone' on local did not answer: connection refused.",
                       "The replica of 'gone' on local did not answer: connection refused."), message
    assert_plain(message, *ports)


@pytest.mark.django_db(transaction=True)
async def test_an_external_service_that_refuses_or_stays_silent_is_told_in_words(watcher_cleanup, key, settings,
                                                                                 silent_server):
    settings.LLMGW_UPSTREAM_READ_TIMEOUT_S = 0.5
    closed = free_port()

    def make() -> None:
        for name, port in (("ext-closed", closed), ("ext-silent", silent_server)):
            ext = Model(name=name, external_base_url=f"http://127.0.0.1:{port}/v1", min_replicas=0, max_replicas=0)
            ext.full_clean()
            ext.save()

    await asyncio.to_thread(make)
    client = AsyncClient()
    try:
        refused = await chat_until(client, key, "ext-closed", 502)
        assert refused["error"] == {"message": "The external service for 'ext-closed' did not answer: connection "
                                               "refused.", "type": "api_error", "param": None,
                                    "code": "upstream_unreachable"}
        silent = await chat_until(client, key, "ext-silent", 504)
        assert silent["error"]["code"] == "upstream_timeout"
        assert silent["error"]["message"] == "The external service for 'ext-silent' did not answer within 0.5 s."
        assert_plain(refused["error"]["message"] + silent["error"]["message"], closed, silent_server)
    finally:
        await upstream.upstream_client().close()
