"""How much the admission queue's fair order costs per request (``gateway.admission.FairQueue``).

Tickets in 3 priority classes with costs of 1–4,000 tokens, of 100 tenants (weights 1–4), and
again of 10,000 (about one waiting ticket per tenant: the most heap work per ticket):

* **fill and drain** — push 100,000, then pop them all;
* **steady** — 10,000 waiting, then push one and pop one 100,000 times (a queue that stays
  deep: what the gateway does under sustained overload);
* **churn** — 10,000 waiting, push one and remove one from the middle (clients leaving).

Prints µs per push+pop (per push+remove for churn), best and worst of ``--repeat`` runs.
Goal: ≤ 10 µs per push+pop (best run) in the fill-and-drain and the steady runs.

    python bench/admission_queue.py [--tickets 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gateway.admission import FairQueue, Ticket  # noqa: E402

GOAL_US = 10.0
TENANT_COUNTS = (100, 10_000)
DEEP = 10_000


def tickets(n: int, tenants: int, seed: int, first_seq: int = 0) -> list[Ticket]:
    rng = random.Random(seed)
    weights = [float(rng.randint(1, 4)) for _ in range(tenants)]
    made = []
    for seq in range(first_seq, first_seq + n):
        tenant = rng.randrange(tenants)
        made.append(Ticket(rng.choice((0, 0, 0, 1, 2)), f"team-{tenant}", weights[tenant], rng.randint(1, 4000), seq))
    return made


def fill_and_drain(batch: list[Ticket]) -> float:
    """Seconds to push every ticket of ``batch`` and pop them all."""
    q = FairQueue()
    push, pop = q.push, q.pop
    started = time.perf_counter()
    for t in batch:
        push(t)
    while pop() is not None:
        pass
    return time.perf_counter() - started


def steady(batch: list[Ticket], backlog: list[Ticket]) -> float:
    """Seconds to push and pop one ticket per ticket of ``batch`` with ``backlog`` waiting."""
    q = FairQueue()
    for t in backlog:
        q.push(t)
    push, pop = q.push, q.pop
    started = time.perf_counter()
    for t in batch:
        push(t)
        pop()
    return time.perf_counter() - started


def churn(batch: list[Ticket], backlog: list[Ticket], seed: int) -> float:
    """Seconds to push one ticket and remove a random waiting one, per ticket of ``batch``."""
    rng = random.Random(seed)
    q = FairQueue()
    waiting = list(backlog)
    for t in waiting:
        q.push(t)
    picks = [rng.randrange(len(waiting)) for _ in batch]
    push, remove = q.push, q.remove
    started = time.perf_counter()
    for t, i in zip(batch, picks):
        push(t)
        gone = waiting[i]
        waiting[i] = t
        remove(gone)
    elapsed = time.perf_counter() - started
    assert len(q) == len(backlog)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickets", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = args.tickets
    print(f"{n:,} tickets, 3 priority classes; {DEEP:,} waiting for steady and churn")
    print(f"{'tenants':>8} {'run':<16} {'µs/op (best)':>13} {'µs/op (worst)':>14}")
    top = 0.0
    for tenants in TENANT_COUNTS:
        runs: dict[str, list[float]] = {"fill and drain": [], "steady": [], "churn": []}
        for r in range(args.repeat):
            runs["fill and drain"].append(fill_and_drain(tickets(n, tenants, seed=r)))
            runs["steady"].append(steady(tickets(n, tenants, seed=2000 + r, first_seq=DEEP),
                                         tickets(DEEP, tenants, seed=1000 + r)))
            runs["churn"].append(churn(tickets(n, tenants, seed=4000 + r, first_seq=DEEP),
                                       tickets(DEEP, tenants, seed=3000 + r), seed=r))
        for name, timings in runs.items():
            best_us = min(timings) / n * 1e6
            if name != "churn":
                top = max(top, best_us)
            print(f"{tenants:>8,} {name:<16} {best_us:>13.2f} {max(timings) / n * 1e6:>14.2f}")
    print(f"\npush+pop, worst case: {top:.2f} µs (goal ≤ {GOAL_US:.0f} µs: {'PASS' if top <= GOAL_US else 'MISS'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
