"""Safe defaults of the settings (issue 12): a private data directory, loopback-only host
names unless told otherwise, secure cookies behind TLS, a /metrics token kept in the data
directory. Each is checked in a fresh process with a fresh ``LLMGW_DATA_DIR``, started with
a permissive umask (022), as an operator's shell would."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from tests.processes import PYTHON, ROOT

SHOW = ("import json, os, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps({'hosts': s.ALLOWED_HOSTS, 'session_secure': s.SESSION_COOKIE_SECURE, "
        "'csrf_secure': s.CSRF_COOKIE_SECURE, 'proxy_header': s.SECURE_PROXY_SSL_HEADER, "
        "'metrics_token': s.LLMGW_METRICS_TOKEN}))")


def run_fresh(data_dir, *argv, extra_env=None, python=False) -> subprocess.CompletedProcess:
    """``manage.py ARGV`` (or ``python -c ARGV[0]``) on the embedded default in ``data_dir``."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "llmgw.settings", "LLMGW_DATA_DIR": str(data_dir),
           "LLMGW_SQLITE_PATH": "", "LLMGW_DATABASE_URL": "", "LLMGW_REDIS_URL": "", "LLMGW_ALLOWED_HOSTS": "",
           "LLMGW_BEHIND_TLS": "", "LLMGW_METRICS_TOKEN": "", "LLMGW_METRICS_PUBLIC": "", "LLMGW_SECRET_KEY": "",
           **(extra_env or {})}
    command = [PYTHON, "-c", argv[0]] if python else [PYTHON, "manage.py", *argv]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
                          preexec_fn=lambda: os.umask(0o022))
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_new_data_directory_is_0700_and_every_file_llmgw_writes_in_it_0600(tmp_path):
    data = tmp_path / "new" / "data"
    run_fresh(data, "migrate", "-v0")
    # A process that writes with its connection open: the WAL and shared-memory files exist.
    listing = run_fresh(data, "from django.db import connection; import django, json, os; "
                              "django.setup(); from fleet.models import Agent; Agent.objects.create(name='x'); "
                              "d = os.environ['LLMGW_DATA_DIR']; "
                              "print(json.dumps({n: os.stat(os.path.join(d, n)).st_mode & 0o777 "
                              "for n in os.listdir(d)}))", python=True)
    modes = json.loads(listing.stdout.strip().splitlines()[-1])
    assert mode(data) == 0o700
    assert {"secret_key", "llmgw.sqlite3", "llmgw.sqlite3-wal", "llmgw.sqlite3-shm"} <= set(modes)
    assert {name: m for name, m in modes.items() if m & 0o077} == {}, oct_all(modes)
    assert mode(data / "secret_key") == 0o600 and mode(data / "llmgw.sqlite3") == 0o600


def oct_all(modes: dict) -> dict:
    return {name: oct(m) for name, m in modes.items()}


def test_an_existing_loose_data_directory_is_tightened_with_a_log_line(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    (data / "secret_key").write_text("k" * 50)
    (data / "secret_key").chmod(0o644)
    (data / "admin_password").write_text("pw")
    (data / "admin_password").chmod(0o664)
    done = run_fresh(data, "check")
    assert mode(data) == 0o700 and mode(data / "secret_key") == 0o600 and mode(data / "admin_password") == 0o600
    assert "tightened" in done.stderr and "0755 -> 0700" in done.stderr and "0644 -> 0600" in done.stderr
    again = run_fresh(data, "check")  # nothing left to say the second time
    assert "tightened" not in again.stderr


def test_allowed_hosts_are_the_loopback_names_unless_set(tmp_path):
    shown = json.loads(run_fresh(tmp_path, SHOW, python=True).stdout.strip().splitlines()[-1])
    assert shown["hosts"] == ["localhost", "127.0.0.1", "[::1]"]
    shown = json.loads(run_fresh(tmp_path, SHOW, python=True,
                                 extra_env={"LLMGW_ALLOWED_HOSTS": "cp.example.com, 10.0.0.2"}).stdout.splitlines()[-1])
    assert shown["hosts"] == ["localhost", "127.0.0.1", "[::1]", "cp.example.com", "10.0.0.2"]


@pytest.mark.django_db
def test_a_request_for_another_host_name_is_refused(client):
    """DNS rebinding / Host header poisoning: a name this server was not told it has."""
    answer = client.get("/admin/login/", HTTP_HOST="attacker.example")
    assert answer.status_code == 400
    assert client.get("/admin/login/", HTTP_HOST="127.0.0.1:8000").status_code == 200


def test_behind_tls_turns_on_secure_cookies_and_the_forwarded_proto_header(tmp_path):
    plain = json.loads(run_fresh(tmp_path, SHOW, python=True).stdout.splitlines()[-1])
    assert (plain["session_secure"], plain["csrf_secure"], plain["proxy_header"]) == (False, False, None)
    tls = json.loads(run_fresh(tmp_path, SHOW, python=True, extra_env={"LLMGW_BEHIND_TLS": "1"}).stdout.splitlines()[-1])
    assert (tls["session_secure"], tls["csrf_secure"]) == (True, True)
    assert tls["proxy_header"] == ["HTTP_X_FORWARDED_PROTO", "https"]


def test_the_metrics_token_comes_from_the_environment_or_the_data_directory_unless_public(tmp_path):
    assert json.loads(run_fresh(tmp_path, SHOW, python=True).stdout.splitlines()[-1])["metrics_token"] == ""
    (tmp_path / "metrics_token").write_text("generated-token\n")
    shown = json.loads(run_fresh(tmp_path, SHOW, python=True).stdout.splitlines()[-1])
    assert shown["metrics_token"] == "generated-token"
    shown = json.loads(run_fresh(tmp_path, SHOW, python=True, extra_env={"LLMGW_METRICS_PUBLIC": "1"}).stdout.splitlines()[-1])
    assert shown["metrics_token"] == ""
    shown = json.loads(run_fresh(tmp_path, SHOW, python=True, extra_env={"LLMGW_METRICS_TOKEN": "from-env"}).stdout.splitlines()[-1])
    assert shown["metrics_token"] == "from-env"


def test_a_route_grace_shorter_than_two_agent_heartbeats_is_warned_about(settings):
    """With the grace under two heartbeats a healthy agent's replicas would flicker out of
    routing (503 'agent silent' between heartbeats); a system check names it (llmgw.W003)."""
    from llmgw.checks import llmgw_settings

    settings.LLMGW_HEARTBEAT_INTERVAL_S, settings.LLMGW_AGENT_ROUTE_GRACE_S = 5.0, 2.0
    assert "llmgw.W003" in [p.id for p in llmgw_settings(None)]
    settings.LLMGW_AGENT_ROUTE_GRACE_S = 12.0
    assert "llmgw.W003" not in [p.id for p in llmgw_settings(None)]
