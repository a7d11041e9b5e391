"""The admission queue (``gateway.admission``, issue 16): the pure fair queue's order —
priority, then weighted fair share on tokens, then FIFO — and the gate that holds requests
above a model's capacity, times them out into 429s, and never leaks a slot when a waiter
is cancelled. No test waits on a clock it asserts: waits are for events, with generous
deadlines."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter

import pytest

from gateway.admission import FairQueue, Gate, QueueTimeout, Ticket, gate_for, retry_after_estimate, \
    set_depth_listener, ticket

try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is in requirements.txt
    given = None

DEADLINE_S = 60  # for events that come at once on an idle machine


def tk(tenant: str, priority: int = 0, weight: float = 1.0, cost: int = 100) -> Ticket:
    return ticket(priority, tenant, weight, cost)


def drain(q: FairQueue, n: int | None = None) -> list[Ticket]:
    popped = []
    while n is None or len(popped) < n:
        t = q.pop()
        if t is None:
            break
        popped.append(t)
    return popped


def tenants_of(popped: list[Ticket]) -> str:
    return "".join(t.tenant for t in popped)


def tokens_by_tenant(popped: list[Ticket]) -> Counter:
    tokens = Counter()
    for t in popped:
        tokens[t.tenant] += t.cost
    return tokens


# --- FairQueue: the order ------------------------------------------------------------------------


def test_a_higher_priority_class_is_always_admitted_before_a_lower_one():
    q = FairQueue()
    low = [tk("a", priority=0) for _ in range(50)]
    for t in low:
        q.push(t)
    high = [tk("b", priority=5, weight=0.01, cost=100_000) for _ in range(3)]
    for t in high:
        q.push(t)
    middle = tk("c", priority=1)
    q.push(middle)
    assert q.depth() == 54 and q.depth(5) == 3 and q.depth(0) == 50 and q.depth_at_or_above(1) == 4
    assert drain(q) == high + [middle] + low
    assert len(q) == 0 and q.pop() is None


def test_a_tenants_tickets_come_out_in_the_order_they_were_pushed_whatever_their_costs():
    q = FairQueue()
    mine = [tk("a", cost=c) for c in (900, 1, 50, 7000, 3, 3)]
    others = [tk("b", cost=c) for c in (5, 5000, 20)]
    for t in mine + others:
        q.push(t)
    popped = drain(q)
    assert [t for t in popped if t.tenant == "a"] == mine
    assert [t for t in popped if t.tenant == "b"] == others


def test_tenants_of_equal_weight_and_cost_alternate():
    q = FairQueue()
    for name in "abc":
        for _ in range(10):
            q.push(tk(name))
    assert tenants_of(drain(q)) == "abc" * 10


def test_weights_two_to_one_admit_two_to_one_tokens_over_a_long_backlog():
    q = FairQueue()
    for _ in range(3000):
        q.push(tk("heavy", weight=2.0))
        q.push(tk("light", weight=1.0))
    popped = drain(q, 3000)
    tokens = tokens_by_tenant(popped)
    assert tokens["heavy"] + tokens["light"] == 300_000
    # SFQ's bound: |W_a/w_a − W_b/w_b| ≤ c_a/w_a + c_b/w_b
    assert abs(tokens["heavy"] / 2 - tokens["light"] / 1) <= 100 / 2 + 100 / 1
    assert tenants_of(popped[:6]).count("heavy") == 4


def test_big_requests_do_not_starve_small_ones_nor_small_ones_big_ones_counted_in_tokens():
    q = FairQueue()
    for _ in range(200):
        q.push(tk("big", cost=4000))
    for _ in range(20_000):
        q.push(tk("small", cost=40))
    popped = drain(q, 1010)
    counts = Counter(t.tenant for t in popped)
    tokens = tokens_by_tenant(popped)
    assert counts["big"] == 10 and counts["small"] == 1000  # a hundred small ones per big one
    assert abs(tokens["big"] - tokens["small"]) <= 4000 + 40
    # the big ones come evenly spread, never more than ~100 small ones apart
    big_at = [i for i, t in enumerate(popped) if t.tenant == "big"]
    assert big_at[0] == 0 and max(b - a for a, b in zip(big_at, big_at[1:])) <= 101


@pytest.mark.parametrize("popped_before", [0, 1, 500])
@pytest.mark.parametrize("flood_weight, light_cost", [(1.0, 100), (50.0, 100), (1.0, 100_000)])
def test_a_light_tenant_arriving_behind_a_flood_of_a_thousand_is_popped_within_the_next_two(
        popped_before, flood_weight, light_cost):
    q = FairQueue()
    for _ in range(1000):
        q.push(tk("flood", weight=flood_weight))
    drain(q, popped_before)
    light = tk("light", cost=light_cost)
    q.push(light)
    assert light in drain(q, 2)


def test_a_ticket_removed_from_the_middle_is_never_popped_and_the_others_keep_their_order():
    q = FairQueue()
    a = [tk("a") for _ in range(5)]
    b = [tk("b") for _ in range(5)]
    for x, y in zip(a, b):
        q.push(x)
        q.push(y)
    assert q.remove(a[2]) and q.remove(b[0])
    assert a[2] not in q and len(q) == 8
    assert not q.remove(a[2])  # twice: not there any more
    popped = drain(q)
    assert a[2] not in popped and b[0] not in popped
    assert [t for t in popped if t.tenant == "a"] == [a[0], a[1], a[3], a[4]]
    assert [t for t in popped if t.tenant == "b"] == b[1:]
    assert not q.remove(a[0])  # popped: not there


def test_removing_a_tenants_last_ticket_leaves_the_others_alternating():
    q = FairQueue()
    only = tk("gone")
    q.push(only)
    for _ in range(3):
        q.push(tk("a"))
        q.push(tk("b"))
    assert q.remove(only)
    assert q.backlogged(0) == {"a": 3, "b": 3}
    assert tenants_of(drain(q)) == "ababab"


def test_a_tenant_back_from_idle_gets_no_credit_for_the_time_it_was_away():
    q = FairQueue()
    for _ in range(300):
        q.push(tk("busy"))
    drain(q, 100)  # "away" was idle all along: served nothing
    for _ in range(100):
        q.push(tk("away"))
    counts = Counter(t.tenant for t in drain(q, 40))
    assert counts == {"busy": 20, "away": 20}  # shares from now on, no catching up


def test_a_tenant_just_served_a_big_request_keeps_its_debt_when_it_returns():
    q = FairQueue()
    big = tk("a", cost=1000)
    q.push(big)
    for _ in range(20):
        q.push(tk("b", cost=100))
    assert q.pop() is big
    a_again = tk("a", cost=100)
    q.push(a_again)
    popped = drain(q)
    # b's tickets start at 0, 100, … 1,000 (a's start tag: 1,000; the tie goes to the earlier arrival)
    assert popped.index(a_again) == 11


def test_idle_tenants_whose_debt_is_paid_are_forgotten():
    q = FairQueue()
    for _ in range(2000):
        q.push(tk("steady"))
    for i in range(1000):
        q.push(tk(f"once-{i}"))
    drain(q, 2500)
    assert q.tracked_tenants(0) <= 2


def test_churn_of_pushed_and_removed_tickets_behind_a_waiting_one_stays_bounded():
    q = FairQueue()
    q.push(tk("high", priority=1))  # starves the class below: nothing is popped there
    waiting = tk("a")
    q.push(waiting)
    for i in range(10_000):
        t = tk("a")
        q.push(t)
        assert q.remove(t)
        other = tk(f"passer-by-{i}")  # a tenant of one request, whose client leaves
        q.push(other)
        assert q.remove(other)
    assert len(q) == 2 and q.backlogged(0) == {"a": 1} and q.tracked_tenants(0) == 1
    assert len(q._classes[0].tenants["a"].tickets) <= 2 * FairQueue._COMPACT_AFTER
    assert len(q._classes[0].heap) <= 4 * FairQueue._COMPACT_AFTER
    assert drain(q)[1] is waiting


def test_bad_tickets_are_refused():
    q = FairQueue()
    t = tk("a")
    q.push(t)
    with pytest.raises(ValueError, match="already queued"):
        q.push(t)
    with pytest.raises(ValueError, match="weight"):
        q.push(tk("a", weight=0))
    with pytest.raises(ValueError, match="weight"):
        q.push(tk("a", weight=float("inf")))
    with pytest.raises(ValueError, match="cost"):
        q.push(tk("a", cost=0))
    assert len(q) == 1
    assert q.pop() is t
    q.push(t)  # popped tickets may queue again
    assert q.pop() is t


def test_a_ticket_of_one_queue_is_not_in_another():
    mine, other = FairQueue(), FairQueue()
    t = tk("a")
    mine.push(t)
    assert t in mine and t not in other and not other.remove(t)


def test_random_operations_keep_the_order_rules_and_the_counts():
    rng = random.Random(16)
    q = FairQueue()
    waiting: list[Ticket] = []
    pushed_by_tenant: dict[tuple[int, str], list[Ticket]] = {}
    for _ in range(20_000):
        op = rng.random()
        if op < 0.5:
            t = tk(rng.choice("abcde"), priority=rng.choice((0, 0, 1, 2)), weight=rng.choice((1, 2, 5)),
                   cost=rng.randint(1, 2000))
            q.push(t)
            waiting.append(t)
            pushed_by_tenant.setdefault((t.priority, t.tenant), []).append(t)
        elif op < 0.65 and waiting:
            t = waiting.pop(rng.randrange(len(waiting)))
            assert q.remove(t)
            pushed_by_tenant[(t.priority, t.tenant)].remove(t)
        else:
            t = q.pop()
            if t is None:
                assert not waiting
                continue
            assert t.priority == max(w.priority for w in waiting)
            queue_of_tenant = pushed_by_tenant[(t.priority, t.tenant)]
            assert queue_of_tenant[0] is t  # FIFO within the tenant
            queue_of_tenant.pop(0)
            waiting.remove(t)
        assert len(q) == len(waiting)
    assert sorted(drain(q), key=lambda t: t.seq) == sorted(waiting, key=lambda t: t.seq)


if given is not None:

    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    @given(
        weights=st.lists(st.integers(1, 8), min_size=2, max_size=5),
        costs=st.lists(st.integers(1, 1000), min_size=1, max_size=40),
        seed=st.integers(0, 2 ** 16),
    )
    def test_backlogged_tenants_are_admitted_their_weight_share_of_tokens_within_one_request(weights, costs, seed):
        rng = random.Random(seed)
        q = FairQueue()
        most = {}
        for i, weight in enumerate(weights):
            name = f"t{i}"
            mine = [rng.choice(costs) for _ in range(150)]
            most[name] = max(mine)
            for cost in mine:
                q.push(tk(name, weight=float(weight), cost=cost))
        weight_of = {f"t{i}": float(w) for i, w in enumerate(weights)}
        tokens = Counter()
        while all(q.backlogged(0).get(name, 0) for name in weight_of):  # while every one has a backlog
            t = q.pop()
            tokens[t.tenant] += t.cost
            for i in weight_of:
                for j in weight_of:
                    gap = abs(tokens[i] / weight_of[i] - tokens[j] / weight_of[j])
                    assert gap <= most[i] / weight_of[i] + most[j] / weight_of[j] + 1e-6


def test_retry_after_is_recent_service_time_times_position_over_capacity_within_one_and_the_wait():
    assert retry_after_estimate((2.0, 4.0), position=9, capacity=3, wait_s=60) == 9
    assert retry_after_estimate((0.01,), position=1, capacity=8, wait_s=60) == 1
    assert retry_after_estimate((30.0,), position=50, capacity=2, wait_s=20) == 20
    assert retry_after_estimate((), position=5, capacity=2, wait_s=12.5) == 13  # nothing known: the wait
    assert retry_after_estimate((1.0,), position=5, capacity=0, wait_s=7) == 7
    assert retry_after_estimate((1.0,), position=5, capacity=1, wait_s=0.2) == 1


# --- Gate ----------------------------------------------------------------------------------------


class Depths:
    """A gate's ``on_depth`` listener: every depth it was told, and a wait for one."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self._changed = asyncio.Event()

    def __call__(self, depth: int) -> None:
        self.seen.append(depth)
        self._changed.set()

    async def reach(self, depth: int) -> None:
        async with asyncio.timeout(DEADLINE_S):
            while not self.seen or self.seen[-1] != depth:
                self._changed.clear()
                await self._changed.wait()


async def hold(gate: Gate, capacity: int | None = 1, tenant: str = "holder"):
    """Enter a slot from the test itself; returns the context manager to leave it with
    ``await cm.__aexit__(None, None, None)`` at the moment the test chooses."""
    cm = gate.admit(tk(tenant), capacity, wait_s=DEADLINE_S)
    await cm.__aenter__()
    return cm


async def leave(cm) -> None:
    await cm.__aexit__(None, None, None)


async def test_under_capacity_requests_are_admitted_at_once_without_queueing():
    depths = Depths()
    gate = Gate(on_depth=depths)
    async with gate.admit(tk("a"), 2, wait_s=DEADLINE_S) as waited_s:
        assert waited_s == 0
        async with gate.admit(tk("b"), 2, wait_s=DEADLINE_S):
            assert gate.running == 2 and gate.depth() == 0
    assert gate.running == 0 and depths.seen == []


async def test_unlimited_capacity_admits_everyone_at_once():
    gate = Gate()
    cms = [await hold(gate, capacity=None) for _ in range(50)]
    assert gate.running == 50 and gate.depth() == 0
    for cm in cms:
        await leave(cm)
    assert gate.running == 0


async def test_waiters_are_admitted_by_priority_then_fairly_then_in_order_as_slots_free():
    depths = Depths()
    gate = Gate(on_depth=depths)
    holder = await hold(gate)
    order: list[str] = []

    async def request(name: str, tenant: str, priority: int) -> None:
        async with gate.admit(tk(tenant, priority=priority), 1, wait_s=DEADLINE_S):
            assert gate.running == 1
            order.append(name)

    tasks = []
    for n, (name, tenant, priority) in enumerate([("a1", "a", 0), ("a2", "a", 0), ("a3", "a", 0), ("b1", "b", 0),
                                                  ("c1", "c", 3), ("b2", "b", 0), ("c2", "c", 3)], start=1):
        tasks.append(asyncio.create_task(request(name, tenant, priority)))
        await depths.reach(n)
    assert gate.running == 1 and gate.depth() == 7
    await leave(holder)
    async with asyncio.timeout(DEADLINE_S):
        await asyncio.gather(*tasks)
    assert order == ["c1", "c2", "a1", "b1", "a2", "b2", "a3"]
    assert gate.running == 0 and gate.depth() == 0 and depths.seen[-1] == 0


async def test_a_wait_past_its_bound_raises_queue_timeout_and_leaves_the_queue():
    depths = Depths()
    gate = Gate(on_depth=depths)
    holder = await hold(gate)
    with pytest.raises(QueueTimeout) as raised:
        async with gate.admit(tk("late"), 1, wait_s=0.05):
            pytest.fail("admitted while the only slot was held")
    timeout = raised.value
    assert timeout.waited_s >= 0.04 and timeout.depth == 0  # asyncio may fire a timer a tick early
    assert timeout.retry_after_s == 1  # between 1 and the 0.05 s wait, rounded up
    assert depths.seen == [1, 0] and gate.depth() == 0 and gate.running == 1
    await leave(holder)
    assert gate.running == 0


async def test_a_queue_timeout_is_answered_429_with_retry_after_in_openais_shape():
    response = QueueTimeout(waited_s=30.2, depth=12, retry_after_s=8).response("llama-8b")
    assert response.status_code == 429 and response["Retry-After"] == "8"
    error = json.loads(response.content)["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "model_at_capacity"
    assert error["message"] == ("The model 'llama-8b' is at capacity: not admitted after waiting 30 s "
                                "(12 request(s) still waiting); retry after 8 s.")


async def test_no_wait_allowed_and_no_room_times_out_at_once():
    gate = Gate()
    holder = await hold(gate)
    with pytest.raises(QueueTimeout) as raised:
        async with gate.admit(tk("b"), 1, wait_s=0):
            pass
    assert raised.value.waited_s == 0 and raised.value.retry_after_s == 1 and gate.depth() == 0
    await leave(holder)


async def test_a_waiter_cancelled_leaves_the_queue_at_once_and_takes_no_slot():
    depths = Depths()
    gate = Gate(on_depth=depths)
    holder = await hold(gate)
    admitted = []

    async def request(name: str) -> None:
        async with gate.admit(tk(name), 1, wait_s=DEADLINE_S):
            admitted.append(name)

    gone = asyncio.create_task(request("gone"))
    await depths.reach(1)
    stays = asyncio.create_task(request("stays"))
    await depths.reach(2)
    gone.cancel()
    await asyncio.wait([gone], timeout=DEADLINE_S)
    assert gone.cancelled()
    assert gate.depth() == 1 and depths.seen[-1] == 1 and gate.running == 1
    await leave(holder)
    async with asyncio.timeout(DEADLINE_S):
        await stays
    assert admitted == ["stays"] and gate.running == 0 and gate.depth() == 0


async def test_a_waiter_cancelled_as_it_is_granted_a_slot_hands_the_slot_on():
    depths = Depths()
    gate = Gate(on_depth=depths)
    holder = await hold(gate)
    next_in = asyncio.Event()
    finish = asyncio.Event()

    async def granted_then_cancelled() -> None:
        async with gate.admit(tk("a"), 1, wait_s=DEADLINE_S):
            pytest.fail("the body of a cancelled waiter ran")

    async def behind() -> None:
        async with gate.admit(tk("a"), 1, wait_s=DEADLINE_S):
            next_in.set()
            await finish.wait()

    first = asyncio.create_task(granted_then_cancelled())
    await depths.reach(1)
    second = asyncio.create_task(behind())
    await depths.reach(2)
    await leave(holder)  # grants `first` its slot: its future is set, its task has not run yet
    assert gate.running == 1 and gate.depth() == 1
    first.cancel()  # the client leaves in that same moment
    async with asyncio.timeout(DEADLINE_S):
        await next_in.wait()
    assert first.cancelled()
    assert gate.running == 1 and gate.depth() == 0  # `second` holds the one slot; nothing leaked
    finish.set()
    async with asyncio.timeout(DEADLINE_S):
        await second
    assert gate.running == 0


async def test_a_raised_capacity_admits_waiters_at_once_and_a_lowered_one_lets_running_requests_finish():
    depths = Depths()
    gate = Gate(on_depth=depths)
    holder = await hold(gate)
    names = ("w1", "w2", "w3")
    entered = {name: asyncio.Event() for name in names}
    leaving = {name: asyncio.Event() for name in names}

    async def request(name: str) -> None:
        async with gate.admit(tk(name), 1, wait_s=DEADLINE_S):
            entered[name].set()
            await leaving[name].wait()

    tasks = []
    for n, name in enumerate(names, start=1):
        tasks.append(asyncio.create_task(request(name)))
        await depths.reach(n)
    gate.resize(3)  # two more slots: the two first waiters are granted now
    assert gate.running == 3 and gate.depth() == 1 and gate.capacity == 3
    gate.resize(1)
    await leave(holder)
    async with asyncio.timeout(DEADLINE_S):
        await entered["w1"].wait()
        await entered["w2"].wait()
    leaving["w1"].set()
    async with asyncio.timeout(DEADLINE_S):
        await tasks[0]
    assert gate.running == 1 and gate.depth() == 1  # w2 runs alone; w3 still waits under capacity 1
    assert not entered["w3"].is_set()
    leaving["w2"].set()
    async with asyncio.timeout(DEADLINE_S):
        await tasks[1]
        await entered["w3"].wait()
    assert gate.running == 1 and gate.depth() == 0
    leaving["w3"].set()
    async with asyncio.timeout(DEADLINE_S):
        await tasks[2]
    assert gate.running == 0 and gate.depth() == 0


async def test_a_later_admit_with_a_higher_capacity_lets_the_waiters_in_first():
    depths = Depths()
    gate = Gate(on_depth=depths)
    holder = await hold(gate)
    waiter = asyncio.create_task(hold(gate, capacity=1, tenant="waiter"))
    await depths.reach(1)
    newcomer = await hold(gate, capacity=3, tenant="newcomer")
    assert gate.running == 3 and gate.depth() == 0
    async with asyncio.timeout(DEADLINE_S):
        waiting_cm = await waiter
    for cm in (holder, waiting_cm, newcomer):
        await leave(cm)
    assert gate.running == 0


async def test_an_exception_inside_releases_the_slot_to_the_next_waiter():
    depths = Depths()
    gate = Gate(on_depth=depths)
    started = asyncio.Event()
    fail = asyncio.Event()

    async def failing() -> None:
        async with gate.admit(tk("a"), 1, wait_s=DEADLINE_S):
            started.set()
            await fail.wait()
            raise RuntimeError("engine broke")

    failure = asyncio.create_task(failing())
    await started.wait()
    waiter = asyncio.create_task(hold(gate, tenant="b"))
    await depths.reach(1)
    fail.set()
    with pytest.raises(RuntimeError, match="engine broke"):
        async with asyncio.timeout(DEADLINE_S):
            await failure
    async with asyncio.timeout(DEADLINE_S):
        cm = await waiter
    assert gate.running == 1 and gate.depth() == 0
    await leave(cm)
    assert gate.running == 0


async def test_a_thousand_concurrent_waiters_all_complete_and_never_exceed_capacity():
    rng = random.Random(1000)
    depths = Depths()
    gate = Gate(on_depth=depths)
    capacity = 7
    most = 0
    done: list[int] = []

    async def request(i: int) -> None:
        nonlocal most
        t = tk(rng.choice("abcd"), priority=rng.choice((0, 1)), weight=rng.choice((1, 3)), cost=rng.randint(1, 500))
        async with gate.admit(t, capacity, wait_s=600):
            most = max(most, gate.running)
            assert gate.running <= capacity
            for _ in range(rng.randint(0, 3)):
                await asyncio.sleep(0)
            done.append(i)

    async with asyncio.timeout(300):
        await asyncio.gather(*(request(i) for i in range(1000)))
    assert sorted(done) == list(range(1000))
    assert most == capacity and gate.running == 0 and gate.depth() == 0
    assert max(depths.seen) > 900 and depths.seen[-1] == 0


async def test_waiters_cancelled_and_timed_out_at_random_leak_no_slot():
    rng = random.Random(7)
    gate = Gate()
    capacity = 3
    admitted = 0

    async def request() -> None:
        nonlocal admitted
        async with gate.admit(tk(rng.choice("ab")), capacity, wait_s=rng.choice((0, 600))):
            admitted += 1
            assert gate.running <= capacity
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(request()) for _ in range(300)]
    for _ in range(20):
        await asyncio.sleep(0)
        for task in rng.sample(tasks, 10):
            task.cancel()
    async with asyncio.timeout(300):
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(r is None or isinstance(r, (asyncio.CancelledError, QueueTimeout)) for r in results)
    assert admitted >= results.count(None) > 0
    assert gate.running == 0 and gate.depth() == 0


async def test_a_gate_refuses_a_bad_ticket_even_with_room_to_spare():
    gate = Gate()
    with pytest.raises(ValueError, match="cost"):
        async with gate.admit(tk("a", cost=0), None, wait_s=1):
            pytest.fail("admitted a ticket the queue would refuse")
    assert gate.running == 0


async def test_a_gate_answers_only_on_its_own_event_loop():
    gate = Gate()
    async with gate.admit(tk("a"), 1, wait_s=1):
        pass

    def elsewhere() -> None:
        async def use() -> None:
            async with gate.admit(tk("a"), 1, wait_s=1):
                pass
        asyncio.run(use())

    with pytest.raises(RuntimeError, match="another event loop"):
        await asyncio.to_thread(elsewhere)


async def test_gate_for_gives_one_gate_per_model_in_a_loop():
    assert gate_for(1) is gate_for(1)
    assert gate_for(1) is not gate_for(2)


def test_gate_for_never_hands_a_new_loop_a_gate_of_a_closed_one():
    async def get() -> Gate:
        gate = gate_for(1)
        async with gate.admit(tk("a"), 1, wait_s=1):
            pass
        return gate

    first = asyncio.run(get())
    second = asyncio.run(get())
    assert first is not second
    assert first.loop is None or (first.loop is not second.loop and first.loop.is_closed())


async def test_the_depth_listener_is_told_each_models_depth():
    told: list[tuple[int, int]] = []
    set_depth_listener(lambda model_id, depth: told.append((model_id, depth)))
    try:
        gate = gate_for(42)
        holder = await hold(gate)
        with pytest.raises(QueueTimeout):
            async with gate.admit(tk("holder"), 1, wait_s=0.01):  # its own tenant: no headroom to borrow
                pass
        await leave(holder)
    finally:
        set_depth_listener(None)
    assert told == [(42, 1), (42, 0)]


async def test_a_failing_depth_listener_never_leaks_a_slot():
    def broken(depth: int) -> None:
        raise RuntimeError("scaler down")

    gate = Gate(on_depth=broken)
    holder = await hold(gate)
    waiter = asyncio.create_task(hold(gate, tenant="b"))
    async with asyncio.timeout(DEADLINE_S):
        while gate.depth() != 1:
            await asyncio.sleep(0)
    await leave(holder)
    async with asyncio.timeout(DEADLINE_S):
        cm = await waiter
    await leave(cm)
    assert gate.running == 0 and gate.depth() == 0


# --- headroom for a tenant under its share -------------------------------------------------------


async def test_a_light_tenant_behind_a_flood_is_let_in_at_once_into_the_headroom():
    gate = Gate(headroom_fraction=0.1)  # capacity 10: one slot of headroom
    flood = [await hold(gate, capacity=10, tenant="flood") for _ in range(10)]
    waiting = [asyncio.create_task(gate.admit(tk("flood"), 10, wait_s=DEADLINE_S).__aenter__()) for _ in range(5)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert gate.running == 10 and gate.depth() == 5
    light = await hold(gate, capacity=10, tenant="light")  # at once, not after a flood request
    assert gate.running == 11 and gate.headroom() == 1
    # The headroom is spent: a second light tenant waits its (first) turn.
    other = asyncio.create_task(gate.admit(tk("other"), 10, wait_s=DEADLINE_S).__aenter__())
    await asyncio.sleep(0)
    assert gate.depth() == 6 and not other.done()
    # The flood is admitted again only once the total is back under capacity.
    await leave(flood[0])
    assert gate.running == 10 and not other.done()  # 9 of the flood + the light one: still full
    await leave(flood[1])
    async with asyncio.timeout(DEADLINE_S):
        await other  # the fair order: the new tenant first
    assert gate.running == 10
    for cm in [*flood[2:], light]:
        await leave(cm)
    for task in waiting:
        async with asyncio.timeout(DEADLINE_S):
            await task
    assert gate.depth() == 0


async def test_the_headroom_is_not_for_a_tenant_at_its_share_and_is_bounded():
    gate = Gate(headroom_fraction=0.5)  # capacity 2: one slot of headroom
    a1, a2 = await hold(gate, 2, "a"), await hold(gate, 2, "a")
    # "a" alone runs its whole share: it waits.
    a3 = asyncio.create_task(gate.admit(tk("a"), 2, wait_s=DEADLINE_S).__aenter__())
    await asyncio.sleep(0)
    assert gate.depth() == 1 and not a3.done()
    # "h", of a higher class, borrows; then "b" finds the headroom spent.
    high_cm = gate.admit(tk("h", priority=5), 2, wait_s=DEADLINE_S)
    high = asyncio.create_task(high_cm.__aenter__())
    await asyncio.sleep(0)
    assert high.done()  # "h" was under its share and nothing higher waited: it borrowed
    b = asyncio.create_task(gate.admit(tk("b", priority=0), 2, wait_s=DEADLINE_S).__aenter__())
    await asyncio.sleep(0)
    assert not b.done() and gate.running == 3  # the headroom is spent
    for cm in (a1, a2):
        await leave(cm)
    await leave(high_cm)
    async with asyncio.timeout(DEADLINE_S):
        await asyncio.gather(a3, b)
    assert gate.depth() == 0


async def test_gates_of_the_registry_lend_headroom():
    assert gate_for(12345).headroom_fraction > 0


async def test_no_headroom_while_a_higher_class_waits():
    gate = Gate(headroom_fraction=0.5)  # capacity 2: one slot of headroom
    a1, a2 = await hold(gate, 2, "a"), await hold(gate, 2, "a")
    urgent = asyncio.create_task(gate.admit(tk("a", priority=5), 2, wait_s=DEADLINE_S).__aenter__())
    await asyncio.sleep(0)
    assert gate.depth() == 1  # "a" runs its share: its urgent request waits
    b = asyncio.create_task(gate.admit(tk("b", priority=0), 2, wait_s=DEADLINE_S).__aenter__())
    await asyncio.sleep(0)
    assert not b.done() and gate.running == 2 and gate.depth() == 2  # never ahead of a higher class
    await leave(a1)
    await leave(a2)
    async with asyncio.timeout(DEADLINE_S):
        await asyncio.gather(urgent, b)
