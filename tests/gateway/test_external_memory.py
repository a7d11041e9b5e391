"""External models are served from the in-memory view, like replicas (issue 15): no database
lookup per request, and an edit of the URL or key applies within the watcher's refresh."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import HttpCommunicator

from catalog.models import Model
from gateway import cache  # registers its loader before the first refresh, as the web app does
from gateway.models import ApiKey
from tests.upstream import RecordingUpstream

pytestmark = [pytest.mark.django_db(transaction=True)]


async def _post(key: str, model: str) -> dict:
    from llmgw.asgi import application

    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "x"}]}).encode()
    communicator = HttpCommunicator(application, "POST", "/v1/chat/completions", body=body,
                                    headers=[(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                                             (b"authorization", f"Bearer {key}".encode())])
    return await communicator.get_response(timeout=10)


async def test_an_external_model_is_served_from_memory_and_follows_an_edit(watcher_cleanup, monkeypatch):
    first, second = RecordingUpstream().start(), RecordingUpstream().start()
    try:
        _, key = await sync_to_async(ApiKey.create_key)("memory")

        def external() -> Model:
            model = Model(name="ext", aliases="ext-alias", external_base_url=f"http://127.0.0.1:{first.port}/v1",
                          external_api_key="sk-first", min_replicas=0, max_replicas=0)
            model.full_clean()
            model.save()
            return model
        model = await sync_to_async(external)()
        await watcher_cleanup.refresh_now()
        assert cache.model("ext-alias").external_api_key == "sk-first"  # in memory, by its alias too

        async def no_database(cls, name):
            raise AssertionError(f"a database lookup for {name!r} on the hot path")

        monkeypatch.setattr(Model, "aresolve", classmethod(no_database))
        for name in ("ext", "ext-alias"):
            answer = await _post(key, name)
            assert answer["status"] == 200, answer
        assert [r["headers"]["authorization"] for r in first.requests] == ["Bearer sk-first"] * 2

        # An edit (URL and key together) applies at the next refresh, still without a lookup.
        await sync_to_async(Model.objects.filter(pk=model.pk).update)(
            external_base_url=f"http://127.0.0.1:{second.port}/v1", external_api_key="sk-second")
        await watcher_cleanup.refresh_now()
        answer = await _post(key, "ext")
        assert answer["status"] == 200, answer
        assert len(first.requests) == 2 and [r["headers"]["authorization"] for r in second.requests] == [
            "Bearer sk-second"]
    finally:
        from gateway.usage import usage_records

        await sync_to_async(usage_records.flush)()  # while this test's database exists (not at exit)
        first.stop()
        second.stop()
