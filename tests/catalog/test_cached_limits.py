"""The gateway's cached catalog (``gateway.cache.load_models``) carries what the catalog's
``Model`` says of limits, endpoints and engine traits, model by model, in a bounded number
of queries."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.models import Model, Profile
from gateway import cache

pytestmark = pytest.mark.django_db

SAME = ("served_endpoints", "engine_traits",
        "max_output_tokens", "context_limit", "is_external", "default_max_tokens")


def make_profile(name, engine, command, **kw):
    p = Profile(name=name, engine=engine, command=command, cpu_cores=1, **kw)
    p.full_clean()
    p.save()
    return p


@pytest.fixture
def catalog_rows():
    llama = make_profile("llama", "llama_cpp_python", "{python} -m llama_cpp.server --port {port} --n_ctx 2048")
    embed = make_profile("llama-embed", "llama_server", "llama-server -m {weights_path} --port {port} --embedding")
    vllm = make_profile("vllm", "vllm", "vllm serve {weights_path} --port {port} --max-model-len=8192",
                        endpoints="chat/completions")
    custom = make_profile("custom", "custom", "{python} engine.py --port {port}")
    rows = [
        Model(name="small", weights="file:/dev/null", profile=llama, weights_context_length=32768),
        Model(name="short", weights="file:/dev/null", profile=llama, weights_context_length=1024,
              max_output_tokens=512, aliases="tiny"),
        Model(name="embedder", weights="file:/dev/null", profile=embed, endpoints="embeddings"),
        Model(name="big", weights="file:/dev/null", profile=vllm, context_length=4096),
        Model(name="own", weights="file:/dev/null", profile=custom, weights_context_length=16384),
        Model(name="gpt", external_base_url="https://api.example.com/v1", context_length=128000,
              max_output_tokens=16384),
    ]
    for m in rows:
        m.full_clean()
        m.save()
    return rows


def test_a_cached_model_says_what_its_catalog_model_says(catalog_rows):
    cached = {entry.name: entry for entry, _ in cache.load_models()}
    for m in Model.objects.select_related("profile"):
        for name in SAME:
            assert getattr(cached[m.name], name) == getattr(m, name), (m.name, name)
        assert cached[m.name].token_limits() == m.token_limits(), m.name


def test_the_cached_limits_and_endpoints_follow_the_precedence(catalog_rows):
    cached = {entry.name: entry for entry, _ in cache.load_models()}
    assert cached["small"].token_limits() == (2048, None)
    assert cached["short"].token_limits() == (1024, 512)
    assert cached["big"].token_limits() == (4096, None)
    assert cached["own"].token_limits() == (16384, None)
    assert cached["gpt"].token_limits() == (128000, 16384)
    assert cached["small"].served_endpoints == {"chat/completions", "completions"}
    assert cached["embedder"].served_endpoints == {"embeddings"}
    assert cached["big"].served_endpoints == {"chat/completions"}
    assert cached["gpt"].served_endpoints == {"chat/completions", "completions", "embeddings"}
    small, gpt = cached["small"].engine_traits, cached["gpt"].engine_traits
    assert (small.serves_n, small.tokenize_path) == (False, "/extras/tokenize")
    assert (gpt.serves_n, gpt.streams_usage, gpt.tokenize_path) == (True, True, None)


def test_loading_the_cache_takes_the_same_few_queries_however_many_models(catalog_rows):
    with CaptureQueriesContext(connection) as few:
        cache.load()
    for i in range(10):
        Model.objects.create(name=f"more-{i}", weights="file:/dev/null", profile=Profile.objects.get(name="vllm"))
    with CaptureQueriesContext(connection) as many:
        loaded = cache.load()
    # Key limits, profiles, models, teams, model budgets, keys, the admission settings.
    assert len(few) == len(many) == 7
    assert loaded[cache._MODELS]["tiny"].name == "short"
