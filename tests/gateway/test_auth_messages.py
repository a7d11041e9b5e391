"""A key sent to /v1/ the wrong way is told how to send it (``Authorization: Bearer KEY``),
with OpenAI's 401 and ``WWW-Authenticate: Bearer``, and the key is never repeated back
(``gateway.auth.missing_key_message``)."""

from __future__ import annotations

import pytest
from django.test import AsyncClient

from gateway.auth import missing_key_message
from gateway.models import ApiKey

SEND = "send 'Authorization: Bearer YOUR_KEY'"

# The async views read keys from another thread: the rows must be committed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def key() -> str:
    return ApiKey.create_key("messages")[1]


@pytest.mark.parametrize("shape,said", [
    ("{key}", "lacks the word Bearer"),
    ("Token {key}", "uses the scheme 'Token'"),
    ("Basic {key}", "uses the scheme 'Basic'"),
    ("Bearer: {key}", "has a colon after Bearer"),
    ("Bearer:{key}", "has a colon after Bearer"),
    ("{key} extra", "does not start with the word Bearer"),
    ("Bearer\t{key}", "has Bearer followed by a tab, not a space"),
    ("Bearer,{key}", "has Bearer followed by a comma, not a space"),
    ("Bearer\u00a0{key}", "has Bearer followed by a non-breaking space, not a space"),
])
async def test_a_key_sent_without_the_word_bearer_is_told_how_to_send_it(key, shape, said):
    answer = await AsyncClient().get("/v1/models", headers={"Authorization": shape.format(key=key)})
    assert answer.status_code == 401 and answer["WWW-Authenticate"] == "Bearer"
    error = answer.json()["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "authentication_error"
    assert said in error["message"] and SEND in error["message"], error["message"]
    assert key not in answer.content.decode() and key[:16] not in answer.content.decode()


@pytest.mark.parametrize("header", ["x-api-key", "api-key"])
async def test_a_key_in_another_providers_header_is_told_where_it_goes(key, header):
    answer = await AsyncClient().get("/v1/models", headers={header: key})
    assert answer.status_code == 401
    message = answer.json()["error"]["message"]
    assert f"does not read the {header} header" in message and SEND in message
    assert key not in answer.content.decode()


async def test_the_right_shape_still_works_and_a_bare_bearer_is_missing_its_key(key):
    assert (await AsyncClient().get("/v1/models", headers={"Authorization": f"Bearer {key}"})).status_code == 200
    answer = await AsyncClient().get("/v1/models", headers={"Authorization": "Bearer"})
    assert answer.status_code == 401 and "Missing API key after 'Bearer'" in answer.json()["error"]["message"]


def test_no_header_at_all_says_the_key_is_missing():
    assert missing_key_message(None) == f"Missing API key: {SEND} (create one with `llmgw keys create`)."


def test_a_scheme_that_could_be_part_of_a_key_is_never_shown():
    for header in ("llmgw-key-AbC s", "sk-abcdefghijklmnopqrstuvwxyz0123456789 x", "a" * 30 + " b",
                   "sk-live-secretword extra", "hunter2 x"):
        message = missing_key_message(header)
        assert "does not start with the word Bearer" in message and header.split()[0] not in message, message
