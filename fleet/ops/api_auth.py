"""REST API authentication: hashed tokens (``Authorization: Token …`` or ``Bearer …``) that
expire, and HTTP basic with failed attempts throttled (``llmgw.auth_throttle``). Every
failure is a 401 with ``WWW-Authenticate: Token`` (``llmgw.rest.exception_handler``) whose
``detail`` says what was wrong without repeating the credential."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, BasicAuthentication

from llmgw import auth_throttle, tokens
from fleet.models import ApiToken


class ThrottledBasicAuthentication(BasicAuthentication):
    """DRF's HTTP basic, refused with 429 (``Retry-After``) once the username or the
    client's address has too many failed attempts in the current window; each wrong
    password (or unknown user) counts one failure for both, counted before the password is
    checked (``auth_throttle.reserve``): more basic requests *at once* from one address than
    the limit are refused too, right passwords included (scripts: use a token)."""

    def authenticate_credentials(self, userid, password, request=None):
        attempt = auth_throttle.attempt(userid, auth_throttle.client_address(request))
        answer = super().authenticate_credentials(userid, password, request)  # a failure raises: it stays counted
        attempt.succeeded()
        return answer


class HashedTokenAuthentication(BaseAuthentication):
    """Looks the token up by its visible prefix and compares SHA-256 in constant time.
    An expired token (``LLMGW_API_TOKEN_TTL`` after issue) answers 401 saying so; a use is
    recorded in ``last_used_at`` (at most once a minute per token)."""

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        token = tokens.token_from_authorization(header, schemes=("token", "bearer"))
        if token is None:
            if (header or "").strip().lower().startswith("llmgw-"):  # a bare token, no scheme
                raise exceptions.AuthenticationFailed(
                    "The Authorization header lacks its scheme: send 'Authorization: Token YOUR_TOKEN'.")
            return None  # not ours (e.g. basic auth or another scheme)
        if not token.startswith("llmgw-api-"):  # our schemes, but not one of our tokens
            if token.startswith("llmgw-"):
                raise exceptions.AuthenticationFailed(
                    "Invalid token: that is not a REST API token (llmgw-api-…); get one from POST "
                    "/api/auth/token/. Gateway keys (llmgw-key-…) are for /v1/.")
            raise exceptions.AuthenticationFailed("Invalid token.")
        row = tokens.find_by_token(ApiToken.objects.select_related("user").filter(prefix=tokens.token_prefix(token)),
                                   token)
        if row is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        if not row.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        now = timezone.now()
        if row.expired(now):
            raise exceptions.AuthenticationFailed(
                f"Token expired at {row.expires_at:%Y-%m-%d %H:%M:%S} UTC: get a new one from "
                "POST /api/auth/token/.")
        row.touch(now)
        return row.user, row

    def authenticate_header(self, request) -> str:
        return "Token"


class HashedTokenScheme(OpenApiAuthenticationExtension):
    """``Authorization: Token llmgw-api-…`` in the OpenAPI schema (drf-spectacular finds
    extensions by subclassing; without one it warns and leaves the scheme out)."""

    target_class = "fleet.ops.api_auth.HashedTokenAuthentication"
    name = "llmgwToken"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "`Token llmgw-api-…` from POST /api/auth/token/ (Bearer works too)."}


class ThrottledBasicScheme(OpenApiAuthenticationExtension):
    """HTTP basic auth (a staff user's name and password, throttled like the admin's login)
    in the OpenAPI schema; without it drf-spectacular warns once per view and leaves the
    scheme out, so the schema would not show a way the API accepts."""

    target_class = "fleet.ops.api_auth.ThrottledBasicAuthentication"
    name = "basicAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "basic",
                "description": "A staff user's name and password (failed attempts are throttled)."}
