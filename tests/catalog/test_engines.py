"""Engine traits from an engine's kind and command (``catalog.engines``): pure, no database."""
from __future__ import annotations

import pytest

from catalog.engines import ALL_ENDPOINTS, OPENAI_LIKE, context_length_from_command, engine_traits
from catalog.models import OPENAI_ENDPOINTS
from catalog.presets import PRESETS

TEXT = frozenset({"chat/completions", "completions"})
ALL = frozenset(OPENAI_ENDPOINTS)


def test_the_engines_module_names_the_same_endpoints_as_the_catalog():
    assert ALL_ENDPOINTS == OPENAI_ENDPOINTS


@pytest.mark.parametrize("engine, command, served", [
    ("llama_cpp_python", "{python} -m llama_cpp.server --model {weights_path} --port {port}", TEXT),
    ("llama_cpp_python", "{python} -m llama_cpp.server --port {port} --embedding True", ALL),
    ("llama_cpp_python", "{python} -m llama_cpp.server --port {port} --embedding true", ALL),
    ("llama_cpp_python", "{python} -m llama_cpp.server --port {port} --embedding=True", ALL),
    ("llama_cpp_python", "{python} -m llama_cpp.server --port {port} --embedding False", TEXT),
    ("llama_server", "llama-server -m {weights_path} --port {port}", TEXT),
    ("llama_server", "llama-server -m {weights_path} --port {port} --embedding", ALL),
    ("llama_server", "llama-server -m {weights_path} --embeddings --port {port}", ALL),
    ("vllm", "vllm serve {weights_path} --port {port}", TEXT),
    ("vllm", "vllm serve {weights_path} --port {port} --task embed", ALL),
    ("vllm", "vllm serve {weights_path} --port {port} --task=embed", ALL),
    ("vllm", "vllm serve {weights_path} --port {port} --task generate", TEXT),
    ("vllm", "vllm serve {weights_path} --port {port} --runner pooling", ALL),
    ("sglang", "{python} -m sglang.launch_server --port {port}", TEXT),
    ("sglang", "{python} -m sglang.launch_server --port {port} --is-embedding", ALL),
    ("custom", "{python} tests/fake_engine.py --port {port}", ALL),
])
def test_an_engine_serves_embeddings_only_when_its_command_starts_it_for_them(engine, command, served):
    assert engine_traits(engine, command).endpoints == served


@pytest.mark.parametrize("engine, command, tokens", [
    ("llama_cpp_python", "x --n_ctx 2048 --port {port}", 2048),
    ("llama_cpp_python", "x --n_ctx=4096 --port {port}", 4096),
    ("llama_cpp_python", "x --n_ctx {ctx} --port {port}", None),
    ("llama_cpp_python", "x --port {port}", None),
    ("llama_server", "llama-server -c 8192 --port {port}", 8192),
    ("llama_server", "llama-server --ctx-size 16384 --port {port}", 16384),
    ("llama_server", "llama-server --ctx-size=1024 --port {port}", 1024),
    ("vllm", "vllm serve m --max-model-len 32768", 32768),
    ("vllm", "vllm serve m --max_model_len=2000", 2000),
    ("vllm", "vllm serve m --max-model-len 1000 --max-model-len 3000", 3000),  # the last one wins
    ("vllm", "vllm serve m --max-model-len", None),
    ("vllm", "vllm serve m --max-model-len 0", None),
    ("vllm", "vllm serve m --max-model-len 32k", None),
    ("sglang", "python -m sglang.launch_server --context-length 65536", 65536),
    ("sglang", "python -m sglang.launch_server --context-length={n}", None),
    ("custom", "anything --n_ctx 2048 --max-model-len 4096", None),
    ("llama_server", "llama-server --n_ctx 2048", None),  # another engine's flag
])
def test_the_context_length_comes_from_the_engines_own_flag_when_literal(engine, command, tokens):
    assert context_length_from_command(engine, command) == tokens
    assert engine_traits(engine, command).context_length == tokens


@pytest.mark.parametrize("engine, serves_n, cancels, usage, path, body", [
    ("llama_cpp_python", False, False, False, "/extras/tokenize", {"input": "hi"}),
    ("llama_server", False, True, True, "/tokenize", {"content": "hi"}),
    ("vllm", True, True, True, "/tokenize", {"prompt": "hi"}),
    ("sglang", True, True, True, None, None),
    ("custom", True, True, True, None, None),
])
def test_each_engine_says_what_it_does_itself(engine, serves_n, cancels, usage, path, body):
    traits = engine_traits(engine, "cmd --port {port}")
    assert (traits.serves_n, traits.cancels_unstreamed, traits.streams_usage, traits.tokenize_path) == (
        serves_n, cancels, usage, path)
    if body is None:
        with pytest.raises(ValueError):
            traits.tokenize_body("hi")
    else:
        assert traits.tokenize_body("hi") == body


def test_an_unknown_engine_kind_is_treated_as_a_custom_one():
    traits = engine_traits("tgi", "text-generation-launcher --max-total-tokens 4096")
    assert traits.endpoints == ALL and traits.context_length is None and traits.serves_n


def test_an_external_service_is_treated_as_openai_itself():
    assert (OPENAI_LIKE.serves_n, OPENAI_LIKE.cancels_unstreamed, OPENAI_LIKE.streams_usage) == (True, True, True)
    assert OPENAI_LIKE.tokenize_path is None and OPENAI_LIKE.endpoints == ALL


def test_a_template_with_unbalanced_quotes_is_still_read_word_by_word():
    assert context_length_from_command("llama_server", "llama-server -c 512 --alias 'x") == 512


def test_the_presets_traits():
    cpu = PRESETS["llama-cpp-python-cpu"]
    assert engine_traits(cpu["engine"], cpu["command"]).context_length == 2048
    assert engine_traits(cpu["engine"], cpu["command"]).endpoints == TEXT
    for name in ("llama-server-gpu", "vllm", "sglang"):
        assert engine_traits(PRESETS[name]["engine"], PRESETS[name]["command"]).context_length is None, name


@pytest.mark.parametrize("engine, token_prompts", [
    ("llama_cpp_python", False), ("llama_server", True), ("vllm", True), ("sglang", True), ("custom", True),
])
def test_only_llama_cpp_python_refuses_a_prompt_of_token_ids(engine, token_prompts):
    assert engine_traits(engine, "cmd --port {port}").serves_token_prompts is token_prompts
    assert OPENAI_LIKE.serves_token_prompts


@pytest.mark.parametrize("command, drops", [
    ("python -m llama_cpp.server --chat_format gemma --port {port}", True),
    ("python -m llama_cpp.server --chat_format=gemma --port {port}", True),
    ("python -m llama_cpp.server --chat_format chatml --port {port}", False),
    ("python -m llama_cpp.server --port {port}", False),
])
def test_llama_cpp_pythons_gemma_chat_format_is_known_to_drop_system_messages(command, drops):
    assert engine_traits("llama_cpp_python", command).drops_system_messages is drops
    assert engine_traits("vllm", command).drops_system_messages is False
