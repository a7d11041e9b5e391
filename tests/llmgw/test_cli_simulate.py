"""``llmgw simulate`` as an operator meets it: ``--help`` says what the simulator does not
model, and a bad trace (or catalog, or path) is one line naming the file, the line and what
is wrong, exit 2, without Python's own words."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from tests.cli import llmgw

pytestmark = pytest.mark.django_db

GOOD = '{"t_s": 0, "model": "chat", "prompt_tokens": 10, "output_tokens": 5}\n'


@pytest.fixture
def catalog(tmp_path):
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps([{"name": "chat", "min": 1, "max": 1}]))
    return path


def _simulate(trace, catalog, *more: str) -> tuple[int, str, str]:
    return llmgw("simulate", "--trace", str(trace), "--catalog", str(catalog), "--fleet", "1x1xH100-80G",
                 "--no-plot", *more)


def test_help_states_what_the_simulator_does_not_model(capsys):
    with pytest.raises(SystemExit):
        call_command("llmgw", "simulate", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "An estimate, not a measurement: see its limits below" in text
    assert "what it does not model" in text
    for limit in ("no batching slowdown", "engines never crash or fail to start", "agents never go silent",
                  "no API keys, team limits, budgets or admission-queue priorities",
                  "no fragmentation within a GPU", "cold starts take exactly cold_start_s"):
        assert limit in text, limit


@pytest.mark.parametrize(("row", "line", "problem"), [
    ('{"t_s": 1, "model": "chat", "prompt_tokens": "ten", "output_tokens": 5}',
     "t.jsonl:3: request 2", "prompt_tokens must be a whole number, not 'ten'"),
    ('{"t_s": 1, "model": "chat", "output_tokens": 5}',
     "t.jsonl:3: request 2", "prompt_tokens is missing (a request needs t_s, model, prompt_tokens, output_tokens)"),
    ('{"t_s": 1, "model": "chat", "prompt_tokens": 1.5, "output_tokens": 5}',
     "t.jsonl:3: request 2", "prompt_tokens must be a whole number, not 1.5"),
    ('{"t_s": true, "model": "chat", "prompt_tokens": 1, "output_tokens": 5}',
     "t.jsonl:3: request 2", "t_s must be a number of seconds, not True"),
    ('{"t_s": 1, "model": ["chat"], "prompt_tokens": 1, "output_tokens": 5}',
     "t.jsonl:3: request 2", "model must be a string (a catalog name), not ['chat']"),
    ('{"t_s": 1, "model": "chat", "prompt_tokens": 1e400, "output_tokens": 5}',
     "t.jsonl:3: request 2", "prompt_tokens must be a whole number, not inf"),
    ('{"t_s": 1, "model": "chat", "prompt_tokens": 1, "output_tokens": 5',
     "t.jsonl:3", "not JSON"),
])
def test_a_bad_trace_line_is_one_line_with_its_number_and_exit_2(tmp_path, catalog, row, line, problem):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"trace": 1, "start": "2026-11-30T00:00:00+00:00"}\n' + GOOD + row + "\n")
    code, out, err = _simulate(trace, catalog)
    assert code == 2 and out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"{tmp_path}/{line}: ") and problem in err, err
    assert "Error(" not in err and "Traceback" not in err


def test_a_bad_csv_row_and_a_bad_usage_record_name_their_lines(tmp_path, catalog):
    trace = tmp_path / "t.csv"
    trace.write_text("# start=2026-11-30T00:00:00+00:00\nt_s,model,prompt_tokens,output_tokens\n0,chat,1,1\n"
                     "soon,chat,1,1\n")
    code, _, err = _simulate(trace, catalog)
    assert code == 2 and err == f"{trace}:4: request 2: t_s must be a number of seconds, not 'soon'\n"
    usage = tmp_path / "u.csv"
    usage.write_text("at,model,prompt_tokens,completion_tokens,total_ms\n2026-11-30T00:00:00Z,chat,1,1,5\n"
                     "2026-11-30T00:00:01Z,chat,1,1,inf\n")
    code, _, err = _simulate(usage, catalog)
    assert code == 2 and err == f"{usage}:3: record 2: total_ms must be a finite number of milliseconds, not 'inf'\n"


def test_a_missing_file_and_a_broken_yaml_catalog_are_one_line(tmp_path, catalog):
    trace = tmp_path / "t.jsonl"
    code, _, err = _simulate(trace, catalog)
    assert code == 2 and err == f"{trace}: no such file or directory\n"
    trace.write_text(GOOD)
    broken = tmp_path / "catalog.yaml"
    broken.write_text("models: [\n")
    code, _, err = _simulate(trace, broken)
    assert code == 2 and err.startswith(f"{broken}:2: not YAML: ") and err.count("\n") == 1, err


def test_a_good_trace_still_simulates(tmp_path, catalog):
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD + '{"t_s": 2.5, "model": "chat", "prompt_tokens": 12.0, "output_tokens": 5}\n')
    code, out, err = _simulate(trace, catalog, "--json")
    assert code == 0, err
    assert json.loads(out)["llmgw"]["totals"]["requests"] == 2


def test_a_fleet_without_gpus_is_compared_in_cpu_replica_hours_not_gpu_hours(tmp_path):
    catalog = tmp_path / "cpu-catalog.json"
    catalog.write_text(json.dumps([{"name": "chat", "min": 0, "max": 1, "on_demand": True, "gpus_needed": 0,
                                    "gpu_memory_mib": 0, "cpu_cores": 2, "memory_mib": 1024}]))
    trace = tmp_path / "trace.jsonl"
    trace.write_text(GOOD + GOOD.replace('"t_s": 0', '"t_s": 7200'))
    code, out, err = llmgw("simulate", "--trace", str(trace), "--catalog", str(catalog), "--fleet", "1xcpu16-64G",
                           "--no-plot")
    assert code == 0, err
    text = " ".join(out.split())
    assert "GPU-hours (0 vs 0)" not in text and "(0 GPUs)" not in text
    assert "fewer CPU replica-hours (" in text and "the fleet has no GPUs: GPU-hours do not apply" in text
    assert "static (CPUs, no GPUs)" in text and "CPU replica-hours (no GPUs)" in text
    data = json.loads(llmgw("simulate", "--trace", str(trace), "--catalog", str(catalog), "--fleet", "1xcpu16-64G",
                            "--no-plot", "--json")[1])
    comparison = data["comparison"]
    assert comparison["unit"] == "CPU replica-hours" and comparison["gpu_hours_saved"] is None
    assert comparison["cost"] < comparison["baseline_cost"]  # on demand: idle between the two requests
