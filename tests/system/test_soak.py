"""The randomized soak (tests/soak.py; docs/architecture.md, "Testing"): real web, worker and
three agents (two with simulated GPUs), fake engines, a seeded driver of random operations,
invariants checked against /proc every half second, convergence once the operations stop.
Two fixed seeds of 60 s each on the embedded default; in production mode (the second pass of
``.ci/run``: PostgreSQL + Redis) one seed with two web processes and two workers, as
``bench/soak.py --production`` runs it. Marked ``soak``: ``-m "not soak"`` leaves it out locally; CI
runs it. A failure prints the seed, every violation and the operation log; replay with
``bench/soak.py --seed N --minutes 1``."""

from __future__ import annotations

import os

import pytest
from django.core.management import call_command

from tests.soak import Soak, SoakConfig

pytestmark = [pytest.mark.soak, pytest.mark.timeout(420)]


#: Production mode: the settings point every process at PostgreSQL and Redis.
PRODUCTION = bool(os.environ.get("LLMGW_DATABASE_URL") and os.environ.get("LLMGW_REDIS_URL"))


@pytest.mark.parametrize("seed", [3] if PRODUCTION else [1, 2])
def test_the_soak_keeps_every_invariant_and_converges(django_db_setup, django_db_blocker, tmp_path, seed):
    from django.db import connection

    processes = 2 if PRODUCTION else 1
    with django_db_blocker.unblock():
        try:
            result = Soak(SoakConfig(seed=seed, duration_s=60.0, webs=processes, workers=processes), tmp_path).run()
        finally:
            connection.close()
            call_command("flush", interactive=False, verbosity=0)
    print(result.report())
    assert result.checks > 0 and result.requests > 0, result.report(with_logs=True)
    assert not result.violations and result.converge_s is not None, result.report(with_logs=True)
