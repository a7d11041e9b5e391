"""``llmgw up`` on a cluster an operator stopped: it says so at once (the flag lasts across
restarts) instead of waiting for a model that will not be served, and Ctrl-C stops every
process it started promptly. No engine runs: a stopped cluster places nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.processes import PYTHON, ROOT, Proc, free_port, wait_until


def processes_with(data_dir) -> list[int]:
    """Pids of live processes whose environment names ``data_dir`` (Linux /proc)."""
    needle = f"LLMGW_DATA_DIR={data_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open(f"/proc/{entry}/stat", "rb") as stat:
                        if stat.read().split(b") ", 1)[1][:1] != b"Z":  # not a zombie
                            found.append(int(entry))
        except OSError:
            continue
    return found


def test_up_on_a_stopped_cluster_says_so_at_once_and_stops_promptly(tmp_path):
    # The embedded default in a directory of its own, whatever the pass (empty = unset).
    env = {"DJANGO_SETTINGS_MODULE": "llmgw.settings", "LLMGW_DATA_DIR": str(tmp_path),
           "LLMGW_SQLITE_PATH": str(tmp_path / "llmgw.sqlite3"), "LLMGW_DATABASE_URL": "", "LLMGW_REDIS_URL": ""}
    for argv in (["migrate", "-v0"], ["llmgw", "stop"]):
        done = subprocess.run([PYTHON, "manage.py", *argv], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    port = free_port()
    up = Proc([PYTHON, "manage.py", "llmgw", "up", "--port", str(port)], tmp_path / "up.log", env=env)
    try:
        wait_until(lambda: "llmgw is up" in up.log() or up.proc.poll() is not None, timeout_s=90, interval_s=0.3,
                   what="the banner")
        log = up.log()
        assert up.proc.poll() is None, log[-3000:]
        # `llmgw bench` finds the gateway on this port; forgotten when up stops.
        assert (tmp_path / "web_url").read_text() == f"http://127.0.0.1:{port}\n"
        assert "the cluster is STOPPED (`llmgw stop` by" in log
        assert f"LLMGW_DATA_DIR={tmp_path} " in log and "manage.py llmgw start`" in log  # runnable as shown
        assert "not served: the cluster is STOPPED" in log
        assert len(processes_with(tmp_path)) >= 3  # web, worker (and its workers), agent
        os.killpg(up.proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground group
        started = time.monotonic()
        up.proc.wait(timeout=45)
        assert time.monotonic() - started < 30, up.log()[-3000:]
        # Nothing it started outlives it: qcluster's worker processes once did.
        wait_until(lambda: not processes_with(tmp_path), timeout_s=5, what="every child to be gone")
        assert not (tmp_path / "web_url").exists()
    finally:
        up.stop(timeout_s=60)
        for pid in processes_with(tmp_path):  # whatever a failure left behind
            os.kill(pid, signal.SIGKILL)
    assert "Traceback" not in up.log(), up.log()[-5000:]


def test_up_stops_everything_when_its_terminal_goes_away_or_its_output_pipe_closes(tmp_path):
    """SIGHUP (a closed terminal, a dropped ssh session) and a closed stdout (``up | head``)
    once left web, worker and agent running: they sit in process groups of their own."""
    env = {"DJANGO_SETTINGS_MODULE": "llmgw.settings", "LLMGW_DATA_DIR": str(tmp_path),
           "LLMGW_SQLITE_PATH": str(tmp_path / "llmgw.sqlite3"), "LLMGW_DATABASE_URL": "", "LLMGW_REDIS_URL": ""}
    up = Proc([PYTHON, "manage.py", "llmgw", "up", "--no-demo", "--port", str(free_port())], tmp_path / "up.log",
              env=env)
    try:
        wait_until(lambda: "llmgw is up" in up.log(), timeout_s=90, interval_s=0.3, what="the banner")
        assert len(processes_with(tmp_path)) >= 3
        up.proc.send_signal(signal.SIGHUP)
        up.proc.wait(timeout=45)
        wait_until(lambda: not processes_with(tmp_path), timeout_s=5, what="every child to be gone")
    finally:
        up.stop(timeout_s=60)
        for pid in processes_with(tmp_path):  # whatever a failure left behind
            os.kill(pid, signal.SIGKILL)

    # Its output a pipe that closes (`up | head`), then stopped: the stop must not trip on
    # writing "stopping…" to the closed pipe (it once raised there, before stopping anything).
    piped = subprocess.Popen([PYTHON, "manage.py", "llmgw", "up", "--no-demo", "--port", str(free_port())], cwd=ROOT,
                             env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        seen = b""
        while b"llmgw is up" not in seen:
            line = piped.stdout.readline()
            assert line, seen.decode(errors="replace")[-2000:]
            seen += line
        piped.stdout.close()
        piped.send_signal(signal.SIGTERM)
        piped.wait(timeout=45)
        wait_until(lambda: not processes_with(tmp_path), timeout_s=5, what="every child to be gone")
    finally:
        try:
            os.killpg(piped.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in processes_with(tmp_path):
            os.kill(pid, signal.SIGKILL)


# -- issue 12: safe defaults when exposed; the demo admin's password is the operator's ------

def fresh_env(tmp_path, **extra) -> dict:
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "llmgw.settings", "LLMGW_DATA_DIR": str(tmp_path / "data"),
            "LLMGW_SQLITE_PATH": "", "LLMGW_DATABASE_URL": "", "LLMGW_REDIS_URL": "", "LLMGW_ALLOWED_HOSTS": "",
            "LLMGW_METRICS_TOKEN": "", "LLMGW_METRICS_PUBLIC": "", **extra}


def test_up_on_an_exposed_address_without_allowed_hosts_exits_2_and_starts_nothing(tmp_path):
    for host in ("0.0.0.0", "::", "10.1.2.3", "cp.example.com"):
        done = subprocess.run([PYTHON, "manage.py", "llmgw", "up", "--no-demo", "--host", host, "--port",
                               str(free_port())], cwd=ROOT, env=fresh_env(tmp_path), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"--host {host} makes this server reachable" in done.stderr and "LLMGW_ALLOWED_HOSTS" in done.stderr
        assert "Traceback" not in done.stderr
        data = tmp_path / "data"
        assert not (data / "llmgw.sqlite3").exists() and not (data / "admin_password").exists()
        assert not processes_with(data)


def test_exposed_up_warns_and_protects_metrics_with_a_generated_token(tmp_path, settings, capsys):
    import io

    from llmgw.cli.web_processes import check_exposure

    out, err = io.StringIO(), io.StringIO()
    assert check_exposure("127.0.0.1", out, err) == 0 and out.getvalue() == "" == err.getvalue()
    settings.LLMGW_ALLOWED_HOSTS = ["cp.example.com"]
    settings.LLMGW_METRICS_PUBLIC = False
    settings.LLMGW_METRICS_TOKEN_FILE = tmp_path / "metrics_token"
    os.environ.pop("LLMGW_METRICS_TOKEN", None)
    assert check_exposure("0.0.0.0", out, err) == 0
    text = out.getvalue()
    assert "WARNING: listening on 0.0.0.0" in text and "LLMGW_BEHIND_TLS=1" in text
    token = (tmp_path / "metrics_token").read_text()
    assert len(token) >= 32 and (tmp_path / "metrics_token").stat().st_mode & 0o777 == 0o600
    assert "credentials_file" in text and token not in text  # how to send it, not the token itself
    assert check_exposure("::", io.StringIO(), io.StringIO()) == 0
    assert (tmp_path / "metrics_token").read_text() == token  # kept across starts
    (tmp_path / "metrics_token").unlink()
    settings.LLMGW_METRICS_PUBLIC = True
    out = io.StringIO()
    assert check_exposure("0.0.0.0", out, io.StringIO()) == 0
    assert "public" in out.getvalue() and not (tmp_path / "metrics_token").exists()


@pytest.mark.django_db
def test_ensure_admin_sets_the_password_only_when_it_creates_the_user(tmp_path, settings, monkeypatch):
    import io

    from django.contrib.auth import get_user_model

    from llmgw.cli.up import ensure_admin

    settings.DATA_DIR = tmp_path
    monkeypatch.delenv("LLMGW_ADMIN_PASSWORD", raising=False)
    old_umask = os.umask(0o022)  # an operator's shell: the file must be private anyway
    try:
        user, password = ensure_admin(io.StringIO())
    finally:
        os.umask(old_umask)
    assert user == "admin" and (tmp_path / "admin_password").read_text() == password
    assert (tmp_path / "admin_password").stat().st_mode & 0o777 == 0o600
    assert ensure_admin(io.StringIO()) == ("admin", password)  # the next start: same password

    admin = get_user_model().objects.get(username="admin")
    admin.set_password("the operator's own")
    admin.save()
    for env in ({}, {"LLMGW_ADMIN_PASSWORD": password}):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        out = io.StringIO()
        assert ensure_admin(out) == ("admin", None)
        assert "unchanged (set by an operator)" in out.getvalue()
        assert get_user_model().objects.get(username="admin").check_password("the operator's own")
    assert password not in out.getvalue()


@pytest.mark.django_db
def test_the_demo_api_key_file_is_private(tmp_path, settings):
    from llmgw.cli.up import ensure_demo_key

    settings.DATA_DIR = tmp_path
    old_umask = os.umask(0o022)
    try:
        key = ensure_demo_key()
    finally:
        os.umask(old_umask)
    assert (tmp_path / "demo_api_key").read_text() == key
    assert (tmp_path / "demo_api_key").stat().st_mode & 0o777 == 0o600


OLD_DEMO_COMMAND = ("{python} -m llama_cpp.server --model {weights_path} --host {host} --port {port}"
                    " --model_alias {served_name} --n_ctx 2048 --chat_format gemma"
                    " --n_threads {threads} --interrupt_requests False")


@pytest.mark.django_db
def test_preset_profiles_of_an_older_database_start_engines_with_a_key_and_custom_ones_are_left_alone():
    """Issue 12's data migration: the demo profile ``llmgw up`` made (and any copy of a
    preset's old command) get the key option; a custom command is the operator's."""
    from importlib import import_module

    from django.apps import apps

    from catalog.models import Profile

    demo = Profile.objects.create(name="llama-cpp-python-cpu", engine="llama_cpp_python", command=OLD_DEMO_COMMAND,
                                  env={"OMP_NUM_THREADS": "1"}, cpu_cores=1)
    copy = Profile.objects.create(name="my-vllm", engine="vllm", gpus_needed=1, gpu_memory_mib=1,
                                  command="vllm serve {weights_path} --host {host} --port {port} --served-model-name"
                                          " {served_name} --tensor-parallel-size {tp_size}")
    sglang = Profile.objects.create(name="sglang", engine="sglang", gpus_needed=1, gpu_memory_mib=1,
                                    command="{python} -m sglang.launch_server --model-path {weights_path}"
                                            " --port {port}")
    custom = Profile.objects.create(name="mine", engine="custom", command="my-engine --port {port}", cpu_cores=1)
    tuned = Profile.objects.create(name="vllm", engine="vllm", gpus_needed=1, gpu_memory_mib=1,
                                   command="vllm serve {weights_path} --port {port} --api-key {api_key}")
    before = {p.pk: (p.command, p.env) for p in (custom, tuned)}
    import_module("catalog.migrations.0006_presets_start_engines_with_a_key").add_engine_keys(apps, None)
    demo.refresh_from_db(), copy.refresh_from_db(), sglang.refresh_from_db()
    assert (demo.command, demo.env) == (OLD_DEMO_COMMAND, {"OMP_NUM_THREADS": "1", "API_KEY": "{api_key}"})
    assert copy.env == {"VLLM_API_KEY": "{api_key}"}
    assert sglang.command.endswith(" --port {port} --api-key {api_key}") and sglang.env == {}
    assert {p.pk: (p.command, p.env) for p in Profile.objects.filter(pk__in=before)} == before
    assert demo.protects_engine and copy.protects_engine and sglang.protects_engine
    assert not Profile.objects.get(pk=custom.pk).protects_engine


# -- issue 14: `up` supervises its agent; `up` exiting stops its engines ------------------------

CREATE_FAKE_MODEL = """
from catalog.models import Model
from tests.cluster import fake_profile
model = Model(name="steady", weights="file:/dev/null", profile=fake_profile("fake-cpu"), min_replicas=1,
              max_replicas=1)
model.full_clean()
model.save()
"""


def agent_pids(data_dir) -> list[int]:
    """Pids of the `llmgw agent` processes among those of ``data_dir``."""
    found = []
    for pid in processes_with(data_dir):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"llmgw" in argv and b"agent" in argv:
            found.append(pid)
    return found


def engine_records(data_dir) -> list[dict]:
    from fleet.agent.processes import read_state

    return read_state(data_dir / "agent" / "engines.json")


def start_up_with_a_fake_model(tmp_path) -> tuple[dict[str, str], Proc]:
    """`llmgw up --no-demo` on a data directory in ``tmp_path`` whose catalog holds one fake
    engine model (CREATE_FAKE_MODEL); returns its environment and the `up` process, once its
    banner is out."""
    env = {"DJANGO_SETTINGS_MODULE": "llmgw.settings", "LLMGW_DATA_DIR": str(tmp_path),
           "LLMGW_SQLITE_PATH": str(tmp_path / "llmgw.sqlite3"), "LLMGW_DATABASE_URL": "", "LLMGW_REDIS_URL": "",
           "LLMGW_RECONCILE_INTERVAL": "0.5s", "LLMGW_AGENT_LOST_AFTER": "60s"}
    for argv in (["migrate", "-v0"], ["shell", "-c", CREATE_FAKE_MODEL]):
        done = subprocess.run([PYTHON, "manage.py", *argv], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    up = Proc([PYTHON, "manage.py", "llmgw", "up", "--no-demo", "--port", str(free_port())], tmp_path / "up.log",
              env=env)
    try:
        wait_until(lambda: "llmgw is up" in up.log() or up.proc.poll() is not None, timeout_s=90, interval_s=0.3,
                   what="the banner")
        assert up.proc.poll() is None, up.log()[-3000:]
    except BaseException:
        up.stop(timeout_s=60)
        raise
    return env, up


def test_up_restarts_a_killed_agent_whose_engine_keeps_serving_and_stops_it_on_exit(tmp_path):
    import httpx

    from fleet.agent.processes import process_alive

    env, up = start_up_with_a_fake_model(tmp_path)
    engine = None
    try:

        def serving():
            records = [r for r in engine_records(tmp_path) if not r.get("stopping")]
            if "ready on port" not in up.log() or not records:
                return None
            return records[0]

        engine = wait_until(serving, timeout_s=90, interval_s=0.3, what="the engine to serve")
        pid, start = engine["pid"], engine.get("start_time")
        url = f"http://{engine['host']}:{engine['port']}/v1/models"
        headers = {"Authorization": f"Bearer {engine['spec']['api_key']}"}
        [agent] = agent_pids(tmp_path)
        os.kill(agent, signal.SIGKILL)

        new_agent = wait_until(lambda: [p for p in agent_pids(tmp_path) if p != agent], timeout_s=60,
                               interval_s=0.3, what="a new agent")
        assert "llmgw up: agent exited with code -9; restarting it" in up.log()
        wait_until(lambda: "adopted engine of replica" in up.log(), timeout_s=60, interval_s=0.3,
                   what="the new agent to adopt the engine")
        assert up.proc.poll() is None and len(new_agent) == 1
        assert process_alive(pid, start)  # the same engine process, still serving
        assert httpx.get(url, headers=headers, timeout=10).status_code == 200
        assert [r["pid"] for r in engine_records(tmp_path)] == [pid]

        up.proc.send_signal(signal.SIGTERM)
        up.proc.wait(timeout=60)
        assert not process_alive(pid, start), up.log()[-3000:]  # `up` exiting stops its engines
        wait_until(lambda: not processes_with(tmp_path), timeout_s=5, what="every child to be gone")
    finally:
        up.stop(timeout_s=60)
        for pid_left in processes_with(tmp_path):
            os.kill(pid_left, signal.SIGKILL)
        if engine is not None and process_alive(engine["pid"], engine.get("start_time")):
            os.killpg(engine["pid"], signal.SIGKILL)
    assert "Traceback" not in up.log(), up.log()[-5000:]


def test_up_stops_the_engines_its_agent_left_running(tmp_path):
    """An agent killed (or too slow to stop) leaves engines that its state file lists: `up`
    exiting stops them itself — one that ignores SIGTERM is killed after the grace."""
    import io

    from fleet.agent.processes import process_alive, process_start_time, write_state
    from llmgw.cli.up import Group
    from tests.processes import fake_engine

    engines = [fake_engine(free_port(), tmp_path), fake_engine(free_port(), tmp_path, "--term-delay-s", "60")]
    try:
        for proc in engines:  # running: their start time is known
            wait_until(lambda: process_start_time(proc.pid), what="the engine process")
        state = tmp_path / "engines.json"
        write_state(state, [{"pid": p.pid, "start_time": process_start_time(p.pid), "replica_id": i, "spec": {},
                             "stopping": False} for i, p in enumerate(engines)])
        starts = [process_start_time(p.pid) for p in engines]
        out = io.StringIO()
        Group(out, engines_state_file=state).stop_engines_left(grace_s=1.0)
        assert "stopping 2 engine(s) the agent left running" in out.getvalue()
        assert not any(process_alive(p.pid, s) for p, s in zip(engines, starts))
    finally:
        for proc in engines:
            proc.stop(signal.SIGKILL)


def test_up_killed_takes_its_children_and_engines_with_it_and_one_data_dir_has_one_up(tmp_path):
    """kill -9 of `up` (its children run in sessions of their own) must not leave web, worker,
    agent and engines serving with no one to stop them: the kernel tells each child (a parent
    death signal) and the agent stops its engines. While one `up` runs, a second on the same
    data directory refuses to start (two agents named local would adopt each other's engines)."""
    from fleet.agent.processes import process_alive

    env, up = start_up_with_a_fake_model(tmp_path)
    engine = None
    try:
        engine = wait_until(lambda: "ready on port" in up.log() and next(iter(engine_records(tmp_path)), None),
                            timeout_s=90, interval_s=0.3, what="the engine to serve")

        second = subprocess.run([PYTHON, "manage.py", "llmgw", "up", "--no-demo", "--port", str(free_port())],
                                cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
        assert second.returncode == 1, second.stdout + second.stderr
        assert f"another llmgw up (pid {up.proc.pid}) is running on the data directory" in second.stderr

        children = [p for p in processes_with(tmp_path) if p != up.proc.pid]
        assert children
        up.proc.kill()
        up.proc.wait(timeout=30)
        wait_until(lambda: not processes_with(tmp_path), timeout_s=90, interval_s=0.5,
                   what="every child of the killed up to be gone")
        assert not process_alive(engine["pid"], engine.get("start_time"))
    finally:
        up.stop(timeout_s=60)
        for pid_left in processes_with(tmp_path):
            os.kill(pid_left, signal.SIGKILL)
        if engine is not None and process_alive(engine["pid"], engine.get("start_time")):
            os.killpg(engine["pid"], signal.SIGKILL)
