"""System messages for an engine whose chat template drops them (llama-cpp-python's
``--chat_format gemma``): folded into the first user turn (``gateway.bodies``)."""

from __future__ import annotations

import json

from catalog.engines import engine_traits
from gateway.bodies import system_into_first_user, upstream_body

GEMMA = engine_traits("llama_cpp_python", "python -m llama_cpp.server --chat_format gemma --port {port}")
CHATML = engine_traits("llama_cpp_python", "python -m llama_cpp.server --chat_format chatml --port {port}")


def test_the_system_text_goes_before_the_first_user_turn_and_later_turns_stay():
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    assert system_into_first_user(messages) == [
        {"role": "user", "content": "You are terse.\n\nhi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"}]


def test_several_system_and_developer_messages_are_joined_in_order():
    messages = [{"role": "system", "content": "one"}, {"role": "developer", "content": [{"type": "text", "text": "two"}]},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert system_into_first_user(messages) == [
        {"role": "user", "content": [{"type": "text", "text": "one\n\ntwo\n\n"}, {"type": "text", "text": "hi"}]}]


def test_without_a_user_turn_the_system_text_becomes_one_and_without_system_nothing_changes():
    assert system_into_first_user([{"role": "system", "content": "only"}]) == [{"role": "user", "content": "only"}]
    assert system_into_first_user([{"role": "user", "content": "hi"}]) is None
    assert system_into_first_user("not a list") is None


def test_upstream_body_folds_for_the_gemma_format_only():
    body = {"model": "m", "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}
    raw = json.dumps(body).encode()
    folded, _ = upstream_body(body, raw, False, True, None, GEMMA)
    assert json.loads(folded)["messages"] == [{"role": "user", "content": "S\n\nU"}]
    kept, _ = upstream_body(body, raw, False, True, None, CHATML)
    assert json.loads(kept)["messages"] == body["messages"]
