"""Traces no honest tool writes (the adversary's files): each is refused by
``read_trace`` with one line naming the file, the line and what is wrong — never Python's
own exception, never hours of simulation or gigabytes of memory — and ``llmgw simulate``
exits 2 with that line."""

from __future__ import annotations

import json

import pytest

from fleet.simulation.traces import MAX_SPAN_S, read_trace
from tests.cli import llmgw

ROW = '{"t_s": 0, "model": "m", "prompt_tokens": 1, "output_tokens": 1}\n'
USAGE = '{{"at": "{at}", "model": "m", "prompt_tokens": 1, "completion_tokens": 1{more}}}\n'


@pytest.mark.parametrize(("name", "text", "where", "words"), [
    ("big.csv", "t_s,model,prompt_tokens,output_tokens\n0,m,1,1\n1," + "x" * 140_000 + ",1,1\n",
     ":3: ", "field larger than field limit"),
    ("deep.jsonl", ROW + "[" * 100_000 + "\n", ":2: ", "nested too deeply"),
    ("hdr.jsonl", '{"start": "not a date"}\n' + ROW, ": header: ", "start must be an ISO 8601 instant"),
    ("hdr2.jsonl", '{"start": 12345678901234567890}\n' + ROW, ": header: ", "between 1970 and 2200"),
    ("far.jsonl", USAGE.format(at="2026-12-01T00:00:00+00:00", more="") + USAGE.format(at="9999-12-31T23:59:59+00:00",
                                                                                     more=""),
     ":2: record 2: ", "at must be an ISO 8601 instant or Unix seconds between 1970 and 2200"),
    ("span.jsonl", USAGE.format(at="2026-12-01T00:00:00+00:00", more="") + USAGE.format(at="2029-12-31T00:00:00+00:00",
                                                                                      more=""),
     ":2: record 2: ", "the records span 1,126 days (from line 1); the simulator replays a year at most"),
    ("slow.jsonl", USAGE.format(at="2026-12-01T00:00:00+00:00", more=', "total_ms": 1e300'),
     ":1: record 1: ", "total_ms (1e+300) must be between 0 and"),
    ("long.jsonl", '{"t_s": 1e12, "model": "m", "prompt_tokens": 1, "output_tokens": 1}\n',
     ":1: request 1: ", f"must be between 0 and {MAX_SPAN_S:,} seconds"),
    ("years.jsonl", '{"t_s": 3e8, "model": "m", "prompt_tokens": 1, "output_tokens": 1}\n',
     ":1: request 1: ", "the simulator replays a year at most"),
])
def test_a_hostile_trace_is_one_line_naming_where_and_what(tmp_path, name, text, where, words):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as refused:
        read_trace(path)
    message = str(refused.value)
    assert message.startswith(f"{path}{where}") and words in message and "\n" not in message, message


@pytest.mark.django_db
def test_simulate_exits_2_with_that_line(tmp_path):
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps([{"name": "m", "min": 1, "max": 1}]))
    trace = tmp_path / "deep.jsonl"
    trace.write_text(ROW + "[" * 100_000 + "\n")
    code, out, err = llmgw("simulate", "--trace", str(trace), "--catalog", str(catalog), "--fleet", "1x1xH100-80G",
                           "--no-plot")
    assert (code, out) == (2, "") and err == f"{trace}:2: not JSON this reader takes: nested too deeply\n"
