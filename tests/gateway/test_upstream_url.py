"""The client's query string on the upstream URL (``gateway.upstream.upstream_url``): kept
byte for byte where it is a valid query, bytes that may not be in one encoded."""

from __future__ import annotations

import pytest

from gateway.upstream import upstream_url

BASE = "http://127.0.0.1:9/v1/chat/completions"


@pytest.mark.parametrize("query", [b"a=1", b"a=%2F&b=%2f", b"x=%E2%9C%93", b"k=a+b", b"flag", b"a=1&a=2",
                                   b"p=/x?y:z@w", b"e=", b"%41=%42"])
def test_a_valid_query_is_sent_byte_for_byte(query):
    assert upstream_url(BASE, query).raw_query_string == query.decode()
    assert str(upstream_url(BASE, query)) == f"{BASE}?{query.decode()}"


@pytest.mark.parametrize("query, sent", [
    (b"a=b c", "a=b%20c"),
    (b"a=\r\nHost: evil", "a=%0D%0AHost:%20evil"),
    (b"a=#frag", "a=%23frag"),
    (b"a=50%", "a=50%25"),
    (b"a=%zz", "a=%25zz"),
    (b"a=\xe2\x9c\x93", "a=%E2%9C%93"),
    (b'a="<>', "a=%22%3C%3E"),
])
def test_bytes_that_cannot_be_in_a_query_are_percent_encoded(query, sent):
    assert upstream_url(BASE, query).raw_query_string == sent


def test_no_query_leaves_the_url_alone():
    assert upstream_url(BASE, b"") == BASE
