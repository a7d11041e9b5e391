"""REST API authentication with hashed tokens (``Authorization: Token …`` or ``Bearer …``)."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication

from fleet import tokens
from fleet.models import ApiToken


class HashedTokenAuthentication(BaseAuthentication):
    """Looks the token up by its visible prefix and compares SHA-256 in constant time."""

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() not in ("token", "bearer") or not token.strip():
            return None
        token = token.strip()
        if not token.startswith("llmgw-api-"):
            return None  # not ours (e.g. basic auth or another scheme)
        for row in ApiToken.objects.select_related("user").filter(prefix=tokens.token_prefix(token)):
            if tokens.token_matches(token, row.sha256):
                if not row.user.is_active:
                    raise exceptions.AuthenticationFailed("User inactive or deleted.")
                return row.user, row
        raise exceptions.AuthenticationFailed("Invalid token.")

    def authenticate_header(self, request) -> str:
        return "Token"



class HashedTokenScheme(OpenApiAuthenticationExtension):
    """``Authorization: Token llmgw-api-…`` in the OpenAPI schema (drf-spectacular finds
    extensions by subclassing; without one it warns and leaves the scheme out)."""

    target_class = "fleet.api_auth.HashedTokenAuthentication"
    name = "llmgwToken"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "`Token llmgw-api-…` from POST /api/auth/token/ (Bearer works too)."}
