"""The limit counters in Redis (a private server): the same decisions as the in-process
counters, atomic between processes (no over-admission when two race), concurrency leases
that free themselves, and a Redis that is gone answering at once."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time

import pytest

from gateway import quotas
from gateway.counters import LEASE_S, CountersAway, LocalCounters, NeedSeed, RedisCounters
from gateway.quotas import Subject, Tenancy
from tests.pg import private_redis
from tests.processes import ROOT

NOW = 1_796_000_000.0


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def redis_server():
    with private_redis() as server:
        yield server


def subject(**limits) -> Tenancy:
    return Tenancy((Subject("key", 1, "ci", "1.abc", **limits),), "key:1")


async def test_redis_decides_as_the_process_does(redis_server):
    """One random sequence of admissions and settlements on both backends: the same
    verdicts, the same values, every step."""
    rng = random.Random(16)
    clock_a, clock_b = Clock(), Clock()
    local = LocalCounters(clock_a)
    redis_ = RedisCounters(redis_server.url, f"parity{time.time_ns()}", clock_b)
    t = Tenancy((Subject("key", 1, "ci", "1.p", requests_per_minute=30, tokens_per_minute=2000,
                         max_concurrent_requests=4, tokens_per_day=20_000),
                 Subject("team", 2, "t", "2.p", tokens_per_minute=3000, tokens_per_month=50_000)), "team:2")
    running: list[tuple[list, str, float]] = []
    for step in range(300):
        op = rng.random()
        if op < 0.6:
            reserve = rng.randint(1, 400)
            checks = quotas.checks(t, 1, "m", reserve, clock_a.now)
            member = f"m{step}"
            a, b = await local.admit(checks, member), await redis_.admit(checks, member)
            if isinstance(a, NeedSeed):
                assert isinstance(b, NeedSeed) and a.missing == b.missing
                for i in a.missing:
                    await local.seed(checks[i].key, 100, checks[i].ttl_s)
                    await redis_.seed(checks[i].key, 100, checks[i].ttl_s)
                a, b = await local.admit(checks, member), await redis_.admit(checks, member)
            assert (a.admitted, a.values, a.refused) == (b.admitted, b.values, b.refused), step
            if a.admitted:
                running.append((checks, member, clock_a.now))
        elif op < 0.9 and running:
            checks, member, _ = running.pop(rng.randrange(len(running)))
            delta = -rng.randint(0, 300)
            items = [(c.key, delta) for c in checks if c.kind in ("tokens", "day", "month")]
            releases = [(c.key, member) for c in checks if c.kind == "concurrency"]
            local.settle_now(items, releases)
            await redis_.settle(items, releases)
        else:
            # Requests that would outlive a lease end first (a live process renews leases
            # in real time, which this fake clock outruns).
            for checks, member, _ in [r for r in running if clock_a.now + 7 - r[2] >= LEASE_S]:
                running.remove((checks, member, _))
                releases = [(c.key, member) for c in checks if c.kind == "concurrency"]
                local.settle_now([], releases)
                await redis_.settle([], releases)
            clock_a.now += 7
            clock_b.now += 7
        keys = [c.key for c in quotas.checks(t, 1, "m", 1, clock_a.now)]
        assert await local.peek(keys) == await redis_.peek(keys), step


RACER = """
import asyncio, json, sys
from gateway import quotas
from gateway.counters import RedisCounters
from gateway.quotas import Subject, Tenancy

url, prefix, now = sys.argv[1], sys.argv[2], float(sys.argv[3])
t = Tenancy((Subject("key", 1, "ci", "1.race", requests_per_minute=150, max_concurrent_requests=1000),), "key:1")

async def main():
    counters = RedisCounters(url, prefix, clock=lambda: now)
    async def one(i):
        return (await counters.admit(quotas.checks(t, 1, "m", 1, now), f"{sys.argv[4]}-{i}")).admitted
    admitted = await asyncio.gather(*(one(i) for i in range(200)))
    print(json.dumps(sum(admitted)))

asyncio.run(main())
"""


def test_two_processes_racing_over_one_limit_admit_exactly_the_limit(redis_server):
    prefix = f"race{time.time_ns()}"
    racers = [subprocess.Popen([sys.executable, "-c", RACER, redis_server.url, prefix, str(NOW), name],
                               cwd=str(ROOT), stdout=subprocess.PIPE, text=True) for name in ("a", "b")]
    counts = [json.loads(p.communicate(timeout=120)[0]) for p in racers]
    assert sum(counts) == 150, counts  # 400 asked, 150 allowed: never one more


async def test_a_concurrency_slot_of_a_process_that_died_frees_itself(redis_server):
    clock = Clock()
    dead = RedisCounters(redis_server.url, f"lease{time.time_ns()}", clock)
    t = subject(max_concurrent_requests=1)
    assert (await dead.admit(quotas.checks(t, 1, "m", 1, clock.now), "dead-1")).admitted
    other = RedisCounters(redis_server.url, dead.prefix[:-4], clock)  # another process, same names
    assert not (await other.admit(quotas.checks(t, 1, "m", 1, clock.now), "live-1")).admitted
    clock.now += LEASE_S + 1  # nobody renewed the dead process's lease
    assert (await other.admit(quotas.checks(t, 1, "m", 1, clock.now), "live-1")).admitted


async def test_a_redis_that_is_gone_answers_at_once_and_is_not_asked_again_for_a_moment():
    with private_redis() as server:
        counters = RedisCounters(server.url, "gone")
        checks = quotas.checks(subject(requests_per_minute=5), 1, "m", 1, time.time())
        assert (await counters.admit(checks, "a")).admitted
        server.stop()
        started = time.monotonic()
        with pytest.raises(CountersAway):
            await counters.admit(checks, "b")
        with pytest.raises(CountersAway, match="a moment ago"):
            await counters.admit(checks, "c")  # the circuit: no new connection attempt
        assert time.monotonic() - started < 5
        await asyncio.sleep(0)


async def test_a_redis_that_lost_its_data_mid_request_keeps_what_the_records_say(redis_server):
    """Redis flushed while a request runs: the budget is seeded again from the records,
    and the request's settlement adds what it used (not real − reserved)."""
    import redis.asyncio as redis_async

    clock = Clock()
    counters = RedisCounters(redis_server.url, f"lost{time.time_ns()}", clock)
    t = subject(tokens_per_day=100_000)
    checks = quotas.checks(t, 1, "m", 5000, clock.now)
    await counters.seed(checks[0].key, 5000, checks[0].ttl_s)
    assert (await counters.admit(checks, "a")).admitted
    admitted_s = clock.now
    client = redis_async.Redis.from_url(redis_server.url)
    await client.flushdb()
    await client.aclose()
    clock.now += 3
    assert isinstance(await counters.admit(quotas.checks(t, 1, "m", 1, clock.now), "b"), NeedSeed)
    await counters.seed(checks[0].key, 5000, checks[0].ttl_s)
    await counters.settle([(checks[0].key, 400 - 5000, 400, admitted_s)])
    assert await counters.peek([checks[0].key]) == [5400]
