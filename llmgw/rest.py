"""What the whole REST API shares: a field the API does not know is an error, never
silently dropped (a key created with ``"models": [...]`` instead of ``"allowed_models"``
would otherwise be a key for every model); and a failed login is always a 401 with a
``WWW-Authenticate`` challenge (:func:`exception_handler`)."""

from __future__ import annotations

from rest_framework import exceptions, serializers
from rest_framework.views import exception_handler as drf_exception_handler

#: The challenge of every 401: the token scheme (``fleet.ops.api_auth``), never ``Basic``,
#: which would make a browser pop up its password prompt over the API's pages.
CHALLENGE = "Token"


def exception_handler(exc, context):
    """DRF's handler (``{"detail": "..."}`` bodies), except that missing or wrong
    credentials (``NotAuthenticated``, ``AuthenticationFailed``) are always 401 with
    ``WWW-Authenticate: Token``. DRF itself answers them 403 from a view with no
    authentication class to name a challenge (the token endpoint, which takes a username
    and password in its body), and RFC 9110 (15.5.2) wants every 401 to carry one.
    Settings: ``REST_FRAMEWORK["EXCEPTION_HANDLER"]``."""
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        response.status_code = 401
        if "WWW-Authenticate" not in response:
            response["WWW-Authenticate"] = CHALLENGE
    return response


def wrong_credentials(errors: dict) -> bool:
    """Whether a login serializer's ``errors`` (DRF's ``AuthTokenSerializer``) say the
    username and password did not match (its ``authorization`` code), rather than that a
    field was missing or malformed (a 400)."""
    return any(getattr(e, "code", None) == "authorization" for e in errors.get("non_field_errors", ()))


class RefuseUnknownFields:
    """Mixin for a DRF serializer: input naming a field the serializer does not have
    answers 400 with ``{"<name>": ["Unknown field: the fields are a, b, c."]}``. Read-only
    fields are known (a client may send back what it read); only dict input is checked."""

    def to_internal_value(self, data):
        if isinstance(data, dict) or hasattr(data, "keys"):
            unknown = sorted(set(data.keys()) - set(self.fields))
            if unknown:
                writable = ", ".join(sorted(n for n, f in self.fields.items() if not f.read_only))
                raise serializers.ValidationError(
                    {name: [f"Unknown field: the fields are {writable}."] for name in unknown})
        return super().to_internal_value(data)
