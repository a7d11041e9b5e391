"""Server-sent events relayed event by event, byte for byte.

The upstream's bytes are cut only at event boundaries (a blank line), never decoded and
re-encoded, so a multi-byte character split across network chunks reaches the client
intact. The relay reads the JSON only of events that mention ``"usage"`` (to record it
and drop the usage-only chunk that the gateway asked for on the client's behalf); other
events are counted as content chunks by a byte check (:func:`may_have_content`).
"""

from __future__ import annotations

import json
import re

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")
# A "content" or "text" key whose value is a non-empty string (not null, "" or a list).
_CONTENT = re.compile(rb'"(?:content|text)"\s*:\s*"(?!")')


def split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete events (each with its terminating blank line) and the unfinished rest.
    Without a ``\r`` in the buffer (every engine here ends lines with ``\n``) one
    ``bytes.split`` does it, the same cuts as the regular expression's, a tenth of its cost
    for a chunk of twenty events."""
    if b"\r" not in buffer:
        parts = buffer.split(b"\n\n")
        rest = parts.pop()
        return [part + b"\n\n" for part in parts], rest
    events = []
    start = 0
    for match in _BOUNDARY.finditer(buffer):
        events.append(buffer[start:match.end()])
        start = match.end()
    return events, buffer[start:]


def event_json(event: bytes) -> dict | None:
    """The JSON object carried by an event's ``data:`` lines, or None ([DONE], comments)."""
    lines = [line[5:].lstrip() for line in event.splitlines() if line.startswith(b"data:")]
    if not lines:
        return None
    payload = b"\n".join(lines)
    if payload.strip() == b"[DONE]":
        return None
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


_FINAL_EVENTS = (b"response.completed", b"response.failed", b"response.incomplete", b"message_stop")


def is_done(event: bytes) -> bool:
    """The event that ends a stream: ``data: [DONE]`` (chat and completions), or the
    Responses API's ``response.completed``/``failed``/``incomplete`` and Anthropic-style
    ``message_stop`` events (which engines serving those APIs send instead)."""
    if b"[DONE]" in event and any(line[5:].strip() == b"[DONE]" for line in event.splitlines()
                                  if line.startswith(b"data:")):
        return True
    return any(line[6:].strip() in _FINAL_EVENTS for line in event.splitlines() if line.startswith(b"event:"))


def is_usage_only(data: dict) -> bool:
    """The final chunk ``stream_options.include_usage`` adds: no choices, a usage object."""
    return not data.get("choices") and isinstance(data.get("usage"), dict)


def has_content(data: dict) -> bool:
    """A chunk that carries generated text (chat delta content or completion text)."""
    for choice in data.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta") or {}
        if (isinstance(delta, dict) and delta.get("content")) or choice.get("text"):
            return True
    return False


def may_have_content(event: bytes) -> bool:
    """:func:`has_content` without parsing: a ``"content"``/``"text"`` key with a non-empty
    string value somewhere in the event (used to count chunks when there is no usage)."""
    return _CONTENT.search(event) is not None
