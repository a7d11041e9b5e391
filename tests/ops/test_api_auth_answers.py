"""Every way to get the REST API's credentials wrong is a 401 with a ``WWW-Authenticate``
challenge and DRF's ``{"detail": ...}`` body saying what was wrong — never a 403 (which
says "you may not", not "who are you?"), never the credential repeated back
(``llmgw.rest.exception_handler``, ``fleet.ops.api_auth``)."""

from __future__ import annotations

import base64

import pytest
from rest_framework.exceptions import NotAuthenticated
from rest_framework.permissions import AllowAny
from rest_framework.test import APIClient, APIRequestFactory
from rest_framework.views import APIView

from fleet.models import ApiToken
from gateway.models import ApiKey

pytestmark = pytest.mark.django_db


@pytest.fixture
def ops(django_user_model):
    return django_user_model.objects.create_user("ops", password="right-horse-battery", is_staff=True)


def refused(answer, *words: str) -> str:
    """Assert ``answer`` is the API's 401 and return its detail."""
    assert answer.status_code == 401, (answer.status_code, answer.content)
    assert answer["WWW-Authenticate"] == "Token"
    assert answer["Content-Type"].startswith("application/json")
    detail = answer.json()["detail"]
    for word in words:
        assert word in detail, detail
    return detail


def test_a_wrong_password_at_the_token_endpoint_is_a_401_with_a_challenge(ops):
    answer = APIClient().post("/api/auth/token/", {"username": "ops", "password": "guess"}, format="json")
    assert refused(answer) == "Wrong username or password."
    unknown = APIClient().post("/api/auth/token/", {"username": "nobody", "password": "guess"}, format="json")
    assert refused(unknown) == "Wrong username or password."  # the same words: no user enumeration
    assert not ApiToken.objects.exists()


def test_a_token_request_missing_a_field_is_still_a_400_naming_it(ops):
    answer = APIClient().post("/api/auth/token/", {"username": "ops"}, format="json")
    assert answer.status_code == 400 and "password" in answer.json()


@pytest.mark.parametrize("header,words", [
    (None, ("credentials were not provided",)),
    ("Token not-ours", ("Invalid token",)),
    ("Bearer llmgw-api-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", ("Invalid token",)),
    ("Basic " + base64.b64encode(b"ops:guess").decode(), ("Invalid username/password",)),
])
def test_missing_or_wrong_credentials_are_401_with_a_challenge(ops, header, words):
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)
    refused(client.get("/api/cluster/"), *words)


def test_a_token_sent_without_its_scheme_is_told_how_to_send_it(ops):
    token = ApiToken.issue(ops)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=token)
    detail = refused(client.get("/api/cluster/"), "Authorization: Token YOUR_TOKEN")
    assert token not in detail and token[:20] not in detail


def test_a_gateway_key_sent_to_the_rest_api_is_told_apart(ops):
    _, key = ApiKey.create_key("for-v1")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    detail = refused(client.get("/api/cluster/"), "not a REST API token", "/v1/", "POST /api/auth/token/")
    assert key not in detail and key[:20] not in detail


def test_an_authentication_failure_in_a_view_without_authentication_classes_is_still_a_401():
    """DRF answers such a view's NotAuthenticated with 403 (it has no class to name a
    challenge); the project's handler makes it the 401 it is."""

    class NoClasses(APIView):
        authentication_classes = ()
        permission_classes = (AllowAny,)

        def get(self, request):
            raise NotAuthenticated()

    answer = NoClasses.as_view()(APIRequestFactory().get("/x/"))
    assert answer.status_code == 401 and answer["WWW-Authenticate"] == "Token"
    assert answer.data == {"detail": "Authentication credentials were not provided."}


def test_a_permission_refused_to_a_known_user_stays_a_403(django_user_model):
    django_user_model.objects.create_user("guest", password="another-long-secret", is_staff=False)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(b"guest:another-long-secret").decode())
    assert client.get("/api/cluster/").status_code == 403
