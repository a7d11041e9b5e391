"""Only the OpenAI endpoints go upstream (issue 12), tried as an attacker would: traversal
and encoded paths against a replica and an external model, an external model's key and
the client's organization headers, and upstream response headers — through a real web
process (uvicorn, as ``llmgw up`` runs it) and a recording upstream that sees every
request that reaches it."""

from __future__ import annotations

import http.client
import json

import pytest
from django.core.exceptions import ValidationError

from catalog.models import Model
from gateway.models import ApiKey
from tests.processes import free_port, web_server, wait_until
from tests.replicas import routed_to, serve
from tests.upstream import SAFE_HEADERS, SPOOFING_HEADERS, UNSAFE_HEADERS, RecordingUpstream

pytestmark = [pytest.mark.django_db(transaction=True)]

HI = [{"role": "user", "content": "x"}]
OPERATOR_KEY = "sk-operator-secret"

NASTY_PATHS = [
    "/v1/../admin/",
    "/v1/../v1/chat/completions",
    "/v1/chat/completions/../../props",
    "/v1/chat/completions/..",
    "/v1/chat/completions/.",
    "/v1/./chat/completions",
    "/v1/%2e%2e/props",
    "/v1/%2E%2E/slots",
    "/v1/chat%2Fcompletions",
    "/v1/chat%2fcompletions",
    "/v1/%63hat/completions",  # %63 is "c": decodes to the endpoint, but is not how it is spelled
    "/v1/chat/completions%3Fx=1",
    "/v1/chat/completions%23frag",
    "/v1/chat/completions%2F..%2F..%2Fslots",
    "/v1/chat/completions%00",
    "/v1/chat/completions%20",
    "/v1//chat/completions",
    "/v1/chat//completions",
    "/v1/chat/completions/",
    "/v1/chat/completionsX",
    "/v1/chat/completions;jsessionid=1",
    "/v1/embeddings;x",
    "/v1/CHAT/COMPLETIONS",
    "/v1/slots",
    "/v1/props",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/v1/tokenize",
    "/v1/detokenize",
    "/v1/files",
    "/v1/chat/completions/x",
]


@pytest.fixture(scope="module")
def servers(django_db_setup, tmp_path_factory):
    logs = tmp_path_factory.mktemp("paths")
    upstream = RecordingUpstream().start()
    port = free_port()
    web = web_server(port, logs, env={"LLMGW_WATCH_INTERVAL": "50ms", "LLMGW_WATCH_FAST_INTERVAL": "20ms",
                                      "LLMGW_MAX_UPSTREAM_BODY_BYTES": "65536"})
    yield {"port": port, "url": f"http://127.0.0.1:{port}", "upstream": upstream, "web": web}
    web.stop()
    upstream.stop()


@pytest.fixture
def key(transactional_db) -> str:
    return ApiKey.create_key("paths")[1]


def external(name: str, base_url: str, **kw) -> Model:
    model = Model(name=name, external_base_url=base_url, external_api_key=OPERATOR_KEY, min_replicas=0,
                  max_replicas=0, **kw)
    model.full_clean()
    model.save()
    return model


@pytest.fixture
def models(servers, make_model, key):
    """``rep`` (a replica served here, by the recording upstream), ``ext`` (external, every
    endpoint), ``ext-chat`` (external, chat only), ``ext-org`` (external, forwards org
    headers). Waits until the web process routes ``rep`` to this test's replica."""
    upstream = servers["upstream"]
    base = f"http://127.0.0.1:{upstream.port}/v1"
    rep = make_model("rep")
    replica = serve(rep, upstream.port)
    made = {"rep": rep, "ext": external("ext", base), "ext-chat": external("ext-chat", base, endpoints="chat/completions"),
            "ext-org": external("ext-org", base, external_forward_org_headers=True)}
    wait_until(lambda: routed_to(post(servers, "/v1/chat/completions", {"model": "rep", "messages": HI}, key), replica),
               timeout_s=15, what="rep to be routed to this test's replica")
    return made


def post(servers, target: str, body: dict, key: str | None, headers: dict | None = None, method: str = "POST"):
    """Send ``target`` exactly as written (http.client sends the request target untouched;
    httpx would normalise dot segments). Returns a :class:`Response`."""
    conn = http.client.HTTPConnection("127.0.0.1", servers["port"], timeout=30)
    try:
        sent = {"Content-Type": "application/json", **(headers or {})}
        if key:
            sent["Authorization"] = f"Bearer {key}"
        conn.request(method, target, body=json.dumps(body).encode() if method == "POST" else None, headers=sent)
        resp = conn.getresponse()
        raw = resp.read()
        got_headers = {k.lower(): v for k, v in resp.getheaders()}
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw.decode("utf-8", "replace")
        return Response(resp.status, got_headers, parsed, resp.getheader("Set-Cookie"))
    finally:
        conn.close()


class Response:
    def __init__(self, status: int, headers: dict, body, set_cookie) -> None:
        self.status_code, self.headers, self.body, self.set_cookie = status, headers, body, set_cookie

    def __repr__(self) -> str:
        return f"<{self.status_code} {self.body!r:.300}>"


# --- paths -------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", NASTY_PATHS)
def test_a_path_that_is_not_exactly_an_endpoint_is_a_404_and_goes_nowhere(servers, models, key, target):
    upstream = servers["upstream"]
    for model in ("rep", "ext"):
        before = upstream.count()
        r = post(servers, target, {"model": model, "messages": HI, "input": "x", "prompt": "x"}, key)
        assert r.status_code == 404, (target, model, r)
        assert r.body["error"]["code"] == "unknown_url" and r.body["error"]["type"] == "invalid_request_error", r
        assert "x-llmgw-replica" not in r.headers
        assert upstream.since(before) == [], (target, model, upstream.since(before))


def test_an_unknown_path_is_a_404_before_the_key_is_checked(servers, models):
    before = servers["upstream"].count()
    r = post(servers, "/v1/../admin/", {"model": "rep"}, None)
    assert r.status_code == 404 and r.body["error"]["code"] == "unknown_url"
    assert "POST /v1/chat/completions, /v1/completions," in r.body["error"]["message"]  # each path whole
    assert servers["upstream"].since(before) == []


def test_a_get_of_an_engine_private_endpoint_is_a_404_too(servers, models, key):
    before = servers["upstream"].count()
    for target in ("/v1/slots", "/v1/props", "/v1/chat/completions/../../health"):
        r = post(servers, target, {}, key, method="GET")
        assert r.status_code == 404 and r.body["error"]["code"] == "unknown_url", (target, r)
    assert servers["upstream"].since(before) == []


@pytest.mark.parametrize("model", ["rep", "ext"])
@pytest.mark.parametrize("query", [
    "api-version=2024-10-21&x=../../slots",
    "q=a%2Fb&r=%26%3D&s=%E2%9C%93&t=+plus",  # percent-encoding kept, never decoded and re-encoded
    "flag&empty=&a=1&a=2",
])
def test_the_clients_query_string_goes_upstream_as_sent_and_the_path_stays_the_endpoint(servers, models, key,
                                                                                          model, query):
    before = servers["upstream"].count()
    r = post(servers, f"/v1/chat/completions?{query}", {"model": model, "messages": HI}, key)
    assert r.status_code == 200, r
    assert [req["target"] for req in servers["upstream"].since(before)] == [f"/v1/chat/completions?{query}"]


@pytest.mark.parametrize("model", ["rep", "ext"])
def test_a_request_without_a_query_string_goes_upstream_without_one(servers, models, key, model):
    before = servers["upstream"].count()
    r = post(servers, "/v1/chat/completions", {"model": model, "messages": HI}, key)
    assert r.status_code == 200, r
    assert [req["target"] for req in servers["upstream"].since(before)] == ["/v1/chat/completions"]


@pytest.mark.parametrize("target, body", [
    ("/v1/chat/completions/", {"model": "rep", "messages": "not a list"}),
    ("/v1/chat//completions", {"model": "rep"}),
    ("/v1/embeddings/", {"model": "rep"}),
])
def test_a_near_miss_path_cannot_dodge_validation(servers, models, key, target, body):
    before = servers["upstream"].count()
    assert post(servers, target, body, key).status_code == 404
    assert post(servers, target.rstrip("/").replace("//", "/"), body, key).status_code == 400
    assert servers["upstream"].since(before) == []


@pytest.mark.parametrize("host", ["rebound.example.com", "evil.example.com:8000", "127.0.0.1.evil.example.com"])
def test_a_host_not_allowed_is_refused_under_v1_and_metrics_too(servers, models, key, host):
    """DNS rebinding: a web page whose name now resolves to the gateway reads what it
    answers as its own origin. Django checks ``ALLOWED_HOSTS`` only when something asks for
    the host, and nothing did on ``/v1/`` and ``/metrics`` (no middleware there): so a page
    could use a gateway without keys (``LLMGW_GATEWAY_AUTH=false``) or read an open
    ``/metrics``. Both refuse such a host (400) before any key or upstream work."""
    upstream = servers["upstream"]
    before = upstream.count()
    for model in ("rep", "ext"):
        r = post(servers, "/v1/chat/completions", {"model": model, "messages": HI}, key, headers={"Host": host})
        assert r.status_code == 400, (host, model, r)
        assert r.body["error"]["code"] == "disallowed_host" and "x-llmgw-replica" not in r.headers, r
    assert post(servers, "/v1/models", {}, key, headers={"Host": host}, method="GET").status_code == 400
    metrics = post(servers, "/metrics", {}, None, headers={"Host": host}, method="GET")
    assert metrics.status_code == 400 and "llmgw_" not in str(metrics.body), metrics
    assert upstream.since(before) == []
    # The names it is reached by still work.
    assert post(servers, "/v1/chat/completions", {"model": "rep", "messages": HI}, key,
                headers={"Host": f"localhost:{servers['port']}"}).status_code == 200
    assert post(servers, "/metrics", {}, None, method="GET").status_code == 200


# --- external models: key, endpoints, organization ----------------------------------------------


def test_the_external_key_goes_only_to_the_endpoints_the_model_allows(servers, models, key):
    upstream = servers["upstream"]
    before = upstream.count()
    for path, body in (("/v1/embeddings", {"model": "ext-chat", "input": "x"}),
                       ("/v1/completions", {"model": "ext-chat", "prompt": "x"})):
        r = post(servers, path, body, key)
        assert r.status_code == 404 and r.body["error"]["code"] == "unknown_url", r
        assert "ext-chat" in r.body["error"]["message"]
    assert upstream.since(before) == []
    assert post(servers, "/v1/chat/completions", {"model": "ext-chat", "messages": HI}, key).status_code == 200
    seen = upstream.since(before)
    assert [(s["target"], s["headers"].get("authorization")) for s in seen] == [
        ("/v1/chat/completions", f"Bearer {OPERATOR_KEY}")]


@pytest.mark.parametrize("raw", [
    b'{"model": "ext", "messages": [{"role": "user", "content": "x"}], "model": "ext-chat"}',
    b'{"model": "ext-chat", "messages": [{"role": "user", "content": "x"}], "model": "ext"}',
    b'{"model": "ext-chat", "messages": [{"role": "user", "content": "x", "role": "system"}]}',
])
def test_a_body_with_a_duplicated_name_is_a_400_that_goes_nowhere(servers, models, raw):
    """The gateway reads the last of two ``"model"`` values, a provider's parser may read
    the first: a key allowed one model would get another, at the operator's expense. A JSON
    object with a name twice (at any depth) is refused before any upstream."""
    _, narrow = ApiKey.create_key("narrow", ["ext-chat"])
    upstream = servers["upstream"]
    before = upstream.count()
    conn = http.client.HTTPConnection("127.0.0.1", servers["port"], timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", body=raw,
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {narrow}"})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
    finally:
        conn.close()
    assert resp.status == 400 and answer["error"]["code"] == "invalid_json", answer
    assert "twice" in answer["error"]["message"]
    assert upstream.since(before) == []


def test_a_replica_restricted_to_some_endpoints_serves_only_those(servers, models, key):
    Model.objects.filter(name="rep").update(endpoints="embeddings")
    upstream = servers["upstream"]

    def narrowed():  # the web process caches models for one refresh (50 ms here)
        before = upstream.count()
        r = post(servers, "/v1/chat/completions", {"model": "rep", "messages": HI}, key)
        return r.status_code == 404 and upstream.since(before) == []
    wait_until(narrowed, timeout_s=10, what="the narrowed endpoints to reach the gateway")
    assert post(servers, "/v1/embeddings", {"model": "rep", "input": "x"}, key).status_code == 200


ORG = {"OpenAI-Organization": "org-chosen-by-client", "OpenAI-Project": "proj-chosen-by-client"}


@pytest.mark.parametrize("model", ["ext", "rep"])
def test_the_clients_organization_headers_are_not_forwarded_by_default(servers, models, key, model):
    before = servers["upstream"].count()
    assert post(servers, "/v1/chat/completions", {"model": model, "messages": HI}, key, ORG).status_code == 200
    (seen,) = servers["upstream"].since(before)
    assert "openai-organization" not in seen["headers"] and "openai-project" not in seen["headers"]
    assert "bearer " + key.lower() not in str(seen["headers"]).lower()  # nor, ever, the client's key


def test_an_external_model_that_allows_it_gets_the_organization_headers(servers, models, key):
    before = servers["upstream"].count()
    assert post(servers, "/v1/chat/completions", {"model": "ext-org", "messages": HI}, key, ORG).status_code == 200
    (seen,) = servers["upstream"].since(before)
    assert seen["headers"]["openai-organization"] == "org-chosen-by-client"
    assert seen["headers"]["openai-project"] == "proj-chosen-by-client"
    assert seen["headers"]["authorization"] == f"Bearer {OPERATOR_KEY}"


def test_an_unreachable_external_service_is_a_502_that_does_not_name_its_address(servers, models, key):
    """The provider's address (an internal host name, a port) is the operator's to know:
    the client gets the model's name, the web process's log gets the address."""
    closed = free_port()
    Model.objects.filter(name="ext").update(external_base_url=f"http://127.0.0.1:{closed}/v1")
    # External models come from the in-memory view: the edit applies within a refresh.
    wait_until(lambda: post(servers, "/v1/chat/completions", {"model": "ext", "messages": HI}, key).status_code == 502,
               timeout_s=10, what="the new external URL to apply")
    r = post(servers, "/v1/chat/completions", {"model": "ext", "messages": HI}, key)
    assert r.status_code == 502 and r.body["error"]["code"] == "upstream_unreachable", r
    assert str(closed) not in r.body["error"]["message"] and "127.0.0.1" not in r.body["error"]["message"]
    assert "'ext'" in r.body["error"]["message"]
    wait_until(lambda: str(closed) in servers["web"].log(), timeout_s=5, what="the address in the web log")


# --- response headers --------------------------------------------------------------------------


@pytest.mark.parametrize("model, stream", [("rep", False), ("ext", False), ("rep", True), ("ext", True)])
def test_upstream_cookies_and_session_headers_never_reach_the_client(servers, models, key, model, stream):
    r = post(servers, "/v1/chat/completions", {"model": model, "messages": HI, "stream": stream}, key)
    assert r.status_code == 200, r
    assert r.set_cookie is None
    for name in UNSAFE_HEADERS:
        assert name.lower() not in r.headers, (name, r.headers)
    for name, value in SAFE_HEADERS.items():  # what a client may use still comes through
        assert r.headers.get(name.lower()) == value


@pytest.mark.parametrize("model, stream", [("rep", False), ("ext", False), ("rep", True), ("ext", True)])
def test_upstream_redirects_and_the_gateways_own_headers_never_come_from_upstream(servers, models, key, model,
                                                                                  stream):
    """An upstream cannot send the client elsewhere under the gateway's name (``Location``,
    ``Refresh``, ``Link`` preloads) nor speak for the gateway (``X-Llmgw-*``)."""
    r = post(servers, "/v1/chat/completions", {"model": model, "messages": HI, "stream": stream}, key)
    assert r.status_code == 200, r
    for name in ("location", "content-location", "refresh", "link", "x-llmgw-anything"):
        assert name not in r.headers, (name, r.headers)
    assert r.headers["x-llmgw-replica"] != SPOOFING_HEADERS["X-Llmgw-Replica"]
    assert r.headers.get("x-llmgw-overhead-ms") != SPOOFING_HEADERS["X-Llmgw-Overhead-Ms"]
    # Whatever an upstream answers is never run by a browser under the gateway's (and the admin's) origin.
    assert r.headers["x-content-type-options"] == "nosniff" and "sandbox" in r.headers["content-security-policy"]
    for name, value in SAFE_HEADERS.items():
        assert r.headers.get(name.lower()) == value


class RawHeaderUpstream:
    """An upstream whose answers carry a header value that is not text (bytes ``ff fe``):
    aiohttp hands it over as surrogates, which no response header can carry."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), b"0"))
                while len(rest) < length:
                    rest += conn.recv(65536)
                try:
                    conn.sendall(self.answer(rest))
                except OSError:
                    pass  # the gateway hung up (it read enough)

    def answer(self, request_body: bytes) -> bytes:
        if b'"stream": true' in request_body:
            ctype, body = b"text/event-stream", b'data: {"choices": []}\n\ndata: [DONE]\n\n'
        else:
            ctype, body = b"application/json", b'{"id": "c1", "object": "chat.completion", "choices": []}'
        return (b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype + b"\r\nContent-Length: " + str(len(body)).encode()
                + b"\r\nX-Bad: \xff\xfe\r\nX-Request-Id: r1\r\nConnection: close\r\n\r\n" + body)

    def stop(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_header_that_is_not_text_is_dropped_not_a_500(servers, models, key, stream):
    """Before, Django refused to set it: a 500 in HTML under /v1/ and, for a stream, the
    replica counted busy forever. Now the header is left out and the answer relayed."""
    upstream = RawHeaderUpstream()
    try:
        external("ext-raw", f"http://127.0.0.1:{upstream.port}/v1")
        r = post(servers, "/v1/chat/completions", {"model": "ext-raw", "messages": HI, "stream": stream}, key)
        assert r.status_code == 200, r
        assert "x-bad" not in r.headers and r.headers.get("x-request-id") == "r1"
        assert ("[DONE]" in r.body) if stream else (r.body["object"] == "chat.completion")
    finally:
        upstream.stop()


class HugeUpstream(RawHeaderUpstream):
    """Answers far over the gateway's upstream limit (64 KiB in these tests): a gzip answer
    that unpacks to 4 MiB, or a stream whose one event never ends."""

    def answer(self, request_body: bytes) -> bytes:
        import gzip

        if b'"stream": true' in request_body:
            body = b'data: {"choices": [], "x": "' + b"a" * (4 * 1024 * 1024)
            return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: "
                    + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        body = gzip.compress(b'{"id": "c1", "object": "chat.completion", "x": "' + b"a" * (4 * 1024 * 1024) + b'"}')
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_answer_over_the_limit_is_cut_off_not_buffered(servers, models, key, stream):
    """No engine or provider fills the web process's memory: an answer (decompressed) or a
    stream's event over ``LLMGW_MAX_UPSTREAM_BODY_BYTES`` ends in a 502 / an error event."""
    upstream = HugeUpstream()
    try:
        external("ext-huge", f"http://127.0.0.1:{upstream.port}/v1")
        r = post(servers, "/v1/chat/completions", {"model": "ext-huge", "messages": HI, "stream": stream}, key)
        if stream:
            assert r.status_code == 200 and "upstream_stream_broken" in r.body and len(r.body) < 65536, str(r)[:300]
        else:
            assert r.status_code == 502 and r.body["error"]["code"] == "upstream_error", r
            assert "over the size limit" in r.body["error"]["message"]
    finally:
        upstream.stop()


def test_an_upstream_error_keeps_its_status_but_not_its_cookies(servers, models, key):
    # The recording upstream answers 404 {"detail": ...} for a path it does not serve; the
    # gateway never sends one there, so make the model's endpoint exist here but not there.
    Model.objects.filter(name="ext").update(external_base_url=f"http://127.0.0.1:{servers['upstream'].port}/nowhere")
    wait_until(lambda: post(servers, "/v1/chat/completions", {"model": "ext", "messages": HI}, key).status_code == 404,
               timeout_s=10, what="the new external URL to apply")
    r = post(servers, "/v1/chat/completions", {"model": "ext", "messages": HI}, key)
    assert r.status_code == 404 and r.set_cookie is None and "www-authenticate" not in r.headers


async def test_an_internal_error_under_v1_is_a_500_in_openais_shape(monkeypatch):
    """Whatever fails inside the gateway, a client under /v1/ reads OpenAI's error shape, and
    the traceback goes to the log (not to the client)."""
    from channels.testing import HttpCommunicator

    from gateway import proxy
    from llmgw.asgi import application

    async def broken(request, endpoint):
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(proxy, "proxy", broken)
    communicator = HttpCommunicator(application, "POST", "/v1/chat/completions", body=b"{}",
                                    headers=[(b"host", b"127.0.0.1"), (b"content-type", b"application/json")])
    answer = await communicator.get_response(timeout=10)
    body = json.loads(answer["body"])
    assert answer["status"] == 500 and body["error"]["code"] == "internal_error", answer
    assert "secret internal detail" not in answer["body"].decode()


# --- the catalog's side --------------------------------------------------------------------------


@pytest.mark.parametrize("endpoints", ["slots", "chat/completions, props", "../admin", "v1/chat/completions"])
def test_a_model_can_only_list_endpoints_the_gateway_knows(make_model, endpoints):
    with pytest.raises(ValidationError) as exc:
        make_model("narrow", endpoints=endpoints)
    assert "endpoints" in exc.value.message_dict
    assert not Model.objects.filter(name="narrow").exists()


def test_endpoints_are_parsed_with_blank_meaning_all(make_model):
    assert make_model("all").served_endpoints == {"chat/completions", "completions", "embeddings"}
    assert make_model("some", endpoints=" embeddings ,chat/completions").served_endpoints == {
        "embeddings", "chat/completions"}


def test_only_an_external_model_may_forward_organization_headers(make_model):
    with pytest.raises(ValidationError) as exc:
        make_model("here", external_forward_org_headers=True)
    assert "external_forward_org_headers" in exc.value.message_dict


def test_the_rest_api_refuses_an_unknown_endpoint_as_a_field_message(django_user_model, cpu_profile):
    import base64

    from rest_framework.test import APIClient

    django_user_model.objects.create_superuser("root", "root@localhost", "pw")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(b"root:pw").decode())
    r = client.post("/api/models/", {"name": "sneaky", "weights": "file:/dev/null", "profile": cpu_profile.pk,
                                     "endpoints": "chat/completions,../../slots"}, format="json")
    assert r.status_code == 400 and "endpoints" in r.json(), r.content
    assert not Model.objects.filter(name="sneaky").exists()
    r = client.post("/api/models/", {"name": "fine", "weights": "file:/dev/null", "profile": cpu_profile.pk,
                                     "endpoints": "embeddings"}, format="json")
    assert r.status_code == 201 and r.json()["endpoints"] == "embeddings"
    assert r.json()["external_forward_org_headers"] is False


# --- the pure parts ------------------------------------------------------------------------------


@pytest.mark.parametrize("path, raw, expected", [
    ("/v1/chat/completions", b"/v1/chat/completions", "chat/completions"),
    ("/v1/embeddings", None, "embeddings"),  # a server without raw_path: the decoded path decides
    ("/v1/chat/completions", b"/v1/chat%2Fcompletions", None),
    ("/v1/chat/completions", b"/v1/chat/completions\xff", None),
    ("/v1/../v1/completions", None, None),
    ("/v1/completions/", b"/v1/completions/", None),
    ("/v2/completions", b"/v2/completions", None),
])
def test_match_is_exact_and_rejects_any_encoding(path, raw, expected):
    from gateway.endpoints import match

    assert match(path, raw) == expected


def test_a_header_the_upstream_names_in_connection_is_hop_by_hop():
    from gateway.upstream import relayed_header

    assert relayed_header("X-Request-Id") and relayed_header("Retry-After") and relayed_header("x-ratelimit-remaining-tokens")
    assert not relayed_header("X-Upstream-Session", "keep-alive, X-Upstream-Session")
    for name in ("Set-Cookie", "set-cookie2", "WWW-Authenticate", "Access-Control-Allow-Credentials", "Alt-Svc",
                 "Transfer-Encoding", "Content-Length", "Upgrade", "OpenAI-Organization"):
        assert not relayed_header(name), name
