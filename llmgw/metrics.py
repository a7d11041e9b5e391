"""The process's Prometheus registry, which ``/metrics`` renders.

Each app adds its own metrics to :data:`REGISTRY`: the gateway its request counters and
histograms (``gateway.metrics``), fleet a collector that reads the cluster at scrape time
(``fleet.ops.metrics``, registered when the app is ready). Neither imports the other.

A scrape outlives the database: collectors make their scrape-time reads through
:func:`read_database`, which leaves their series out when the database is unreachable
(the gateway's in-process series are always served), and every scrape ends with
``llmgw_metrics_database_up`` (1 when its reads answered, else 0). An outage is logged
once when it begins and once when it ends, not per scrape.

**Several web processes** (``llmgw up --workers N``, ``llmgw.cli.web_processes``): each
process has its own counters, and a scrape lands on any one of them, so with
``PROMETHEUS_MULTIPROC_DIR`` set (as ``up`` and ``web`` set it for N > 1; read at import, as
prometheus_client reads it) the counters, histograms and gauges are prometheus_client's
multiprocess values — each process writes its own file there — and :func:`render` sums every
process's files (:class:`~prometheus_client.multiprocess.MultiProcessCollector`), then adds the
registry's own collectors (read at scrape time: the fleet's gauges, the token counts, which
read their sums through :func:`summed_samples`). Gauges sum the live processes
(``multiprocess_mode="livesum"``): a process's gauge file goes when it stops
(:func:`forget_process`) or, killed, at the next scrape that finds its pid gone. Counters of
a process gone stay in the sum (a counter never goes down); the directory is emptied when
``up`` or ``web`` starts.
"""

from __future__ import annotations

import contextvars
import glob
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from django.db import InterfaceError, OperationalError
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.samples import Sample

REGISTRY = CollectorRegistry(auto_describe=True)

#: prometheus_client's multiprocess directory (several web processes), or None (one: the
#: samples are this process's memory). Read at import, as prometheus_client reads it.
MULTIPROCESS_DIR: str | None = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
#: Metric names kept out of ``/metrics`` in multiprocess mode: the raw counts a collector
#: reads through :func:`summed_samples` and labels itself (``gateway.metrics.TokenCounts``).
INTERNAL: set[str] = set()

DATABASE_UP = ("llmgw_metrics_database_up", "1 when this scrape's database reads answered, else 0 (the series read "
               "from the database, the fleet's gauges and unnamed token series, are left out meanwhile).")

log = logging.getLogger(__name__)

T = TypeVar("T")


class _Scrape:
    """One render of :data:`REGISTRY`: its metrics, then ``llmgw_metrics_database_up`` for
    the database reads they made."""

    def __init__(self) -> None:
        self.read = False
        #: Why the first read that failed did (its error's first line); None: none failed.
        self.failure: str | None = None
        #: Multiprocess mode: every process's samples, summed, read once per scrape.
        self.summed: list[Metric] | None = None

    def collect(self) -> Iterator[Metric]:
        if MULTIPROCESS_DIR is None:
            yield from REGISTRY.collect()
        else:
            self.summed = _read_summed(MULTIPROCESS_DIR)
            yield from (family for family in self.summed if family.name not in INTERNAL)
            # The registry's own collectors; its counters, histograms and gauges were summed above.
            for collector in list(REGISTRY._collector_to_names):  # no public list in prometheus_client
                if not isinstance(collector, MetricWrapperBase):
                    yield from collector.collect()
        if self.failure is not None:
            _outage.failed(self.failure)
        elif self.read:
            _outage.answered()
        yield GaugeMetricFamily(*DATABASE_UP, value=0 if self.failure is not None else 1)


_current: contextvars.ContextVar[_Scrape | None] = contextvars.ContextVar("llmgw_metrics_scrape", default=None)


class _Outage:
    """The scrape-time reads' log: a warning when they begin to fail, a line at INFO when
    they answer again (how long it lasted); nothing per scrape in between."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None

    def failed(self, why: str) -> None:
        with self._lock:
            if self._since is not None:
                return
            self._since = time.monotonic()
        log.warning("/metrics: database unavailable (%s): serving the gateway's own series, without those read "
                    "from the database, until it answers", why)

    def answered(self) -> None:
        with self._lock:
            since, self._since = self._since, None
        if since is not None:
            log.info("/metrics: database back after %.1f s", time.monotonic() - since)


_outage = _Outage()


def read_database(read: Callable[[], T]) -> T | None:
    """``read()`` (a collector's scrape-time queries), or None when the database could not
    be reached (``OperationalError``, ``InterfaceError``: the caller leaves its series out);
    the scrape under way then reports ``llmgw_metrics_database_up 0``. Other errors (a bug)
    are raised."""
    scrape = _current.get()
    if scrape is not None:
        scrape.read = True
    try:
        return read()
    except (OperationalError, InterfaceError) as exc:
        if scrape is not None and scrape.failure is None:  # else a collector called on its own (a test)
            scrape.failure = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _read_summed(path: str) -> list[Metric]:
    """Every process's samples in ``path``, summed (gauges: of live processes — a killed
    process's gauge files are removed first)."""
    for name in glob.glob(os.path.join(path, "gauge_live*_*.db")):
        try:
            pid = int(os.path.basename(name)[:-3].rsplit("_", 1)[1])
        except ValueError:
            continue
        if _pid_gone(pid):
            mark_process_dead(pid, path)
    return list(MultiProcessCollector(None, path).collect())


def summed_samples(name: str) -> list[Sample]:
    """Multiprocess mode: the samples of metric ``name`` summed over every web process (those
    the scrape under way read, else read now); [] in single-process mode."""
    if MULTIPROCESS_DIR is None:
        return []
    scrape = _current.get()
    families = scrape.summed if scrape is not None and scrape.summed is not None else _read_summed(MULTIPROCESS_DIR)
    return [sample for family in families if family.name == name for sample in family.samples]


def forget_process() -> None:
    """Multiprocess mode: take this process's gauges out of the sums (it is stopping: its
    requests in flight or held are gone with it); nothing otherwise."""
    if MULTIPROCESS_DIR is not None:
        mark_process_dead(os.getpid(), MULTIPROCESS_DIR)


def render() -> bytes:
    """Every registered metric in Prometheus' text format (the body of ``/metrics``), and
    ``llmgw_metrics_database_up``; never raises for an unreachable database."""
    scrape = _Scrape()
    token = _current.set(scrape)
    try:
        return generate_latest(scrape)
    finally:
        _current.reset(token)
