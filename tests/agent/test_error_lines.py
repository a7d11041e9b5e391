"""Which line of an engine's log a failed replica's error is summed up by
(``fleet.protocol.trouble_line``, ``error_summary``) and what of the log the agent keeps
(``error_excerpt``): the meaningful line — the port taken, the exception, an error-level
line — never merely the log's last line. Log tails in tests/fixtures/engine_logs/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.protocol import ERROR_EXCERPT_MAX, error_excerpt, error_summary, trouble_line

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "engine_logs"
EXPECTED = json.loads((LOGS / "expected.json").read_text())


def error_for(log: str, why: str = "engine exited with code 1 while starting") -> str:
    """An error as ``EngineManager._fail`` writes it."""
    return f"{why}\n--- last log lines ---\n{error_excerpt(log)}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_summary_is_the_line_that_says_what_went_wrong(name):
    log = (LOGS / name).read_text()
    assert log.strip().splitlines()[-1] not in EXPECTED[name]  # not merely the last line
    assert error_summary(error_for(log)) == f"engine exited with code 1 while starting: {EXPECTED[name]}"


def test_a_traceback_gives_its_exception_line_without_the_log_prefix():
    lines = ["ERROR 12-04 18:02:11 [core.py:700] Traceback (most recent call last):",
             'ERROR 12-04 18:02:11 [core.py:700]   File "x.py", line 3, in f',
             "ERROR 12-04 18:02:11 [core.py:700]     raise ValueError(\"bad\")",
             "ERROR 12-04 18:02:11 [core.py:700] ValueError: max_model_len 32768 is larger than the KV cache",
             "INFO 12-04 18:02:12 [launcher.py:80] Shutting down FastAPI HTTP server."]
    assert trouble_line(lines) == (3, "ValueError: max_model_len 32768 is larger than the KV cache")


def test_address_already_in_use_wins_over_the_exception_it_caused():
    lines = ["Traceback (most recent call last):", '  File "s.py", line 1, in <module>',
             "OSError: [Errno 98] Address already in use", "ERROR: could not start", "RuntimeError: server died"]
    assert trouble_line(lines) == (2, "OSError: [Errno 98] Address already in use")


def test_code_lines_access_logs_and_announcements_are_never_picked():
    assert trouble_line(["    except OSError:", "    raise ValueError(msg)", "loading weights"]) is None
    assert trouble_line(['INFO: 127.0.0.1:1 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error']) is None
    assert trouble_line(["ERROR:    Exception in ASGI application", "ERROR:    Application startup failed. Exiting."
                         ]) is None
    assert trouble_line(["ready", "KeyboardInterrupt", "SystemExit: 1"]) is None
    # Without any of those, a line with a word of trouble still says more than nothing.
    assert trouble_line(["loading", "weights file not found: /x.gguf", "bye"]) == (1, "weights file not found: /x.gguf")


def test_a_picked_line_is_cut_to_one_readable_line():
    index, line = trouble_line(["RuntimeError: " + "x" * 1000])
    assert index == 0 and len(line) == 240 and line.endswith("…")


def test_the_excerpt_keeps_the_cause_ahead_of_a_long_shutdown():
    log = "\n".join(["loading"] * 5 + ["RuntimeError: CUDA out of memory"] + [f"shutdown step {n}" for n in range(30)])
    excerpt = error_excerpt(log, lines=15).splitlines()
    assert excerpt[:2] == ["RuntimeError: CUDA out of memory", "…"]
    assert excerpt[2:] == [f"shutdown step {n}" for n in range(15, 30)]
    assert error_summary(error_for(log)) == "engine exited with code 1 while starting: RuntimeError: CUDA out of memory"
    # Within the last lines already: not repeated.
    assert error_excerpt("a\nValueError: no\nb", lines=15) == "a\nValueError: no\nb"


def test_the_excerpt_masks_the_key_before_cutting_and_stays_within_its_size():
    key = "sk-engine-" + "k" * 40
    log = "\n".join([f"ValueError: bad key {key}" + "y" * 300] + ["z" * 600 for _ in range(20)])
    excerpt = error_excerpt(log, lines=15, secret=key)
    assert key[:12] not in excerpt and "ValueError: bad key ***" in excerpt
    assert len(excerpt) <= ERROR_EXCERPT_MAX and excerpt.splitlines()[1] == "…"
    assert all(len(line) <= 500 for line in excerpt.splitlines())


def test_a_numa_bind_warning_is_not_a_port_taken_and_the_oom_wins():
    """"failed to bind memory to node 1" is NUMA placement, not a socket (the adversary's log)."""
    lines = ["INFO numa: failed to bind memory to node 1, continuing",
             "Traceback (most recent call last):", '  File "w.py", line 9, in load',
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
             "INFO shutting down"]
    assert trouble_line(lines) == (3, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    # The socket kinds still win over anything.
    for taken in ("couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 20001",
                  "failed to bind to port 20001", "error: failed to bind 0.0.0.0:20001"):
        assert trouble_line([taken, "RuntimeError: server died"]) == (0, taken), taken


def test_a_death_by_signal_beats_an_info_line_that_mentions_an_error_word():
    lines = ["INFO Setting error_on_nan=False", "INFO loading weights 100%", "Segmentation fault (core dumped)"]
    assert trouble_line(lines) == (2, "Segmentation fault (core dumped)")
    # A word of trouble must be a word: "error_on_nan" is not "error".
    assert trouble_line(["INFO Setting error_on_nan=False", "bye"]) is None


def test_pydantics_summary_gets_the_field_and_the_reason_after_it():
    lines = ["Traceback (most recent call last):", '  File "a.py", line 2, in <module>',
             "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
             "max_model_len", "  Value error, max_model_len 65536 exceeds the model's 32768 [type=value_error]",
             "INFO bye"]
    index, line = trouble_line(lines)
    assert index == 2
    assert line.startswith("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig — "
                           "max_model_len — Value error, max_model_len 65536 exceeds")
