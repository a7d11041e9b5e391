"""The routing policies through a real web process (gateway.routing, fleet.live.route): two
ready replicas of one model on fake engines, the answering replica read from
``X-Llmgw-Replica``. A tenant's long system prompt stays on one replica and tenants spread;
least-loaded takes turns once the policy is changed in the database; a session stays on
one replica; a hot prefix spills to the other replica while two streams hold its own;
a replica going away (engine killed, or row no longer ready) moves its prefix, nothing
failing. Where each key lands is predicted in this process with the same hashes, so the
web process must hash as this one does."""

from __future__ import annotations

import json

import httpx
import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from catalog.models import Model, Profile
from fleet.models import Agent, Replica
from fleet.planning.routing import (ANCHOR_BLOCKS, LEAST_LOADED, PREFIX_AFFINITY, SESSION, RecentRoutes, choose,
                                    rendezvous_order)
from gateway.routing import SESSION_HEADER, route_keys, session_hash
from tests.processes import fake_engine, free_port, open_request, wait_for_port, wait_until, web_server
from tests.replicas import ENGINE_KEY, serve

pytestmark = [pytest.mark.django_db(transaction=True)]

#: A tenant's system prompt: over a KiB, so its first ANCHOR_BLOCKS blocks are its own.
FILLER = ("Answer as the support desk of this shop: politely, in short sentences, never promising a refund "
          "before the order number is checked. ") * 10


def system_prompt(tenant: str) -> str:
    return f"Tenant {tenant}. {FILLER}"


def chat_body(model: str, system: str, question: str, **extra) -> dict:
    return {"model": model, "max_tokens": 1, **extra,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}


@pytest.fixture(scope="module")
def servers(django_db_setup, tmp_path_factory):
    logs = tmp_path_factory.mktemp("routing")
    ports = {name: free_port() for name in ("a", "b", "web")}
    records = {name: logs / f"{name}.jsonl" for name in ("a", "b")}
    # Slow tokens, so that a stream asking for thousands holds its replica until the test hangs
    # it up; the tests' own requests ask for one.
    engines = [fake_engine(ports[name], logs, "--tokens", "4000", "--token-delay-ms", "30",
                           "--record", str(records[name]), api_key=ENGINE_KEY) for name in ("a", "b")]
    for name in ("a", "b"):
        wait_for_port(ports[name])
    # No worker runs, and the test's agent row is told alive per test: a long route grace keeps
    # its replicas routed through a slow test on a loaded machine.
    web = web_server(ports["web"], logs, env={
        "LLMGW_WATCH_INTERVAL": "50ms", "LLMGW_WATCH_FAST_INTERVAL": "20ms", "LLMGW_USAGE_FLUSH_INTERVAL": "0.2s",
        "LLMGW_GATEWAY_AUTH": "false", "LLMGW_AGENT_ROUTE_GRACE": "600s", "LLMGW_AGENT_LOST_AFTER": "3600s"})
    yield {"ports": ports, "records": records, "url": f"http://127.0.0.1:{ports['web']}", "web": web, "logs": logs}
    for proc in [web, *engines]:
        proc.stop()


def post(servers, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(servers["url"] + "/v1/chat/completions", json=body, headers=headers or {}, timeout=120)


def replica_of(response: httpx.Response) -> int:
    """The replica id that answered (``X-Llmgw-Replica: ID@AGENT``), after checking the answer."""
    assert response.status_code == 200, response.text
    return int(response.headers["x-llmgw-replica"].split("@", 1)[0])


def engine_contents(servers, name: str) -> list[str]:
    """Every message content the engine ``name`` was sent, in order."""
    path = servers["records"][name]
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [c for r in lines if r.get("event") == "request" for c in r.get("contents") or () if isinstance(c, str)]


def decisions(servers, model: str) -> dict[tuple[str, str], float]:
    """``llmgw_routing_decisions_total`` of ``model`` from /metrics: (policy, outcome) → count."""
    text = httpx.get(servers["url"] + "/metrics", timeout=60).text
    return {(s.labels["policy"], s.labels["outcome"]): s.value
            for family in text_string_to_metric_families(text) if family.name == "llmgw_routing_decisions"
            for s in family.samples if s.name == "llmgw_routing_decisions_total" and s.labels.get("model") == model}


@pytest.fixture
def pair(servers, make_model):
    """``make(name, policy, ports)``: a model of ``policy`` with a ready replica on each of
    the engines at ``ports`` (the module's two by default), once the web process routes to
    both; returns the model and its two replicas."""
    def make(name: str, policy: str, ports: tuple[int, int] | None = None,
             profile: Profile | None = None) -> tuple[Model, Replica, Replica]:
        model = make_model(name, min_replicas=2, max_replicas=2, routing_policy=policy,
                           **({"profile": profile} if profile else {}))
        first, second = (serve(model, port) for port in (ports or (servers["ports"]["a"], servers["ports"]["b"])))
        Agent.objects.filter(name="local").update(last_seen_at=timezone.now())
        seen: set[int] = set()

        def both_routed():
            # A prompt shorter than a block has no key: least-loaded turns, under any policy.
            seen.add(replica_of(post(servers, chat_body(name, "hi", "probe"))))
            return seen >= {first.pk, second.pk}
        wait_until(both_routed, timeout_s=120, interval_s=0.01, what="both replicas routed")
        assert seen == {first.pk, second.pk}  # never a replica of another model
        return model, first, second
    return make


def prefers(policy: str, body: dict, headers: dict, replicas: list[int]) -> int:
    """The replica the keys of a request prefer when nothing is remembered (rendezvous order
    of its anchor), computed here: the web process must agree."""
    keys = route_keys(policy, "chat/completions", body, headers)
    if policy == SESSION and keys.session is not None:
        anchor = keys.session
    else:
        assert keys.blocks, "a prompt shorter than a block"
        anchor = keys.blocks[min(len(keys.blocks), ANCHOR_BLOCKS) - 1]
    return rendezvous_order(anchor, replicas)[0]


class Mirror:
    """The web process's choices for requests sent one at a time (every replica idle at each
    choice), replayed here with the same rules and a memory of its own: rendezvous order,
    the key bound, what was remembered."""

    def __init__(self, policy: str, replicas: list[int]) -> None:
        self.policy, self.replicas, self.recent = policy, replicas, RecentRoutes()

    def expect(self, body: dict, headers: dict | None = None) -> int:
        keys = route_keys(self.policy, "chat/completions", body, headers or {})
        return choose(self.policy, [(rid, 0) for rid in self.replicas], keys, self.recent).replica_id


def tenants_by_replica(model: str, replicas: list[int], each: int = 3) -> dict[int, list[str]]:
    """``each`` tenants whose system prompt prefers each replica."""
    by: dict[int, list[str]] = {rid: [] for rid in replicas}
    for i in range(200):
        tenant = f"t{i}"
        rid = prefers(PREFIX_AFFINITY, chat_body(model, system_prompt(tenant), "q"), {}, replicas)
        if len(by[rid]) < each:
            by[rid].append(tenant)
        if all(len(v) == each for v in by.values()):
            return by
    raise AssertionError(f"200 tenants did not cover the replicas: {by}")


QUESTIONS = ["Where is my order?", "Can I return a rake bought last spring?", "Do you ship to Norway?",
             "My shears arrived broken, what now? " * 12, "hello"]


def test_a_tenants_long_system_prompt_stays_on_one_replica_and_tenants_spread_over_both(servers, pair):
    model, a, b = pair("routed-prefix", PREFIX_AFFINITY)
    by = tenants_by_replica(model.name, [a.pk, b.pk])
    mirror = Mirror(PREFIX_AFFINITY, [a.pk, b.pk])
    landed: dict[str, set[int]] = {}
    for question in QUESTIONS:  # interleaved: every tenant asks each question in turn
        for rid, tenants in by.items():
            for tenant in tenants:
                body = chat_body(model.name, system_prompt(tenant), question)
                answer = post(servers, body)
                assert replica_of(answer) == mirror.expect(body), (tenant, question)
                landed.setdefault(tenant, set()).add(replica_of(answer))
    assert all(len(replicas) == 1 for replicas in landed.values()), landed
    # Both replicas are home to tenants (by rendezvous, three prefer each; the key bound keeps
    # a replica from taking more than its share of new ones).
    assert {rid for replicas in landed.values() for rid in replicas} == {a.pk, b.pk}
    counted = decisions(servers, model.name)
    assert counted[(PREFIX_AFFINITY, "hit")] >= len(QUESTIONS) * 6
    assert (PREFIX_AFFINITY, "spill") not in counted  # one request at a time: never over the bound


def test_least_loaded_takes_turns_once_the_policy_is_changed_in_the_database(servers, pair):
    model, a, b = pair("routed-least", PREFIX_AFFINITY)
    body = chat_body(model.name, system_prompt("one-tenant"), "Where is my order?")
    home = prefers(PREFIX_AFFINITY, body, {}, [a.pk, b.pk])
    assert {replica_of(post(servers, body)) for _ in range(4)} == {home}

    Model.objects.filter(pk=model.pk).update(routing_policy=LEAST_LOADED)

    def refreshed():
        post(servers, chat_body(model.name, "hi", "probe"))
        return decisions(servers, model.name).get((LEAST_LOADED, LEAST_LOADED), 0) > 0
    wait_until(refreshed, timeout_s=60, interval_s=0.05, what="the gateway's cache to carry the new policy")
    chosen = [replica_of(post(servers, body)) for _ in range(8)]
    # One request at a time, both idle between: they take turns, the prefix notwithstanding.
    assert all(x != y for x, y in zip(chosen, chosen[1:])), chosen
    assert set(chosen) == {a.pk, b.pk}


def test_a_session_stays_on_one_replica_and_sessions_spread_over_both(servers, pair):
    model, a, b = pair("routed-session", SESSION)
    by: dict[int, list[str]] = {a.pk: [], b.pk: []}
    for i in range(200):
        session = f"conversation-{i}"
        rid = rendezvous_order(session_hash(session), [a.pk, b.pk])[0]
        if len(by[rid]) < 3:
            by[rid].append(session)
    assert all(len(v) == 3 for v in by.values())
    # Each session's turns carry other tenants' prompts: the session routes, not the prompt.
    prompts = [system_prompt(f"t{i}") for i in range(4)]
    mirror = Mirror(SESSION, [a.pk, b.pk])
    landed: dict[str, set[int]] = {}
    for turn, question in enumerate(QUESTIONS):
        for rid, sessions in by.items():
            for session in sessions:
                body, headers = chat_body(model.name, prompts[turn % len(prompts)], question), {SESSION_HEADER: session}
                answer = post(servers, body, headers)
                assert replica_of(answer) == mirror.expect(body, headers), (session, turn)
                landed.setdefault(session, set()).add(replica_of(answer))
    assert all(len(replicas) == 1 for replicas in landed.values()), landed
    assert {rid for replicas in landed.values() for rid in replicas} == {a.pk, b.pk}
    # Without the header, OpenAI's `user` field names the session.
    session = by[b.pk][0]
    body = chat_body(model.name, prompts[0], "again", user=session)
    assert {replica_of(post(servers, body)) for _ in range(3)} == landed[session]
    assert decisions(servers, model.name)[(SESSION, "hit")] >= len(QUESTIONS) * 6 + 3


class Holder:
    """A streamed request of a prompt that holds its replica (thousands of slow tokens) until
    :meth:`release` hangs it up: the test decides when the load ends, not a clock."""

    def __init__(self, servers, body: dict) -> None:
        self.sock = open_request(servers["ports"]["web"], "/v1/chat/completions",
                                 {**body, "stream": True, "max_tokens": 4000})

    def release(self) -> None:
        self.sock.close()


def test_bounded_load_spills_a_hot_prefix_to_the_other_replica(servers, pair):
    model, a, b = pair("routed-hot", PREFIX_AFFINITY)
    engine_of = {a.pk: "a", b.pk: "b"}
    tenant = tenants_by_replica(model.name, [a.pk, b.pk], each=1)[a.pk][0]
    system = system_prompt(tenant)
    assert replica_of(post(servers, chat_body(model.name, system, "first"))) == a.pk
    holders = [Holder(servers, chat_body(model.name, system, f"holder-{i}-{model.pk}")) for i in range(2)]
    try:
        # Both streams are at the prefix's replica's engine: two in flight there, none on the other.
        wait_until(lambda: {f"holder-0-{model.pk}", f"holder-1-{model.pk}"} <= set(engine_contents(servers, "a")),
                   timeout_s=120, what="both holders at the prefix's engine")
        assert not any(c.startswith("holder-") and c.endswith(f"-{model.pk}") for c in engine_contents(servers, "b"))
        # Two above the least-loaded (0) is over the slack (2): the next request of the prefix spills.
        spilled = post(servers, chat_body(model.name, system, "while it is busy"))
        assert replica_of(spilled) == b.pk
        assert "while it is busy" in engine_contents(servers, engine_of[b.pk])
        counted = decisions(servers, model.name)
        assert counted[(PREFIX_AFFINITY, "spill")] == 1
        assert counted[(PREFIX_AFFINITY, "hit")] >= 3  # the first request and both holders
        # The prefix is remembered where it spilled: it stays there while that one is within the bound.
        assert replica_of(post(servers, chat_body(model.name, system, "and again"))) == b.pk
        assert decisions(servers, model.name)[(PREFIX_AFFINITY, "spill")] == 1
    finally:
        for holder in holders:
            holder.release()


def test_a_burst_of_one_prefix_to_an_engine_whose_prompt_is_counted_first_stays_within_the_bound(servers, pair):
    """llama-cpp-python's prompts are counted at its tokenizer before the request is sent:
    the request counts in flight from routing's choice, so a burst's choices see each other."""
    profile = Profile(name="routing-llama", engine=Profile.Engine.LLAMA_CPP_PYTHON, cpu_cores=1, memory_mib=128,
                      command="{python} -m llama_cpp.server --model {weights_path} --port {port} --n_ctx 100000",
                      readiness_path="/v1/models")
    profile.full_clean()
    profile.save()
    model, a, b = pair("routed-burst", PREFIX_AFFINITY, profile=profile)
    system = system_prompt("burst")
    tag = f"-{model.pk}-burst"
    holders = [Holder(servers, chat_body(model.name, system, f"b{i}{tag}")) for i in range(8)]
    try:
        def arrived() -> dict[str, int]:
            return {name: sum(1 for c in engine_contents(servers, name) if c.endswith(tag)) for name in ("a", "b")}
        wait_until(lambda: sum(arrived().values()) == 8, timeout_s=120, what="the burst at the engines")
        counts = arrived()
        # 8 at once with a slack of 2: never more than 2 apart, so at least 3 each.
        assert min(counts.values()) >= 3, counts
        assert decisions(servers, model.name)[(PREFIX_AFFINITY, "spill")] >= 1  # then held by both
    finally:
        for holder in holders:
            holder.release()


def test_an_engine_killed_under_its_prefix_moves_the_prefix_to_the_other_replica_and_nothing_fails(
        servers, pair):
    port = free_port()
    engine = fake_engine(port, servers["logs"], "--tokens", "4", api_key=ENGINE_KEY)
    try:
        wait_for_port(port)
        model, doomed, other = pair("routed-gone", PREFIX_AFFINITY, ports=(port, servers["ports"]["a"]))
        # The model's first prefix goes to its rendezvous home (a second would go to the
        # other replica: an even share of new prefixes each).
        by = tenants_by_replica(model.name, [doomed.pk, other.pk], each=1)
        systems = [system_prompt(t) for t in by[doomed.pk]]
        for system in systems:
            assert replica_of(post(servers, chat_body(model.name, system, "before"))) == doomed.pk
        engine.stop()
        assert engine.proc.returncode is not None
        # Its row still says ready: the refused connection is retried on the other replica, and
        # the prefix is remembered there.
        for question in QUESTIONS:
            for system in systems:
                assert replica_of(post(servers, chat_body(model.name, system, question))) == other.pk
        assert Replica.objects.get(pk=doomed.pk).state == "ready"
    finally:
        engine.stop()


def test_a_replica_no_longer_ready_moves_its_prefix_to_the_other_replica_and_nothing_fails(servers, pair):
    model, leaving, staying = pair("routed-drained", PREFIX_AFFINITY)
    tenant = tenants_by_replica(model.name, [leaving.pk, staying.pk], each=1)[leaving.pk][0]
    system = system_prompt(tenant)
    assert replica_of(post(servers, chat_body(model.name, system, "before"))) == leaving.pk
    Replica.objects.filter(pk=leaving.pk).update(state="draining")
    # Until the web process's next refresh the prefix may still go to it (it still answers).
    wait_until(lambda: replica_of(post(servers, chat_body(model.name, system, "moved?"))) == staying.pk,
               timeout_s=60, interval_s=0.05, what="the draining replica out of the routes")
    for question in QUESTIONS:
        assert replica_of(post(servers, chat_body(model.name, system, question))) == staying.pk
