"""The admission queue on a request's way (docs/architecture.md, "Tenants": admission).

A model whose capacity is known (``fleet.live.capacity``: its ready replicas × their
benchmarked or learned concurrency, this process's share of it) admits at most that many
requests at once in this web process; the others wait here, not at the engine, in the
model's :class:`gateway.admission.Gate`: by priority class, then a weighted fair share of
tokens across tenants (teams; a key without a team is its own), FIFO within one. A wait
longer than the cluster's ``admission_wait_s`` is a 429 ``model_at_capacity`` with
``Retry-After``; a client that leaves is out of the queue at once. Each queue's depth goes
to ``fleet.live.set_queued``: the scaler counts it as the model's waiting load.

``LLMGW_ADMISSION_ORDER=fifo`` admits in arrival order instead (one tenant, one class):
the baseline ``bench/tenants.py`` compares fair admission with.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from fleet import live
from gateway import admission, cache, metrics
from gateway.errors import openai_error
from gateway.models import Priority
from gateway.quotas import Tenancy

log = logging.getLogger(__name__)

#: The request header that asks for a lower priority class than the key's.
PRIORITY_HEADER = "X-Llmgw-Priority"
_BY_NAME = {p.label: p.value for p in Priority}


def priority_of(request: HttpRequest, tenancy: Tenancy) -> int | HttpResponse:
    """The request's priority class: the key's (or its team's), or a lower one that the
    ``X-Llmgw-Priority`` header asks for (``low``, ``normal``, ``high``); asking for a higher
    one gets the key's own. A value that is not a class is a 400."""
    asked = request.headers.get(PRIORITY_HEADER)
    if asked is None:
        return tenancy.priority
    value = _BY_NAME.get(asked.strip().lower())
    if value is None:
        return openai_error(400, f"Invalid {PRIORITY_HEADER} header {asked[:40]!r}: use one of low, normal, high.",
                            code="invalid_value", param=PRIORITY_HEADER)
    return min(value, tenancy.priority)


def priority_name(value: int) -> str:
    return Priority(value).label


async def wait_for_slot(model, ex, tenancy: Tenancy, priority: int, cost_of: Callable[[], int]) -> HttpResponse | None:
    """Wait for a slot of ``model`` in this process (none to wait for when its capacity is
    unknown); the slot is released when the request ends (``ex.on_finish``). ``cost_of``
    gives the request's tokens (its fair-share cost; asked only when there is a queue).
    Returns the 429 for a wait that ran out, else None. Raises CancelledError when the
    client leaves meanwhile (its ticket has left the queue)."""
    capacity = live.capacity(model.id)
    if capacity is None:
        return None
    cost = cost_of()
    if settings.LLMGW_ADMISSION_ORDER == "fifo":
        ticket = admission.ticket(Priority.NORMAL, "*", 1.0, max(1, cost))
    else:
        ticket = admission.ticket(priority, tenancy.tenant, tenancy.weight, max(1, cost))
    _names[model.id] = model.name  # before the gate is made: its depth is reported by name
    gate = admission.gate_for(model.id)
    wait_s = float(cache.admission_settings().admission_wait_s)
    try:
        release, waited_s = await gate.acquire(ticket, capacity[1], wait_s)
    except admission.QueueTimeout as exc:
        return exc.response(model.name)
    ex.on_finish.append(release)
    ex.waited(waited_s)  # time in the queue is not the gateway's overhead
    if gate.depth():
        _ensure_resizer()
    return None


_resizers: dict[int, asyncio.Task] = {}


def _ensure_resizer() -> None:
    """While any queue of this loop holds requests, follow the view: a replica that became
    ready (or left) changes the model's capacity, and waiters are admitted at once."""
    loop = asyncio.get_running_loop()
    task = _resizers.get(id(loop))
    if task is None or task.done() or task.get_loop() is not loop:
        _resizers[id(loop)] = loop.create_task(_follow_capacity())


async def _follow_capacity() -> None:
    while True:
        waiting = {model_id: gate for model_id, gate in admission.gates().items() if gate.depth()}
        if not waiting:
            return
        await live.wait_for_change(1.0)
        for model_id, gate in waiting.items():
            capacity = live.capacity(model_id)
            gate.resize(None if capacity is None else capacity[1])


#: Model id → its catalog name, for the ``llmgw_requests_queued`` gauge (the queues know ids).
_names: dict[int, str] = {}


def _depth_changed(model_id: int, depth: int) -> None:
    """A model's admission queue depth moved: the scaler's demand (``fleet.live.set_queued``)
    and ``llmgw_requests_queued{model}``."""
    live.set_queued(model_id, depth)
    name = _names.get(model_id)
    if name is not None:
        metrics.QUEUED.labels(name).set(depth)


admission.set_depth_listener(_depth_changed)
