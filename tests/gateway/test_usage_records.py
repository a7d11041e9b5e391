"""The gateway's usage buffer: one bad value never blocks the others; an unreachable
database keeps rows for the next try (within a bound); only counts are taken as tokens."""

from __future__ import annotations

import pytest
from django.db import OperationalError
from django.utils import timezone

from gateway import usage
from gateway.models import UsageRecord
from gateway.exchange import Exchange

pytestmark = [pytest.mark.django_db(transaction=True)]  # flush() closes old connections


def row(**over):
    fields = dict(at=timezone.now(), key_id=None, model_name="m", replica_id=None, path="chat/completions",
                  status=200, stream=False, prompt_tokens=1, completion_tokens=2, ttft_ms=1.0, total_ms=2.0,
                  overhead_ms=0.5)
    fields.update(over)
    return fields


def test_a_row_the_database_refuses_is_dropped_and_the_rest_written(caplog):
    buffer = usage.UsageBuffer()
    for fields in (row(model_name="a"), row(model_name="b", prompt_tokens="abc"), row(model_name="c")):
        buffer.add(**fields)
    assert buffer.flush() == 2
    mine = UsageRecord.objects.filter(model_name__in="abcd")  # a web process of another module may flush late
    assert sorted(mine.values_list("model_name", flat=True)) == ["a", "c"]
    assert "dropped a usage record" in caplog.text
    buffer.add(**row(model_name="d"))
    assert buffer.flush() == 1  # nothing stuck behind the bad row
    assert sorted(mine.values_list("model_name", flat=True)) == ["a", "c", "d"] and buffer.take() == []


def test_an_unreachable_database_keeps_the_rows_within_a_bound(monkeypatch):
    buffer = usage.UsageBuffer()
    monkeypatch.setattr(usage, "MAX_BUFFERED_ROWS", 3)

    def down(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr(usage, "_insert", down)  # the batch's write
    for name in "abcde":
        buffer.add(**row(model_name=name))
    with pytest.raises(OperationalError):
        buffer.flush()
    assert [r["model_name"] for r in buffer.take()] == ["c", "d", "e"]  # the oldest went


def test_only_counts_are_taken_as_token_usage():
    ex = Exchange("chat/completions")
    ex.note_usage({"usage": {"prompt_tokens": "abc", "completion_tokens": -1}})
    assert (ex.prompt_tokens, ex.completion_tokens) == (None, None)
    ex.note_usage({"usage": {"prompt_tokens": 10**40, "completion_tokens": True}})
    assert (ex.prompt_tokens, ex.completion_tokens) == (None, None)
    ex.note_usage({"usage": {"prompt_tokens": 7, "completion_tokens": 3}})
    assert (ex.prompt_tokens, ex.completion_tokens) == (7, 3)


@pytest.mark.parametrize("status, body, sent, message, code", [
    (400, {"object": "error", "message": "This model's maximum context length is 2048", "type": "BadRequestError",
           "code": 400}, 400, "This model's maximum context length is 2048", "context_length_exceeded"),
    (400, {"error": "context length exceeded: 5000 > 4096"}, 400, "context length exceeded: 5000 > 4096",
     "context_length_exceeded"),
    (404, {"error": "model 'x' not found"}, 404, "model 'x' not found", "model_not_found"),
    (404, {"detail": "Not Found"}, 404, "has no endpoint /v1/foo", "unknown_endpoint"),
    (422, {"detail": [{"loc": ["body", "n"], "msg": "bad", "type": "int_type"}]}, 400, "bad", None),
    (503, None, 502, "upstream busy", "engine_error"),
    (500, None, 502, "failed (500)", "engine_error"),
])
def test_an_engines_error_keeps_its_own_words_in_openais_shape(status, body, sent, message, code):
    import json

    from gateway.relay import engine_error_response

    ex = Exchange("foo")
    ex.model_label = "m"
    raw = json.dumps(body).encode() if body is not None else (b"upstream busy" if status == 503 else b"")
    answer = engine_error_response(status, "application/json" if body is not None else "text/plain", raw, ex)
    error = json.loads(answer.content)["error"]
    assert answer.status_code == sent and message in error["message"], error
    assert code is None or error["code"] == code, error


def test_the_events_that_end_a_stream():
    from gateway import sse

    assert sse.is_done(b"data: [DONE]\n\n") and sse.is_done(b"data:[DONE]\r\n\r\n")
    assert sse.is_done(b"event: response.completed\ndata: {\"type\": \"response.completed\"}\n\n")
    assert sse.is_done(b"event: message_stop\ndata: {}\n\n")
    assert not sse.is_done(b'data: {"choices": [{"delta": {"content": "[DONE]"}}]}\n\n')
    assert not sse.is_done(b"event: response.output_text.delta\ndata: {}\n\n")


def test_a_flushed_row_reads_back_as_it_was_added():
    buffer = usage.UsageBuffer()
    at = timezone.now()
    buffer.add(**row(at=at, model_name="rt", stream=True, upstream_status=500, team_id=7, ttft_ms=1.25))
    buffer.add(**{k: v for k, v in row(model_name="rt-defaults").items() if k not in ("at", "stream")})
    assert buffer.flush() == 2
    got = UsageRecord.objects.get(model_name="rt")
    assert (got.at, got.stream, got.upstream_status, got.team_id, got.ttft_ms, got.total_ms, got.prompt_tokens) == (
        at, True, 500, 7, 1.25, 2.0, 1)
    defaulted = UsageRecord.objects.get(model_name="rt-defaults")
    assert defaulted.stream is False and abs((defaulted.at - at).total_seconds()) < 3600
