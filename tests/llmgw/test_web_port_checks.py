"""``llmgw web`` / ``llmgw up``: the port check that guards the Prometheus multiprocess
directory, tried with addresses and ports the check does not expect."""

from __future__ import annotations

import io
import socket

import pytest

from llmgw.cli import web_processes


def test_a_second_web_on_another_address_of_the_same_port_leaves_the_running_ones_metrics(settings, monkeypatch,
                                                                                       tmp_path):
    """A multi-process `llmgw web` listens on 127.0.0.1:P. Another one on 127.0.0.2:P (or
    ::1:P, or a second interface) could listen too — a different address — but the metrics
    directory is keyed by the port alone: it was emptied under the running processes, and
    both servers then wrote into (and summed) one directory. Several processes now refuse a
    port that any address of the machine listens on."""
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
        web.run({"host": "127.0.0.2", "port": port, "workers": "2"}, io.StringIO(), io.StringIO())
    assert (running / "counter_123.db").exists(), "the running server's metrics directory was emptied"
    for _, _, env in execs:
        assert env["PROMETHEUS_MULTIPROC_DIR"] != str(running), "two servers share one metrics directory"


@pytest.mark.parametrize("port", [70000, -1])
def test_llmgw_web_refuses_a_port_out_of_range_with_a_line_not_a_traceback(settings, monkeypatch, tmp_path, port):
    from llmgw.cli import web

    settings.DATA_DIR = tmp_path
    monkeypatch.setattr(web.os, "execve", lambda *a: None)
    err = io.StringIO()
    assert web.run({"host": "127.0.0.1", "port": port, "workers": "1"}, io.StringIO(), err) in (1, 2)
    assert str(port) in err.getvalue()


def test_llmgw_up_refuses_a_port_out_of_range_with_a_line_not_a_traceback(settings, tmp_path):
    from llmgw.cli import up

    settings.DATA_DIR = tmp_path
    err = io.StringIO()
    assert up.run({"host": "127.0.0.1", "port": 70000, "workers": "1", "no_demo": True}, io.StringIO(), err) in (1, 2)
    assert "70000" in err.getvalue()
