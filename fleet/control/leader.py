"""The leader loop: which worker runs the passes on the cadence, and failover in seconds.

Every ``llmgw worker`` runs one ``LeaderLoop`` in its main process, beside (not inside) its
django-q2 cluster: the sentinel, pusher, monitor and task workers are forked before the
loop starts, are recycled at will, and a task they run may last; the loop's process does
none of that. Each ``LLMGW_LEADER_RENEW`` (1 s) the loop renews the lease if it holds it or
takes it if it is free or expired (``LeaderLease.take_or_renew``), and refreshes its own
``ControlPlane`` row. The holder runs a pass every ``LLMGW_RECONCILE_INTERVAL`` in a thread
of its own (so a long pass never delays the renewal); the others stand by. A leader killed
with SIGKILL is replaced within ``LLMGW_LEADER_LEASE`` + one renewal; one that stops
cleanly releases the lease and a standby takes it at its next renewal
(docs/architecture.md, "Crossing processes": the leader lease).

Passes still serialise through ``PassLock`` (``reconcile``), so a pass requested through
the task queue (``request_pass``), run by any worker, never overlaps the leader's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, connections
from django.utils import timezone

from fleet.control.planes import holder_id
from fleet.control.reconciler import reconcile
from fleet.models import ControlPlane, LeaderLease

log = logging.getLogger(__name__)


class LeaderLoop:
    """One worker's side of the leader lease.

    ``step()`` is one renewal (tests call it with an injected ``clock``); ``run(stop)``
    repeats it until ``stop`` is set, running passes while leading, and releases the lease
    on the way out. ``holder`` defaults to this process's ``host:pid``; ``run_pass`` to
    ``reconcile`` (returns the passes run).
    """

    def __init__(self, holder: str | None = None, clock: Callable[[], datetime] = timezone.now,
                 run_pass: Callable[[], int] = reconcile) -> None:
        self.holder = holder or holder_id()
        self.clock = clock
        self.run_pass = run_pass
        self.leading = False
        self._pass_due = threading.Event()
        self._last_heartbeat: datetime | None = None

    def step(self) -> bool:
        """Renew or take the lease once; returns whether this loop leads now. A database
        error counts as not leading (the lease will expire unless renewed)."""
        now = self.clock()
        try:
            _fresh_connections()  # a connection a database restart broke is replaced here
            leading = LeaderLease.take_or_renew(self.holder, now, settings.LLMGW_LEADER_LEASE_S)
            if self._last_heartbeat is None or (now - self._last_heartbeat).total_seconds() >= \
                    settings.LLMGW_CONTROL_PLANE_HEARTBEAT_S:
                ControlPlane.heartbeat(ControlPlane.Role.WORKER)
                self._last_heartbeat = now
        except DatabaseError as exc:
            log.warning("leader lease: database unavailable (%s)", str(exc).strip().splitlines()[0] if str(exc).strip()
                        else type(exc).__name__)
            _fresh_connections()
            leading = False
        if leading and not self.leading:
            log.info("leader: %s took the lease; running the passes", self.holder)
            self._pass_due.set()  # a new leader runs a pass at once: the old one may have died mid-cadence
        elif self.leading and not leading:
            log.warning("leader: %s lost the lease; standing by", self.holder)
        self.leading = leading
        return leading

    def release(self) -> None:
        """Give the lease up and unregister (a clean stop); database errors are logged."""
        self.leading = False
        try:
            LeaderLease.release(self.holder)
            ControlPlane.forget(ControlPlane.Role.WORKER)
        except DatabaseError:
            log.warning("leader: could not release the lease (it expires by itself)", exc_info=True)

    def run(self, stop: threading.Event, alive: Callable[[], bool] = lambda: True) -> None:
        """Renew every ``LLMGW_LEADER_RENEW`` until ``stop`` is set or ``alive()`` turns
        False (the worker's task cluster died), then release the lease and let a pass under
        way finish (at most ``LLMGW_WORKER_STOP_GRACE``)."""
        passes = threading.Thread(target=self._pass_loop, args=(stop,), name="llmgw-passes", daemon=True)
        passes.start()
        try:
            while not stop.is_set() and alive():
                self.step()
                stop.wait(settings.LLMGW_LEADER_RENEW_S)
        finally:
            stop.set()
            self._pass_due.set()
            self.release()
            # A pass under way finishes (and lets go of the pass lock) rather than dying
            # with the process, which would hold the next pass up for the lock's TTL.
            passes.join(settings.LLMGW_WORKER_STOP_GRACE_S)
            connections.close_all()

    def _pass_loop(self, stop: threading.Event) -> None:
        """While leading, a pass every ``LLMGW_RECONCILE_INTERVAL`` (at once on taking the
        lease). A failed pass is logged and the cadence goes on."""
        try:
            while not stop.is_set():
                self._pass_due.wait(settings.LLMGW_RECONCILE_INTERVAL_S)
                self._pass_due.clear()
                if stop.is_set() or not self.leading:
                    continue
                try:
                    _fresh_connections()
                    self.run_pass()
                except DatabaseError as exc:
                    log.warning("leader: pass skipped, database unavailable (%s)", type(exc).__name__)
                except Exception:
                    log.exception("leader: pass failed")
        finally:
            connections.close_all()


def _fresh_connections() -> None:
    """Drop connections that broke or outlived ``CONN_MAX_AGE`` (as Django does between
    requests), unless the caller is inside a transaction (a test's), which that would end."""
    if not connection.in_atomic_block:
        close_old_connections()
