"""``--workers`` of ``llmgw up`` and ``llmgw web``: how many web processes, refused without
Redis, documented in ``--help``; several processes' ``/metrics`` summed (multiprocess mode, in
child processes: prometheus_client reads its directory at import)."""

from __future__ import annotations

import io
import os
import subprocess
import textwrap

import pytest

from llmgw.cli import web_processes
from llmgw.cli.web_processes import web_argv
import socket

from tests.processes import PYTHON, ROOT, free_port


def test_auto_is_one_process_without_redis_and_one_per_core_with_it(settings, monkeypatch):
    monkeypatch.setattr(web_processes, "cores", lambda: 6)
    settings.REDIS_URL = ""
    assert web_processes.resolve_workers("auto") == (1, "")
    assert web_processes.resolve_workers(None) == (1, "")
    assert web_processes.resolve_workers("1") == (1, "")
    settings.REDIS_URL = "redis://127.0.0.1:6379/15"
    assert web_processes.resolve_workers("auto") == (6, "")
    assert web_processes.resolve_workers("3") == (3, "")


def test_several_processes_without_redis_are_refused_with_the_reason(settings):
    settings.REDIS_URL = ""
    workers, why = web_processes.resolve_workers("2")
    assert workers == 0
    assert "LLMGW_REDIS_URL" in why and "2 times too loose" in why and "--workers 1" in why and "\n" not in why
    assert web_processes.resolve_workers("0")[0] == 0
    assert web_processes.resolve_workers("many")[0] == 0


def test_llmgw_web_and_up_refuse_two_workers_without_redis_and_start_nothing(settings, monkeypatch, tmp_path):
    from llmgw.cli import up, web

    settings.REDIS_URL = ""
    settings.DATA_DIR = tmp_path
    execs = []
    monkeypatch.setattr(web.os, "execve", lambda *a: execs.append(a))
    err = io.StringIO()
    assert web.run({"host": "127.0.0.1", "port": 8000, "workers": "2"}, io.StringIO(), err) == 2
    assert err.getvalue().startswith("llmgw web: --workers 2 needs LLMGW_REDIS_URL") and execs == []
    err = io.StringIO()
    assert up.run({"host": "127.0.0.1", "port": 8000, "workers": "2"}, io.StringIO(), err) == 2
    assert err.getvalue().startswith("llmgw up: --workers 2 needs LLMGW_REDIS_URL")
    assert not (tmp_path / "up.lock").exists()  # nothing was started, not even the data directory's lock


def test_llmgw_web_with_redis_runs_uvicorn_workers_with_a_fresh_metrics_directory(settings, monkeypatch, tmp_path):
    from llmgw.cli import web

    settings.REDIS_URL = "redis://127.0.0.1:6379/15"
    settings.DATA_DIR = tmp_path
    port = free_port()
    stale = web_processes.metrics_dir(port)
    stale.mkdir()
    (stale / "counter_1.db").write_bytes(b"from an earlier run")
    execs = []
    monkeypatch.setattr(web.os, "execve", lambda *a: execs.append(a))
    assert web.run({"host": "127.0.0.1", "port": port, "workers": "2"}, io.StringIO(), io.StringIO()) == 1
    (_, argv, env), = execs
    assert argv[argv.index("--workers") + 1] == "2"
    assert env["PROMETHEUS_MULTIPROC_DIR"] == str(stale) and list(stale.iterdir()) == []
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ  # only the web processes' environment


def test_llmgw_web_on_a_port_in_use_says_so_and_leaves_the_running_processes_metrics(settings, monkeypatch,
                                                                                       tmp_path):
    """A second `llmgw web` on the port of a running one (several processes, their samples in
    the metrics directory) must not empty that directory: it stops before, exit 1."""
    from llmgw.cli import web

    settings.REDIS_URL = "redis://127.0.0.1:6379/15"
    settings.DATA_DIR = tmp_path
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        running = web_processes.metrics_dir(port)
        running.mkdir()
        (running / "counter_123.db").write_bytes(b"the running processes' samples")
        execs = []
        monkeypatch.setattr(web.os, "execve", lambda *a: execs.append(a))
        err = io.StringIO()
        assert web.run({"host": "127.0.0.1", "port": port, "workers": "2"}, io.StringIO(), err) == 1
    assert err.getvalue() == (f"llmgw web: 127.0.0.1:{port} is already in use (another llmgw web or up?); "
                              "choose another with --port\n")
    assert execs == [] and (running / "counter_123.db").read_bytes() == b"the running processes' samples"


def test_workers_past_eight_per_core_are_refused_with_the_reason(settings, monkeypatch):
    monkeypatch.setattr(web_processes, "cores", lambda: 2)
    settings.REDIS_URL = "redis://127.0.0.1:6379/15"
    assert web_processes.resolve_workers("16") == (16, "")
    workers, why = web_processes.resolve_workers("17")
    assert workers == 0 and "at most 16 on this machine (8 per core, 2 cores)" in why and "\n" not in why
    assert web_processes.resolve_workers("100000")[0] == 0


def test_one_worker_is_said_to_uvicorn_and_keeps_metrics_in_memory():
    argv = web_argv("127.0.0.1", 8000)
    assert argv[argv.index("--workers") + 1] == "1"  # never uvicorn's WEB_CONCURRENCY
    env = web_processes.prepare_metrics_env({"PROMETHEUS_MULTIPROC_DIR": "/x"}, 1, 8000)
    assert "PROMETHEUS_MULTIPROC_DIR" not in env


@pytest.mark.parametrize("command", ["up", "web"])
def test_help_documents_workers(command):
    done = subprocess.run([PYTHON, "manage.py", "llmgw", command, "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "--workers N|auto" in done.stdout and "LLMGW_WEB_WORKERS" in done.stdout
    assert "LLMGW_REDIS_URL" in done.stdout


# Two "processes" writing into one multiprocess directory, then a scrape from a third: the
# counters, the live processes' gauges and the token counts are summed; a process gone
# leaves its counters in the sums and takes its gauges out.
_WRITER = textwrap.dedent("""
    import os, sys
    os.environ["DJANGO_SETTINGS_MODULE"] = "llmgw.settings"
    import django; django.setup()
    from gateway import metrics
    metrics.REQUESTS.labels("m", "200").inc(int(sys.argv[1]))
    metrics.IN_FLIGHT.labels("m").inc(int(sys.argv[1]))
    metrics.TOKENS.add("m", None, None, 10, int(sys.argv[1]))
    print(os.getpid())
""")
_READER = textwrap.dedent("""
    import os
    os.environ["DJANGO_SETTINGS_MODULE"] = "llmgw.settings"
    import django; django.setup()
    import gateway.metrics
    from llmgw.metrics import render
    print(render().decode())
""")


def test_metrics_of_several_processes_are_summed(tmp_path):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "LLMGW_DATA_DIR": str(tmp_path / "data")}
    (tmp_path / "data").mkdir()

    def run(code: str, *args: str) -> str:
        done = subprocess.run([PYTHON, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    for count in ("2", "3"):
        run(_WRITER, count)
    text = run(_READER)
    assert 'llmgw_requests_total{model="m",status="200"} 5.0' in text
    # The writers have exited: their in-flight gauges are gone from the sum, their counters stay.
    assert 'llmgw_requests_in_flight{model="m"}' not in text
    assert 'llmgw_tokens_total{kind="completion",model="m",team="none"} 5.0' in text
    assert 'llmgw_tokens_total{kind="prompt",model="m",team="none"} 20.0' in text
    assert 'llmgw_key_tokens_total{key="anonymous",key_prefix="",kind="completion"} 5.0' in text
    assert "llmgw_internal" not in text
    assert "llmgw_metrics_database_up" in text
