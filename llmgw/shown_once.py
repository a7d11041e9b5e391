"""The admin's page for secrets shown once (a new API key, an agent's token).

The secret is rendered in the response to the request that created it and kept nowhere:
not in Django's messages (the default storage is a cookie, so the secret would sit in the
browser's cookie jar and in any proxy log), not in the session. ``Cache-Control: no-store``
keeps it out of caches (docs/architecture.md, "Security": shown-once secrets).
"""

from __future__ import annotations

from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers
from rest_framework.response import Response


def shown_once_response(request, admin_site, *, title: str, explanation: str, secrets: list[tuple[str, str]],
                        back: str, usage: str = "") -> TemplateResponse:
    """A page showing ``secrets`` (label, clear secret) once, with a link to ``back``."""
    context = {**admin_site.each_context(request), "title": title, "explanation": explanation,
               "secrets": secrets, "back": back, "usage": usage}
    response = TemplateResponse(request, "admin/llmgw/shown_once.html", context)
    add_never_cache_headers(response)
    return response


def shown_once_api_response(data, status: int = 200):
    """A REST answer that carries a secret (a new agent token, API key or REST token):
    ``Cache-Control: no-store`` as on the admin's page, so no cache in between keeps it."""
    response = Response(data, status=status)
    add_never_cache_headers(response)
    return response
