"""What the gateway routes a request by (gateway.routing): the prompt's bytes in the order
its engine reads them, its chained 256-byte block hashes, the session, and which policies
and endpoints have keys at all; and the same keys and replica order in fresh processes
whatever their PYTHONHASHSEED (Python's ``hash`` would differ per process)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest

from fleet.live import NO_KEYS
from fleet.planning.routing import LEAST_LOADED, PREFIX_AFFINITY, SESSION, rendezvous_order
from gateway.routing import (
    BLOCK_BYTES, MAX_BLOCKS, SESSION_HEADER, block_hashes, prompt_bytes, route_keys, session_hash,
)
from tests.processes import PYTHON, ROOT

SYSTEM = "You are the support assistant of a shop selling garden tools. " * 20  # ~1.2 KiB


# --- the prompt's bytes ---------------------------------------------------------------------------

def test_a_chat_prompt_is_its_roles_and_contents_in_order_with_text_parts_by_their_text():
    body = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "Hello "},
                                                      {"type": "text", "text": "there"}]},
                         {"role": "assistant", "content": None}]}
    assert prompt_bytes("chat/completions", body) == b"system:Be brief.\x1euser:Hello there\x1eassistant:"
    # The same words as one string or as text parts are the same prompt (the same cache).
    as_string = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"},
                              {"role": "assistant", "content": None}]}
    assert prompt_bytes("chat/completions", as_string) == prompt_bytes("chat/completions", body)


def test_a_chat_prompt_starts_with_its_tools_and_keeps_other_parts_whole():
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"tools": tools, "messages": [{"role": "user", "content": [{"type": "text", "text": "what is "}, image]}]}
    data = prompt_bytes("chat/completions", body)
    assert data.startswith(json.dumps(tools, sort_keys=True).encode() + b"\x1euser:what is ")
    assert data.endswith(json.dumps(image, sort_keys=True).encode())
    # Other tools are another prompt from the first byte.
    other = prompt_bytes("chat/completions", {**body, "tools": [{"type": "function", "function": {"name": "x"}}]})
    assert other[:1] == data[:1] and other[:40] != data[:40]


def test_a_chat_prompt_skips_what_is_not_a_message():
    body = {"messages": [{"role": "user", "content": "a"}, "junk", 7, {"role": "user", "content": "b"}]}
    assert prompt_bytes("chat/completions", body) == b"user:a\x1euser:b"
    assert prompt_bytes("chat/completions", {}) == b""


def test_a_completions_prompt_is_its_string_the_first_of_a_list_or_its_token_ids():
    assert prompt_bytes("completions", {"prompt": "Once upon a time"}) == b"Once upon a time"
    assert prompt_bytes("completions", {"prompt": ["first", "second"]}) == b"first"
    assert prompt_bytes("completions", {"prompt": [1, 2, 3]}) == b"[1, 2, 3]"
    assert prompt_bytes("completions", {"prompt": [[4, 5], [6]]}) == b"[4, 5]"
    assert prompt_bytes("completions", {"prompt": []}) == b""
    assert prompt_bytes("completions", {}) == b""


def test_a_responses_prompt_is_its_instructions_then_its_input():
    assert prompt_bytes("responses", {"instructions": "Be kind.", "input": "Hi"}) == b"Be kind.\x1eHi"
    assert prompt_bytes("responses", {"input": "Hi"}) == b"Hi"
    listed = prompt_bytes("responses", {"input": [{"role": "user", "content": "Hi"}]})
    assert listed == json.dumps({"role": "user", "content": "Hi"}, sort_keys=True).encode()


def test_an_endpoint_without_a_prompt_has_no_prompt_bytes():
    assert prompt_bytes("embeddings", {"input": SYSTEM}) == b""


# --- the blocks -----------------------------------------------------------------------------------

def test_block_hashes_are_chained_blake2b_of_each_whole_prefix():
    data = bytes(range(256)) * 3 + b"tail"
    hashes = block_hashes(data)
    assert len(hashes) == 3
    for i, value in enumerate(hashes):  # the i-th names the whole prompt up to the end of block i
        prefix = data[:(i + 1) * BLOCK_BYTES]
        assert value == int.from_bytes(hashlib.blake2b(prefix, digest_size=8).digest(), "little")


def test_block_and_session_hashes_have_fixed_known_values():
    # Computed once: a change here moves every prefix and session to other replicas.
    assert block_hashes(bytes(range(256)) * 2) == (0x3FAD55D6FEED2C2B, 0x0E2AEB5A5F34ACE4)
    assert session_hash("s-1") == 0x47A9E62B40E07ADE


def test_a_prompt_extending_another_shares_its_leading_hashes():
    base = b"s" * (BLOCK_BYTES * 4)
    longer = block_hashes(base + b"user: a question that goes on" * 30)
    shorter = block_hashes(base + b"user: another")
    assert longer[:4] == shorter[:4] == block_hashes(base)
    assert len(longer) > 4 and len(shorter) == 4
    # One byte changed in the first block: no hash in common (chained).
    changed = block_hashes(b"S" + base[1:])
    assert not set(changed) & set(block_hashes(base))


def test_a_prompt_shorter_than_one_block_has_no_blocks():
    assert block_hashes(b"x" * (BLOCK_BYTES - 1)) == ()
    assert block_hashes(b"") == ()
    assert len(block_hashes(b"x" * BLOCK_BYTES)) == 1
    assert len(block_hashes(b"x" * (2 * BLOCK_BYTES - 1))) == 1


def test_at_most_max_blocks_are_hashed():
    huge = os.urandom(BLOCK_BYTES * (MAX_BLOCKS + 10))
    hashes = block_hashes(huge)
    assert len(hashes) == MAX_BLOCKS
    assert hashes == block_hashes(huge[:BLOCK_BYTES * MAX_BLOCKS])


# --- the keys -------------------------------------------------------------------------------------

def chat(system: str, question: str, **extra) -> dict:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}], **extra}


def test_the_session_comes_from_the_header_over_the_user_field():
    body = chat(SYSTEM, "hi", user="alice")
    assert route_keys(SESSION, "chat/completions", body, {SESSION_HEADER: "s-1"}).session == session_hash("s-1")
    assert route_keys(SESSION, "chat/completions", body, {}).session == session_hash("alice")
    assert route_keys(SESSION, "chat/completions", body, {SESSION_HEADER: ""}).session == session_hash("alice")
    assert route_keys(SESSION, "chat/completions", chat(SYSTEM, "hi"), {}).session is None
    assert route_keys(SESSION, "chat/completions", chat(SYSTEM, "hi", user=17), {}).session is None
    assert session_hash("s-1") != session_hash("s-2")
    # A very long session id is cut, not hashed whole.
    long_id = "z" * 10_000
    assert route_keys(SESSION, "completions", {"prompt": "x"}, {SESSION_HEADER: long_id}).session \
        == session_hash(long_id[:512])


@pytest.mark.parametrize("policy", [PREFIX_AFFINITY, SESSION])
def test_keyed_policies_get_the_prompts_blocks_and_the_session(policy):
    body = chat(SYSTEM, "where is my order?")
    keys = route_keys(policy, "chat/completions", body, {SESSION_HEADER: "abc"})
    assert keys.blocks == block_hashes(prompt_bytes("chat/completions", body)) and len(keys.blocks) >= 4
    assert keys.session == session_hash("abc")
    # Another user turn after the same long system prompt: the same leading blocks.
    other = route_keys(policy, "chat/completions", chat(SYSTEM, "can I return a rake?"), {})
    assert other.blocks[:4] == keys.blocks[:4]


def test_least_loaded_and_embeddings_have_no_keys():
    headers = {SESSION_HEADER: "abc"}
    assert route_keys(LEAST_LOADED, "chat/completions", chat(SYSTEM, "x"), headers) is NO_KEYS
    assert route_keys(PREFIX_AFFINITY, "embeddings", {"input": SYSTEM}, headers) is NO_KEYS
    assert route_keys(SESSION, "embeddings", {"input": SYSTEM, "user": "u"}, headers) is NO_KEYS


# --- stable across processes ----------------------------------------------------------------------

BODIES = [
    ("chat/completions", chat(SYSTEM, "hi"), {SESSION_HEADER: "tenant-7"}),
    ("completions", {"prompt": "Ünïcödé " * 200, "user": "bob"}, {}),
    ("completions", {"prompt": list(range(400))}, {}),
    ("responses", {"instructions": SYSTEM, "input": "hello"}, {}),
]

KEYS_SCRIPT = """
import json, sys
import django
django.setup()
from gateway.routing import route_keys
from fleet.planning.routing import rendezvous_order
out = []
for path, body, headers in json.loads(sys.stdin.read()):
    keys = route_keys("session", path, body, headers)
    anchor = keys.blocks[min(len(keys.blocks), 4) - 1] if keys.blocks else keys.session
    out.append([list(keys.blocks), keys.session, rendezvous_order(anchor, [11, 12, 13, 14, 15])])
print(json.dumps(out))
"""


def keys_here() -> list:
    out = []
    for path, body, headers in BODIES:
        keys = route_keys(SESSION, path, body, headers)
        anchor = keys.blocks[min(len(keys.blocks), 4) - 1] if keys.blocks else keys.session
        out.append([list(keys.blocks), keys.session, rendezvous_order(anchor, [11, 12, 13, 14, 15])])
    return out


def test_keys_and_replica_order_are_the_same_in_fresh_processes_with_other_hash_seeds():
    here = keys_here()
    assert all(blocks for blocks, _, _ in here)  # every body is long enough to have blocks
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "DJANGO_SETTINGS_MODULE": "tests.settings"}
        done = subprocess.run([PYTHON, "-c", KEYS_SCRIPT], input=json.dumps(BODIES), capture_output=True, text=True,
                              cwd=str(ROOT), env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.strip().splitlines()[-1]) == here, f"PYTHONHASHSEED={seed}"
