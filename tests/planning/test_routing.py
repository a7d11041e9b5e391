"""The routing policies as pure rules (fleet.planning.routing): the load bound over many
seeded random loads and keys, hits and spills in rendezvous order, least-loaded rotation,
which key each policy routes by, the memory of recent routes, and rendezvous hashing's
stability (known values), minimal movement and spread. No database, no clock."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from fleet.planning.routing import (
    ANCHOR_BLOCKS, LEAST_LOADED, NO_KEYS, OUTCOMES, PREFIX_AFFINITY, SESSION, RecentRoutes, RouteKeys, choose, key_cap,
    load_slack, rendezvous_order, within_bound,
)

KEYED = (PREFIX_AFFINITY, SESSION)


def random_loads(rng: random.Random) -> list[tuple[int, int]]:
    ids = rng.sample(range(1, 200), rng.randint(1, 6))
    top = rng.choice((0, 1, 3, 10, 40))
    return [(rid, rng.randint(0, top)) for rid in ids]


def random_keys(rng: random.Random) -> RouteKeys:
    blocks = tuple(rng.getrandbits(64) for _ in range(rng.choice((0, 0, 1, 3, 4, 7, 20))))
    session = rng.getrandbits(64) if rng.random() < 0.5 else None
    return RouteKeys(blocks, session)


def route_key(policy: str, keys: RouteKeys) -> tuple[tuple[int, ...], int] | None:
    """The chain a keyed policy routes by and its rendezvous key (the module's rule, spelled
    out again here so a change to it is caught)."""
    if policy == SESSION and keys.session is not None:
        return (keys.session,), keys.session
    if keys.blocks:
        return keys.blocks, keys.blocks[min(len(keys.blocks), ANCHOR_BLOCKS) - 1]
    if keys.session is not None:
        return (keys.session,), keys.session
    return None


# --- the load bound -------------------------------------------------------------------------------

@pytest.mark.parametrize("least, slack", [(0, 2), (1, 2), (7, 2), (8, 2), (9, 3), (12, 3), (40, 10), (41, 11)])
def test_the_slack_is_two_or_a_quarter_of_the_least_load_rounded_up(least, slack):
    assert load_slack(least) == slack
    assert within_bound(least + slack - 1, least) and not within_bound(least + slack, least)


def test_every_choice_over_random_loads_and_keys_stays_within_the_bound_and_follows_the_rules():
    rng = random.Random(17)
    outcomes: Counter[str] = Counter()
    for _ in range(5000):
        loads = random_loads(rng)
        policy = rng.choice((*KEYED, LEAST_LOADED))
        keys = random_keys(rng)
        recent = RecentRoutes()
        if rng.random() < 0.5:  # some keys already remembered somewhere, some of them on replicas gone since
            for key in keys.blocks + ((keys.session,) if keys.session is not None else ()):
                if rng.random() < 0.5:
                    recent.remember([key], rng.choice([rid for rid, _ in loads] + [999]))
        load_of = dict(loads)
        least = min(load_of.values())
        turn = rng.randint(0, 1000)
        expected_preferred = None
        keyed = route_key(policy, keys) if policy in KEYED else None
        if keyed is not None:
            chain, anchor = keyed
            depth = min(len(chain), ANCHOR_BLOCKS)
            held = recent.holders(chain, load_of, depth)
            if held:  # the most recent holder within the bound, else the next, else the most recent
                expected_preferred = next((rid for rid in held if within_bound(load_of[rid], least)), held[0])
            else:
                expected_preferred = rendezvous_order(anchor, load_of)[0]

        decision = choose(policy, loads, keys, recent, turn)

        outcomes[decision.outcome] += 1
        assert decision.outcome in OUTCOMES
        assert decision.replica_id in load_of
        assert within_bound(load_of[decision.replica_id], least), (loads, decision)
        if keyed is None:
            tied = [rid for rid, load in loads if load == least]
            assert decision.replica_id == tied[turn % len(tied)]
            assert decision.preferred is None
            assert decision.outcome == (LEAST_LOADED if policy == LEAST_LOADED else "unkeyed")
            continue
        chain, anchor = keyed
        assert decision.preferred == expected_preferred
        if within_bound(load_of[expected_preferred], least):
            assert (decision.outcome, decision.replica_id) == ("hit", expected_preferred)
        else:
            spill = next(rid for rid in rendezvous_order(anchor, load_of)
                         if rid != expected_preferred and within_bound(load_of[rid], least))
            assert (decision.outcome, decision.replica_id) == ("spill", spill)
        # The choice is remembered for the whole chain: the next request of it prefers it.
        assert recent.deepest(chain, load_of, 1) == decision.replica_id
    # The seeds reach every outcome, often.
    assert min(outcomes[o] for o in OUTCOMES) > 200, outcomes


def test_a_preferred_replica_within_the_bound_takes_the_request():
    keys = RouteKeys(blocks=(11, 22, 33, 44, 55))
    ids = [1, 2, 3]
    first = rendezvous_order(44, ids)[0]
    loads = [(rid, 1 if rid == first else 0) for rid in ids]  # one more than the others: within the slack
    decision = choose(PREFIX_AFFINITY, loads, keys)
    assert (decision.replica_id, decision.outcome, decision.preferred) == (first, "hit", first)


def test_a_hot_prefix_spills_to_the_next_replica_within_the_bound_in_rendezvous_order_every_time():
    keys = RouteKeys(blocks=(101, 202, 303, 404))
    ids = [5, 6, 7, 8]
    order = rendezvous_order(404, ids)
    # The preferred is two above the least; the second in its order too: the third takes it.
    loads = [(order[0], 4), (order[1], 4), (order[2], 3), (order[3], 2)]
    for _ in range(5):  # without memory: the same answer in every call (and every process)
        decision = choose(PREFIX_AFFINITY, loads, keys)
        assert (decision.replica_id, decision.outcome, decision.preferred) == (order[2], "spill", order[0])
    # With memory, the spill is remembered: while it stays within the bound, it is a hit there.
    recent = RecentRoutes()
    assert choose(PREFIX_AFFINITY, loads, keys, recent).replica_id == order[2]
    again = choose(PREFIX_AFFINITY, loads, keys, recent)
    assert (again.replica_id, again.outcome, again.preferred) == (order[2], "hit", order[2])


def test_least_loaded_takes_turns_among_the_tied_and_never_picks_a_busier_one():
    loads = [(3, 0), (9, 0), (4, 2), (1, 0)]
    chosen = [choose(LEAST_LOADED, loads, RouteKeys(blocks=(1, 2, 3, 4)), turn=t).replica_id for t in range(6)]
    assert chosen == [3, 9, 1, 3, 9, 1]
    assert {choose(LEAST_LOADED, loads, turn=t).outcome for t in range(6)} == {LEAST_LOADED}


@pytest.mark.parametrize("policy", KEYED)
def test_a_keyed_policy_without_blocks_or_session_falls_back_to_least_loaded(policy):
    loads = [(1, 2), (2, 0), (3, 0)]
    recent = RecentRoutes()
    decisions = [choose(policy, loads, NO_KEYS, recent, turn=t) for t in range(4)]
    assert [d.replica_id for d in decisions] == [2, 3, 2, 3]
    assert {(d.outcome, d.preferred) for d in decisions} == {("unkeyed", None)}
    assert len(recent) == 0  # nothing to remember


def test_the_session_policy_routes_by_the_session_and_else_by_the_prefix():
    ids = [(rid, 0) for rid in range(1, 9)]
    session = 0xC0FFEE
    by_session = rendezvous_order(session, [rid for rid, _ in ids])[0]
    # Different prompts of one session: one replica, the session's.
    for blocks in [(), (1,), (1, 2, 3, 4, 5), tuple(range(50, 70))]:
        decision = choose(SESSION, ids, RouteKeys(blocks, session))
        assert (decision.replica_id, decision.outcome) == (by_session, "hit")
    # Without a session: the prompt's anchor (the fourth block, or the last of a shorter prompt).
    assert choose(SESSION, ids, RouteKeys((1, 2, 3, 4, 5))).replica_id == rendezvous_order(4, range(1, 9))[0]
    assert choose(SESSION, ids, RouteKeys((7, 8))).replica_id == rendezvous_order(8, range(1, 9))[0]


def test_the_prefix_policy_routes_by_the_prefix_and_else_by_the_session():
    ids = [(rid, 0) for rid in range(1, 9)]
    for session in (None, 1, 2, 3):  # the session does not matter while there is a block
        decision = choose(PREFIX_AFFINITY, ids, RouteKeys((10, 20, 30, 40, 50, 60), session))
        assert decision.replica_id == rendezvous_order(40, range(1, 9))[0]
    assert choose(PREFIX_AFFINITY, ids, RouteKeys((), 0xBEEF)).replica_id == rendezvous_order(0xBEEF, range(1, 9))[0]


def test_prompts_sharing_the_anchor_share_a_replica_without_memory():
    ids = [(rid, 0) for rid in range(1, 6)]
    shared = (71, 72, 73, 74)
    chosen = {choose(PREFIX_AFFINITY, ids, RouteKeys(shared + tail)).replica_id
              for tail in [(), (1,), (2, 3), tuple(range(100, 140))]}
    assert chosen == {rendezvous_order(74, range(1, 6))[0]}


# --- the memory of recent routes ------------------------------------------------------------------

def test_recent_routes_answer_the_deepest_remembered_block_of_a_live_replica():
    recent = RecentRoutes()
    recent.remember([1, 2, 3, 4, 5], 10)
    recent.remember([1, 2, 3, 4, 6, 7], 20)  # shares four blocks with the first, then goes on elsewhere
    assert recent.deepest([1, 2, 3, 4, 5, 9], {10, 20}, ANCHOR_BLOCKS) == 10  # block 5 is deeper than 4
    assert recent.deepest([1, 2, 3, 4, 8], {10, 20}, ANCHOR_BLOCKS) == 20  # block 4 was re-sent to 20
    assert recent.deepest([1, 2, 3, 4, 5], {20}, ANCHOR_BLOCKS) == 20  # 10 is gone: the next deepest
    assert recent.deepest([1, 2, 3, 4, 5], {30}, ANCHOR_BLOCKS) is None
    assert recent.deepest([], {10, 20}, 1) is None
    # A depth of 0 or less looks at every key, once (index -1 is not the last key again).
    assert recent.deepest([], {10, 20}, 0) is None
    assert recent.deepest([1, 2, 3, 4, 5], {10}, 0) == recent.deepest([1, 2, 3, 4, 5], {10}, 1) == 10


def test_a_shallow_match_below_the_anchor_depth_is_not_used():
    recent = RecentRoutes()
    ids = [1, 2, 3, 4, 5]
    prompt = (61, 62, 63, 64, 65)
    ranked = rendezvous_order(64, ids)
    recent.remember([61, 62, 63], ranked[-1])  # another prompt shared three blocks, on the last-ranked replica
    assert recent.deepest(prompt, set(ids), ANCHOR_BLOCKS) is None
    assert recent.deepest(prompt, set(ids), 3) == ranked[-1]
    # A prompt that is itself only three blocks long is its whole anchor: that match counts.
    short = choose(PREFIX_AFFINITY, [(rid, 0) for rid in ids], RouteKeys((61, 62, 63)), recent)
    assert (short.replica_id, short.outcome) == (ranked[-1], "hit")
    decision = choose(PREFIX_AFFINITY, [(rid, 0) for rid in ids], RouteKeys(prompt), recent)
    assert (decision.replica_id, decision.preferred) == (ranked[0], ranked[0])
    # The longer prompt's choice is remembered for its whole chain, its first three blocks too.
    assert recent.deepest((61, 62, 63), set(ids), 3) == ranked[0]


def test_recent_routes_keep_the_most_recently_used_up_to_their_capacity():
    recent = RecentRoutes(capacity=3)
    for key in (1, 2, 3):
        recent.remember([key], key * 10)
    recent.remember([1], 10)  # used again: now the most recent
    recent.remember([4], 40)  # over capacity: the least recently used (2) goes
    assert len(recent) == 3
    alive = {10, 20, 30, 40}
    assert [recent.deepest([k], alive, 1) for k in (1, 2, 3, 4)] == [10, None, 30, 40]
    recent.remember([5, 6], 50)  # two more: 3, then 1
    assert [recent.deepest([k], alive | {50}, 1) for k in (1, 3, 4, 5, 6)] == [None, None, 40, 50, 50]
    assert len(recent) == 3


def test_a_remembered_replica_that_is_gone_is_ignored_and_the_key_is_routed_again():
    recent = RecentRoutes()
    keys = RouteKeys((1, 2, 3, 4))
    recent.remember(keys.blocks, 99)
    loads = [(1, 0), (2, 0), (3, 0)]
    decision = choose(PREFIX_AFFINITY, loads, keys, recent)
    first = rendezvous_order(4, [1, 2, 3])[0]
    assert (decision.replica_id, decision.outcome, decision.preferred) == (first, "hit", first)
    assert recent.deepest(keys.blocks, {1, 2, 3, 99}, 1) == first  # overwritten: 99 is forgotten for it


def test_a_replica_going_away_moves_its_remembered_prefix_to_one_other_replica_that_keeps_it():
    recent = RecentRoutes()
    keys = RouteKeys((5, 6, 7, 8, 9))
    loads = [(1, 0), (2, 0), (3, 0)]
    home = choose(PREFIX_AFFINITY, loads, keys, recent).replica_id
    rest = [(rid, load) for rid, load in loads if rid != home]
    moved = {choose(PREFIX_AFFINITY, rest, keys, recent).replica_id for _ in range(5)}
    assert moved == {rendezvous_order(8, [rid for rid, _ in rest])[0]}
    # When the replica comes back, the prefix stays where it went (its cache is warm there).
    assert recent.holders(keys.blocks, {1, 2, 3}, 4) == (*moved, home)
    assert choose(PREFIX_AFFINITY, loads, keys, recent).replica_id in moved


# --- rendezvous hashing ---------------------------------------------------------------------------

#: Computed once from the module: a change to the hash moves every prefix in every process.
KNOWN = [
    (0, [1, 2, 3, 4], [3, 4, 2, 1]),
    (1, [1, 2, 3, 4], [3, 2, 4, 1]),
    (0xDEADBEEF, [1, 2, 3, 4], [4, 3, 1, 2]),
    (2**64 - 1, [1, 2, 3, 4], [2, 1, 3, 4]),
    (12345678901234567, [7, 42, 1000, 3], [42, 1000, 7, 3]),
]


@pytest.mark.parametrize("key, ids, expected", KNOWN)
def test_rendezvous_order_has_fixed_known_values(key, ids, expected):
    assert rendezvous_order(key, ids) == expected


def test_rendezvous_order_is_a_ranking_of_the_ids_whatever_their_order_in():
    for key in (0, 3, 2**63):
        ranked = rendezvous_order(key, [4, 1, 3, 2])
        assert sorted(ranked) == [1, 2, 3, 4]
        assert rendezvous_order(key, (2, 3, 1, 4)) == ranked == rendezvous_order(key, {1, 2, 3, 4})


def test_removing_a_replica_moves_only_the_keys_that_ranked_it_first():
    rng = random.Random(2)
    ids = [3, 8, 15, 16, 23, 42]
    keys = [rng.getrandbits(64) for _ in range(2000)]
    before = {key: rendezvous_order(key, ids) for key in keys}
    for gone in ids:
        rest = [rid for rid in ids if rid != gone]
        moved = 0
        for key in keys:
            after = rendezvous_order(key, rest)
            assert after == [rid for rid in before[key] if rid != gone]  # everyone else's order as it was
            if before[key][0] == gone:
                moved += 1
                assert after[0] == before[key][1]
            else:
                assert after[0] == before[key][0]
        assert 2000 / 6 * 0.7 < moved < 2000 / 6 * 1.3  # about a sixth: its own keys


@pytest.mark.parametrize("keys", ["random", "consecutive"])
def test_keys_spread_roughly_evenly_over_the_replicas(keys):
    rng = random.Random(5)
    values = [rng.getrandbits(64) for _ in range(2000)] if keys == "random" else list(range(2000))
    for ids in ([1, 2], [1, 2, 3, 4], [10, 11, 12, 13, 14, 15, 16, 17]):
        firsts = Counter(rendezvous_order(key, ids)[0] for key in values)
        share = len(values) / len(ids)
        assert set(firsts) == set(ids)
        assert all(0.75 * share < n < 1.25 * share for n in firsts.values()), firsts


def test_a_spilled_prefix_is_held_by_two_replicas_and_stays_on_one_until_load_moves_it():
    keys = RouteKeys(blocks=(71, 72, 73, 74, 75))
    ids = [1, 2, 3, 4]
    order = rendezvous_order(74, ids)
    recent = RecentRoutes()
    assert choose(PREFIX_AFFINITY, [(rid, 0) for rid in ids], keys, recent).replica_id == order[0]
    busy = [(rid, 2 if rid == order[0] else 0) for rid in ids]  # over the bound: spills to the next
    spilled = choose(PREFIX_AFFINITY, busy, keys, recent)
    assert (spilled.outcome, spilled.replica_id) == ("spill", order[1])
    assert recent.holders(keys.blocks, set(ids), ANCHOR_BLOCKS) == (order[1], order[0])
    # Both hold it now. It stays where it went while that one is within the bound, a request
    # more or less on either notwithstanding (moving each time would thrash both caches)...
    for first_load, second_load in ((1, 0), (0, 1), (0, 0)):
        loads = [(order[0], first_load), (order[1], second_load), (order[2], 0), (order[3], 0)]
        decision = choose(PREFIX_AFFINITY, loads, keys, recent)
        assert (decision.outcome, decision.replica_id) == ("hit", order[1])
    # ...and goes back to the other holder, without a spill, once it is over the bound.
    loads = [(order[0], 0), (order[1], 2), (order[2], 0), (order[3], 0)]
    decision = choose(PREFIX_AFFINITY, loads, keys, recent)
    assert (decision.outcome, decision.replica_id) == ("hit", order[0])
    assert recent.holders(keys.blocks, set(ids), ANCHOR_BLOCKS) == (order[0], order[1])


def test_a_key_keeps_at_most_two_holders_and_forgets_the_gone_and_the_oldest():
    recent = RecentRoutes()
    for rid in (1, 2, 3):
        recent.remember([5], rid)
    assert recent.holders([5], {1, 2, 3}, 1) == (3, 2)  # HOLDERS = 2: 1 is forgotten
    assert recent.holders([5], {2}, 1) == (2,)  # 3 gone: only 2 is answered
    recent.remember([5], 2)
    assert recent.holders([5], {1, 2, 3}, 1) == (2, 3)


def test_new_prefixes_that_all_rank_one_replica_first_are_capped_there_by_the_key_bound():
    ids = [1, 2]
    # Anchors whose rendezvous order puts replica 1 first: by the hash alone all six would
    # land on one replica's cache.
    anchors = [k for k in range(10_000) if rendezvous_order(k, ids)[0] == 1][:6]
    recent = RecentRoutes()
    homes = []
    for anchor in anchors:
        blocks = (anchor + 10**9, anchor + 2 * 10**9, anchor + 3 * 10**9, anchor)  # the 4th block is the anchor
        homes.append(choose(PREFIX_AFFINITY, [(1, 0), (2, 0)], RouteKeys(blocks=blocks), recent).replica_id)
    assert homes.count(1) == homes.count(2) == 3, homes  # an even share: a handful of keys
    assert recent.home_counts() == {1: homes.count(1), 2: homes.count(2)}
    # Each then stays where it was put.
    for anchor, home in zip(anchors, homes):
        blocks = (anchor + 10**9, anchor + 2 * 10**9, anchor + 3 * 10**9, anchor, anchor + 5 * 10**9)
        assert choose(PREFIX_AFFINITY, [(1, 0), (2, 0)], RouteKeys(blocks=blocks), recent).replica_id == home


def test_key_cap_is_an_even_share_for_a_few_keys_and_a_quarter_more_for_many():
    assert [key_cap(n, 2) for n in range(8)] == [1, 1, 2, 2, 3, 3, 4, 5]
    assert key_cap(0, 8) == 1 and key_cap(79, 8) == 12 and key_cap(799, 8) == 125


def test_after_an_outage_the_prefix_stays_on_the_replica_that_took_it_over():
    keys = RouteKeys(blocks=(81, 82, 83, 84))
    ids = [1, 2]
    home, other = rendezvous_order(84, ids)
    recent = RecentRoutes()
    choose(PREFIX_AFFINITY, [(home, 0), (other, 0)], keys, recent)
    # The home goes away for a while: the prefix goes to the other, which now holds it too.
    assert choose(PREFIX_AFFINITY, [(other, 0)], keys, recent).replica_id == other
    assert recent.holders(keys.blocks, set(ids), ANCHOR_BLOCKS) == (other, home)
    # Back and idle: it stays where its cache is warm now (a fresh process would send it
    # home: both replicas hold it then, which costs one prefill, not one per request).
    assert choose(PREFIX_AFFINITY, [(home, 0), (other, 0)], keys, recent).replica_id == other
    assert choose(PREFIX_AFFINITY, [(home, 0), (other, 0)], keys, RecentRoutes()).replica_id == home
