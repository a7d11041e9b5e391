"""The web process's log lines are written by a thread (``llmgw.logqueue``), so a reader that
falls behind (``llmgw up``'s pipe, a slow terminal) never blocks the event loop; lines wait in
the queue instead. A SIGTERM (what systemd and ``llmgw up`` send) must not lose them: uvicorn
re-raises the signal once it is down, so no ``atexit`` hook runs — the lifespan's shutdown
writes the queue out."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx

from llmgw.cli.web_processes import web_argv
from tests.processes import ROOT, free_port, wait_for_port

REQUESTS = 1500  # about 120 KB of access lines: more than a pipe holds (64 KiB) while no one reads it


def test_lines_queued_behind_a_full_pipe_are_all_written_when_the_web_process_is_terminated(django_db_setup):
    port = free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "llmgw.settings", "LLMGW_LOG_WRITER_THREAD": "true",
           "PYTHONUNBUFFERED": "1"}
    web = subprocess.Popen(web_argv("127.0.0.1", port, access_log=True), cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, proc=web)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for _ in range(REQUESTS):  # answered at once, though the log's reader is not reading
                assert client.get("/healthz").status_code == 200
        web.send_signal(signal.SIGTERM)
        time.sleep(7.0)  # the reader still behind while the process shuts down, longer than uvicorn waits for anything
        text = web.stdout.read().decode(errors="replace")  # it catches up only now
        web.wait(60)
    finally:
        if web.poll() is None:
            web.kill()
            web.wait()
        web.stdout.close()
    assert text.count('"GET /healthz HTTP/1.1" 200') == REQUESTS, text[-2000:]
    for line in ("Waiting for application shutdown.", "Application shutdown complete.", "Finished server process"):
        assert line in text, text[-2000:]
