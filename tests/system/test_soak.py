"""The randomized soak (tests/soak.py; docs/architecture.md, "Testing"): real web, worker and
three agents (two with simulated GPUs), fake engines, a seeded driver of random operations,
invariants checked against /proc every half second, convergence once the operations stop.
Two fixed seeds of 60 s each. Marked ``soak``: ``-m "not soak"`` leaves it out locally; CI
runs it. A failure prints the seed, every violation and the operation log; replay with
``bench/soak.py --seed N --minutes 1``."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from tests.soak import Soak, SoakConfig

pytestmark = [pytest.mark.soak, pytest.mark.timeout(420)]


@pytest.mark.parametrize("seed", [1, 2])
def test_the_soak_keeps_every_invariant_and_converges(django_db_setup, django_db_blocker, tmp_path, seed):
    from django.db import connection

    with django_db_blocker.unblock():
        try:
            result = Soak(SoakConfig(seed=seed, duration_s=60.0), tmp_path).run()
        finally:
            connection.close()
            call_command("flush", interactive=False, verbosity=0)
    print(result.report())
    assert result.checks > 0 and result.requests > 0, result.report(with_logs=True)
    assert not result.violations and result.converge_s is not None, result.report(with_logs=True)
