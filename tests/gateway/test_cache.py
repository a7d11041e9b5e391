"""The gateway's in-memory keys and models (gateway.cache): what one refresh reads."""

from __future__ import annotations

import pytest
from django.db import connection

from gateway import cache
from gateway.models import ApiKey

pytestmark = pytest.mark.django_db


def test_a_key_committed_between_the_refreshs_queries_is_never_cached_without_its_model_limits(make_model):
    """On PostgreSQL each query of a refresh sees the database as of its own start. A key
    and its model limits are committed together (``ApiKey.create_key``); if the commit lands
    after the refresh read one table and before it read the other, the cache must not hold
    the key with no limits — that is a key allowed every model (a CI run under load saw a 200
    where a 403 was due)."""
    make_model("plain")
    make_model("other")
    created = []

    def commit_lands_after_the_first_query(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not created and '"gateway_apikey' in sql:
            created.append(True)  # once: the key and its limits, as another process commits them
            ApiKey.create_key("narrow", ["plain"])
        return result

    with connection.execute_wrapper(commit_lands_after_the_first_query):
        loaded = cache.load()
    assert created
    narrow = [k for keys in loaded[cache._KEYS].values() for k in keys if k.name == "narrow"]
    # Either not there yet (the gateway looks it up on first use) or there with its limit.
    assert all(k.allowed_model_ids for k in narrow)
    # The next refresh has it, limited to its one model.
    again = [k for keys in cache.load()[cache._KEYS].values() for k in keys if k.name == "narrow"]
    assert len(again) == 1 and len(again[0].allowed_model_ids) == 1
