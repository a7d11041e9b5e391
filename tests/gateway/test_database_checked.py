"""``gateway.database.database_checked`` closes obsolete connections in the thread of the
async ORM before the gateway asks the database. Under Django's test clients (``client``,
``AsyncClient``, a ``TestCase``) that thread is the test's own, inside the test's
transaction — Django's test client disconnects ``close_old_connections`` from
``request_started`` for that reason. Closing it there ended the test's transaction (a 500,
then every later query failed): a connection inside an atomic block is left alone."""

from __future__ import annotations

import pytest

from catalog.models import Model


@pytest.mark.django_db
def test_v1_models_under_the_test_client_sees_the_tests_rows_and_keeps_its_transaction(client, settings, make_model):
    settings.LLMGW_GATEWAY_AUTH = False
    make_model("listed")
    r = client.get("/v1/models")
    assert r.status_code == 200, r.content
    assert [m["id"] for m in r.json()["data"]] == ["listed"]
    assert Model.objects.filter(name="listed").exists()  # the test's transaction is still there


def test_a_check_that_fails_never_skips_the_work_it_precedes(monkeypatch):
    """The check only tidies up: a connection that cannot even be checked (closing a broken
    one raised; pytest-django refusing database access in a test without the mark) must not
    stop the question after it — in the full suite it once swallowed the model's want."""
    from django.db import connections

    from gateway.database import checked

    class Unclosable:
        alias = "broken"
        in_atomic_block = False

        def close_if_unusable_or_obsolete(self):
            raise RuntimeError("cannot check")

    monkeypatch.setattr(connections, "all", lambda initialized_only=False: [Unclosable()])
    assert checked(lambda x: x + 1)(1) == 2
