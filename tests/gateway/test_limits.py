"""Bodies and connections are bounded before work (issue 12), tried over raw sockets against
a real web process started as ``llmgw up`` starts it (uvicorn, ``llmgw.http`` protocol,
``llmgw.limits`` in front of Django) with its limits shrunk by environment variables:
oversized bodies (declared and streamed, without any key), slow bodies, slow and idle
request heads, keep-alive, and the connection limit."""

from __future__ import annotations

import json
import socket
import time

import pytest

from gateway.models import ApiKey
from llmgw.cli.web_processes import web_argv
from tests.processes import Proc, free_port, wait_for_port, wait_until, web_server
from tests.replicas import serve
from tests.upstream import RecordingUpstream

pytestmark = [pytest.mark.django_db(transaction=True)]

LIMIT = 4096
ADMIN_LIMIT = 2048
BODY_TIMEOUT_S = 2.0
HEADER_TIMEOUT_S = 1.0
KEEP_ALIVE_S = 4
MARGIN_S = 15.0  # generous: a busy 2-core machine


@pytest.fixture(scope="module")
def servers(django_db_setup, tmp_path_factory):
    logs = tmp_path_factory.mktemp("limits")
    upstream = RecordingUpstream().start()
    port = free_port()
    web = web_server(port, logs, env={
        "LLMGW_WATCH_INTERVAL": "50ms", "LLMGW_WATCH_FAST_INTERVAL": "20ms",
        "LLMGW_MAX_BODY_BYTES": str(LIMIT), "LLMGW_MAX_ADMIN_BODY_BYTES": str(ADMIN_LIMIT),
        "LLMGW_BODY_TIMEOUT": f"{BODY_TIMEOUT_S}s", "LLMGW_HEADER_TIMEOUT": f"{HEADER_TIMEOUT_S}s",
        "LLMGW_KEEP_ALIVE_TIMEOUT": f"{KEEP_ALIVE_S}s"})
    yield {"port": port, "upstream": upstream, "web": web, "logs": logs}
    web.stop()
    upstream.stop()


@pytest.fixture
def key(transactional_db) -> str:
    return ApiKey.create_key("limits")[1]


@pytest.fixture
def replica(servers, make_model, key):
    """``rep``, served by the recording upstream and routed by the web process."""
    rep = serve(make_model("rep"), servers["upstream"].port)

    def routed():
        status, headers, _ = request(servers["port"], "POST", "/v1/chat/completions",
                                     json.dumps({"model": "rep", "messages": [{"role": "user", "content": "x"}]}).encode(),
                                     {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        return status == 200 and headers.get("x-llmgw-replica", "").startswith(f"{rep.pk}@")
    wait_until(routed, timeout_s=15, what="rep to be routed")
    return rep


# --- raw HTTP over a socket ------------------------------------------------------------------------


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=MARGIN_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def head(method: str, target: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Closed(Exception):
    """The server closed the connection before a whole response arrived."""


def read_response(sock: socket.socket, timeout_s: float = MARGIN_S) -> tuple[int, dict[str, str], bytes]:
    """One response (status, lower-cased headers, body by Content-Length); Closed if the
    connection ends first."""
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        got = _recv(sock)
        if not got:
            raise Closed(data)
        data += got
    raw_head, body = data.split(b"\r\n\r\n", 1)
    lines = raw_head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while not (body.endswith(b"0\r\n\r\n") and (body == b"0\r\n\r\n" or body.endswith(b"\r\n0\r\n\r\n"))):
            got = _recv(sock)
            if not got:
                raise Closed(data + body)
            body += got
        return status, headers, _dechunk(body)
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        got = _recv(sock)
        if not got:
            raise Closed(data + body)
        body += got
    return status, headers, body


def _dechunk(data: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return out
        out, data = out + data[:size], data[size + 2:]


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""


def closed_within(sock: socket.socket, timeout_s: float) -> bytes | None:
    """What the server sent until it closed the connection, or None if it was still open
    after ``timeout_s``."""
    sock.settimeout(0.2)
    received = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            got = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return received
        if not got:
            return received
        received += got
    return None


def nothing_yet(sock: socket.socket, wait_s: float = 0.5) -> bool:
    """True when the server has sent nothing within ``wait_s`` (and not closed)."""
    sock.settimeout(wait_s)
    try:
        sock.recv(1, socket.MSG_PEEK)  # data, or b"" for a close: either way, not "nothing"
        return False
    except socket.timeout:
        return True


def request(port: int, method: str, target: str, body: bytes = b"", headers: dict | None = None):
    with connect(port) as sock:
        sock.sendall(head(method, target, {"Content-Length": str(len(body)), **(headers or {})}) + body)
        return read_response(sock)


def error_code(body: bytes) -> str:
    return json.loads(body)["error"]["code"]


# --- body size ------------------------------------------------------------------------------------


def test_an_oversized_content_length_is_a_413_before_any_byte_of_the_body(servers):
    with connect(servers["port"]) as sock:
        sock.sendall(head("POST", "/v1/chat/completions", {"Content-Length": "1000000000",
                                                           "Content-Type": "application/json",
                                                           "Expect": "100-continue"}))
        status, headers, body = read_response(sock)  # no body was sent: it is not waited for
    assert status == 413 and error_code(body) == "request_too_large"
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    assert headers["connection"] == "close"


def test_an_oversized_chunked_body_without_a_key_is_a_413_while_the_client_is_still_sending(servers):
    upstream = servers["upstream"]
    before = upstream.count()
    with connect(servers["port"]) as sock:
        sock.sendall(head("POST", "/v1/chat/completions", {"Transfer-Encoding": "chunked",
                                                           "Content-Type": "application/json"}))
        sent = 0
        while sent < LIMIT:  # up to the limit: still within it, so no answer yet
            sock.sendall(chunk(b" " * 1024))
            sent += 1024
        assert nothing_yet(sock), "answered before the body passed the limit"
        sock.sendall(chunk(b" " * 1024))  # now past it, with much more "to come"
        status, headers, body = read_response(sock)
    assert status == 413 and error_code(body) == "request_too_large"
    assert upstream.since(before) == []  # and no 401: the key was never looked at


def test_an_oversized_chunked_body_with_a_key_reaches_nothing_and_a_small_one_is_served(servers, replica, key):
    upstream = servers["upstream"]
    before = upstream.count()
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    big = json.dumps({"model": "rep", "messages": [{"role": "user", "content": "x" * (2 * LIMIT)}]}).encode()
    with connect(servers["port"]) as sock:
        sock.sendall(head("POST", "/v1/chat/completions", auth) + b"".join(chunk(big[i:i + 1000])
                                                                          for i in range(0, len(big), 1000)))
        status, _, body = read_response(sock)
    assert status == 413 and error_code(body) == "request_too_large"
    assert upstream.since(before) == []
    small = json.dumps({"model": "rep", "messages": [{"role": "user", "content": "hello"}]}).encode()
    with connect(servers["port"]) as sock:
        sock.sendall(head("POST", "/v1/chat/completions", auth) + chunk(small[:10]) + chunk(small[10:]) + b"0\r\n\r\n")
        status, _, body = read_response(sock)
    assert status == 200, body
    assert [json.loads(r["body"])["messages"] for r in upstream.since(before)] == [[{"role": "user", "content": "hello"}]]


def test_the_admin_and_api_have_their_own_smaller_limit_in_their_own_shape(servers):
    status, _, body = request(servers["port"], "POST", "/api/models/", b"{" + b" " * ADMIN_LIMIT + b"}",
                              {"Content-Type": "application/json"})
    assert status == 413 and "over the limit" in json.loads(body)["detail"]
    status, _, body = request(servers["port"], "POST", "/admin/login/", b"x" * (ADMIN_LIMIT + 1),
                              {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 413 and body.startswith(b"Payload Too Large")
    # Under the gateway's limit but over the admin's: /v1/ takes it (and says 401: no key).
    status, _, body = request(servers["port"], "POST", "/v1/chat/completions", b"{" + b" " * ADMIN_LIMIT + b"}",
                              {"Content-Type": "application/json"})
    assert status == 401


def test_a_content_length_that_is_not_a_number_is_a_400(servers):
    with connect(servers["port"]) as sock:
        sock.sendall(head("POST", "/v1/chat/completions", {"Content-Length": "5", "content-length": "6"}) + b"{}")
        got = closed_within(sock, MARGIN_S)
    assert got is not None and got.startswith(b"HTTP/1.1 400")  # uvicorn's parser or ours: never a body read


# --- slow clients ---------------------------------------------------------------------------------


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_closed(servers):
    with connect(servers["port"]) as sock:
        started = time.monotonic()
        sock.sendall(head("POST", "/v1/chat/completions", {"Content-Length": "200",
                                                           "Content-Type": "application/json"}) + b'{"model": ')
        status, headers, body = read_response(sock, timeout_s=BODY_TIMEOUT_S + MARGIN_S)
        elapsed = time.monotonic() - started
        assert closed_within(sock, MARGIN_S) is not None
    assert status == 408 and error_code(body) == "request_timeout" and headers["connection"] == "close"
    assert BODY_TIMEOUT_S * 0.75 <= elapsed <= BODY_TIMEOUT_S + MARGIN_S


def test_a_trickled_chunked_body_has_one_deadline_for_the_whole_body(servers):
    with connect(servers["port"]) as sock:
        started = time.monotonic()
        sock.sendall(head("POST", "/v1/embeddings", {"Transfer-Encoding": "chunked"}))
        sock.settimeout(0.4)
        answer = b""
        while time.monotonic() - started < BODY_TIMEOUT_S + MARGIN_S:
            try:
                sock.sendall(chunk(b" "))  # a byte every 0.4 s: each chunk is prompt, the body never ends
                answer = sock.recv(65536)
                if answer:
                    break
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert elapsed <= BODY_TIMEOUT_S + MARGIN_S


def test_a_request_head_that_does_not_finish_is_a_408_and_closed(servers):
    with connect(servers["port"]) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
        got = closed_within(sock, HEADER_TIMEOUT_S + MARGIN_S)
        elapsed = time.monotonic() - started
    assert got is not None and got.startswith(b"HTTP/1.1 408"), got
    assert HEADER_TIMEOUT_S * 0.75 <= elapsed


def test_a_head_trickled_a_byte_at_a_time_is_closed_at_the_deadline(servers):
    line = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 10_000
    with connect(servers["port"]) as sock:
        started = time.monotonic()
        closed = False
        for byte in line:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if closed_within(sock, 0.2) is not None:
                closed = True
                break
            if time.monotonic() - started > HEADER_TIMEOUT_S + MARGIN_S:
                break
        elapsed = time.monotonic() - started
    assert closed, "a slowloris head kept its connection"
    assert HEADER_TIMEOUT_S * 0.75 <= elapsed <= HEADER_TIMEOUT_S + MARGIN_S


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(servers):
    with connect(servers["port"]) as sock:
        got = closed_within(sock, HEADER_TIMEOUT_S + MARGIN_S)
    assert got == b""


def test_keep_alive_still_works_and_an_idle_connection_is_closed_after_its_timeout(servers):
    with connect(servers["port"]) as sock:
        for _ in range(2):
            sock.sendall(head("GET", "/v1/models", {}))
            status, headers, _ = read_response(sock)
            assert status == 401 and headers.get("connection") != "close"
            time.sleep(HEADER_TIMEOUT_S * 1.5)  # idle longer than the head timeout: keep-alive's turn
        started = time.monotonic()
        assert closed_within(sock, KEEP_ALIVE_S + MARGIN_S) == b""
    assert time.monotonic() - started <= KEEP_ALIVE_S + MARGIN_S


# --- connections ----------------------------------------------------------------------------------


def test_connections_beyond_the_limit_get_503_and_the_server_recovers(tmp_path):
    port = free_port()
    web = Proc(web_argv("127.0.0.1", port, access_log=False, max_connections=4), tmp_path / "web.log",
               env={"DJANGO_SETTINGS_MODULE": "llmgw.settings", "LLMGW_HEADER_TIMEOUT": "60s"})
    held: list[socket.socket] = []
    try:
        wait_for_port(port, proc=web.proc)

        def status_of_a_new_request():
            try:
                return request(port, "GET", "/v1/models")[0]
            except (Closed, OSError):
                return None
        wait_until(lambda: status_of_a_new_request() == 401, timeout_s=MARGIN_S, what="the web process to serve")
        held = [connect(port) for _ in range(4)]  # idle connections hold their slots
        wait_until(lambda: status_of_a_new_request() == 503, timeout_s=MARGIN_S, what="a 503 at the limit")
        # An agent's websocket upgrade is not refused by the limit: it reaches the consumer,
        # which refuses this one for its (missing) token.
        with connect(port) as sock:
            sock.sendall(head("GET", "/ws/agent/", {"Upgrade": "websocket", "Connection": "Upgrade",
                                                    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                                                    "Sec-WebSocket-Version": "13"}))
            status, _, _ = read_response(sock)
        assert status == 403
        for sock in held:
            sock.close()
        wait_until(lambda: status_of_a_new_request() == 401, timeout_s=MARGIN_S, what="the server to recover")
    finally:
        for sock in held:
            sock.close()
        web.stop()
    assert "Exceeded concurrency limit" in web.log()


def test_llmgw_up_passes_the_connection_settings_to_uvicorn(settings):
    argv = web_argv("127.0.0.1", 8000)
    assert argv[argv.index("--limit-concurrency") + 1] == str(settings.LLMGW_MAX_CONNECTIONS)
    assert argv[argv.index("--backlog") + 1] == str(settings.LLMGW_BACKLOG)
    assert argv[argv.index("--http") + 1] == "llmgw.http:HeaderTimeoutProtocol"
    argv = web_argv("127.0.0.1", 8000, max_connections=7, backlog=9, keep_alive_s=2.5)
    assert argv[argv.index("--limit-concurrency") + 1] == "7" and argv[argv.index("--backlog") + 1] == "9"
    assert argv[argv.index("--timeout-keep-alive") + 1] == "3"
