"""The helpers every surface shares, one of each: the Authorization parser and the token
lookup (``llmgw.tokens``), the port check (``fleet.protocol.port_free``), the integer check
(``llmgw.integers``) and the process name (``llmgw.process_name``)."""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass

import pytest

from fleet.protocol import port_free
from llmgw import integers, tokens
from llmgw.process_name import process_name, this_process

# -- the Authorization parser -----------------------------------------------------------


@pytest.mark.parametrize(("header", "expected"), [
    ("Bearer abc", "abc"),
    ("bearer abc", "abc"),
    ("BEARER abc", "abc"),
    ("Bearer   abc  ", "abc"),  # white space around the token is not part of it
    ("Bearer a b", "a b"),  # everything after the scheme's space, stripped
])
def test_a_bearer_header_gives_its_token(header, expected):
    assert tokens.token_from_authorization(header) == expected


@pytest.mark.parametrize("header", [
    None, "", " ", "Bearer", "Bearer ", "Bearer    ", " Bearer abc", "Bearer\tabc", "Basic dXNlcjpwdw==",
    "Token abc", "Bearerabc",
])
def test_no_token_from_an_empty_header_another_scheme_or_an_empty_token(header):
    assert tokens.token_from_authorization(header) is None


def test_the_rest_apis_schemes_accept_token_and_bearer_alike():
    schemes = ("token", "bearer")
    assert tokens.token_from_authorization("Token llmgw-api-x", schemes) == "llmgw-api-x"
    assert tokens.token_from_authorization("tOkEn llmgw-api-x", schemes) == "llmgw-api-x"
    assert tokens.token_from_authorization("Bearer llmgw-api-x", schemes) == "llmgw-api-x"
    assert tokens.token_from_authorization("Basic llmgw-api-x", schemes) is None
    assert tokens.token_from_authorization("Token ", schemes) is None


# -- the token lookup -------------------------------------------------------------------


@dataclass
class Row:
    name: str
    sha256: str


def test_the_lookup_returns_the_candidate_whose_hash_matches():
    token = tokens.new_token("key")
    rows = [Row("other", tokens.token_hash(tokens.new_token("key"))), Row("mine", tokens.token_hash(token))]
    assert tokens.find_by_token(rows, token).name == "mine"


def test_the_lookup_finds_nothing_for_a_wrong_or_empty_token_or_no_candidates():
    token = tokens.new_token("key")
    rows = [Row("mine", tokens.token_hash(token))]
    assert tokens.find_by_token(rows, token + "x") is None
    assert tokens.find_by_token(rows, "") is None
    assert tokens.find_by_token([], token) is None


def test_a_candidate_without_a_stored_hash_never_matches():
    assert tokens.find_by_token([Row("blank", "")], tokens.new_token("agent")) is None


def test_the_lookup_reads_the_hash_attribute_it_is_told():
    @dataclass
    class AgentRow:
        token_sha256: str

    token = tokens.new_token("agent")
    row = AgentRow(tokens.token_hash(token))
    assert tokens.find_by_token([row], token, "token_sha256") is row


# -- the port check ---------------------------------------------------------------------


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize(("family", "host"), [
    (socket.AF_INET, "127.0.0.1"),
    pytest.param(socket.AF_INET6, "::1", marks=pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback")),
])
def test_a_listening_port_is_taken_and_free_once_closed(family, host):
    with socket.socket(family, socket.SOCK_STREAM) as taken:
        taken.bind((host, 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert port_free(host, port) is False
    assert port_free(host, port) is True


def test_a_host_name_is_checked_as_ipv4():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert port_free("localhost", taken.getsockname()[1]) is False


def test_an_address_of_another_machine_raises_rather_than_answering_taken():
    with pytest.raises(OSError) as caught:
        port_free("192.0.2.1", 20000)  # TEST-NET-1: never this machine's
    assert caught.value.errno == errno.EADDRNOTAVAIL


# -- the integer check ------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    (0, True), (7, True), (-3, True), (True, False), (False, False), (1.0, False), ("1", False), (None, False),
])
def test_an_integer_is_an_int_and_never_a_bool(value, expected):
    assert integers.is_int(value) is expected


@pytest.mark.parametrize(("value", "expected"), [
    (0, 0), (42, 42), (integers.INT32_MAX, integers.INT32_MAX), (integers.INT32_MAX + 1, None), (-1, None),
    (True, None), (False, None), (3.0, None), ("3", None), (None, None), ([], None),
])
def test_a_strict_count_is_an_int_in_range(value, expected):
    assert integers.count_or_none(value) == expected


@pytest.mark.parametrize(("value", "expected"), [
    (3.0, 3), (2.9, 2), ("12", 12), ("abc", None), (True, None), (-5, None), (float("inf"), None),
    (float("nan"), None), (None, None), (65536, None),
])
def test_a_lenient_count_reads_what_int_reads_within_its_maximum(value, expected):
    assert integers.count_or_none(value, 65535, strict=False) == expected


# -- the process name -------------------------------------------------------------------


def test_the_process_name_is_host_colon_pid_of_the_caller():
    assert this_process() == (socket.gethostname(), os.getpid())
    assert process_name() == f"{socket.gethostname()}:{os.getpid()}"


def test_an_id_from_text_is_ascii_digits_within_64_bits():
    from llmgw.integers import INT64_MAX, id_from_text

    assert id_from_text("42") == 42 and id_from_text(str(INT64_MAX)) == INT64_MAX
    for text in ("", "²", "١٢", "-1", "+1", " 1", "1.0", str(INT64_MAX + 1)):
        assert id_from_text(text) is None, text


def test_an_engine_key_never_reads_as_a_command_line_option():
    """Keys go on engines' argv (``--api-key {api_key}``): a key starting with "-" made
    argparse refuse the value (one start in 64 failed that way)."""
    from fleet.models import Replica
    from llmgw.tokens import new_engine_key

    keys = {new_engine_key() for _ in range(2000)}
    assert len(keys) == 2000
    assert all(len(k) == 64 and k[0] != "-" and k.isalnum() for k in keys)
    assert Replica._meta.get_field("engine_key").max_length >= 64
