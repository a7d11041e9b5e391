"""A small real cluster for tests: the web process, ``llmgw worker`` and an agent as processes on the test
database, engines being the fake engine. Used by module-scoped fixtures."""

from __future__ import annotations

from pathlib import Path

from tests.processes import PYTHON, ROOT, Proc, daphne, free_port, wait_until

FAKE_ENGINE = ROOT / "tests" / "fake_engine.py"

FAST_ENV = {
    "DJANGO_SETTINGS_MODULE": "llmgw.settings",
    "LLMGW_RECONCILE_INTERVAL": "0.5s",
    "LLMGW_WATCH_INTERVAL": "50ms",
    "LLMGW_WATCH_FAST_INTERVAL": "20ms",
    "LLMGW_USAGE_FLUSH_INTERVAL": "0.2s",
    "LLMGW_USAGE_REPORT_FRESH": "3s",
    "LLMGW_DRAIN_GRACE": "3s",
    "LLMGW_BACKOFF_BASE": "0.5s",
    "LLMGW_AGENT_LOST_AFTER": "5s",
    # The agents here heartbeat every 0.5 s or faster (llmgw.W003 compares the route grace).
    "LLMGW_HEARTBEAT_INTERVAL": "0.5s",
    "Q_WORKERS": "2",
    # These clusters test placement and serving; API keys are tested in test_gateway_keys.
    "LLMGW_GATEWAY_AUTH": "false",
}


class LiveCluster:
    """Processes of one cluster; ``stop()`` ends them all (agent last, engines with it)."""

    def __init__(self, log_dir: Path, agent_name: str = "local", extra_env: dict[str, str] | None = None):
        from fleet.models import Agent

        self.log_dir = log_dir
        self.env = {**FAST_ENV, **(extra_env or {})}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.agent_row, self.token = Agent.create_with_token(agent_name)
        self.agent_name = agent_name
        self.web = daphne(self.port, log_dir, env=self.env)
        self.worker = Proc([PYTHON, "manage.py", "llmgw", "worker"], log_dir / "worker.log", env=self.env)
        self.agent = None
        self.start_agent()

    def start_agent(self, *extra: str) -> Proc:
        # The token in the environment, as the README says (argv is readable by every user).
        self.agent = Proc([PYTHON, "manage.py", "llmgw", "agent", "--server", self.url,
                           "--name", self.agent_name, "--state-dir", str(self.log_dir / "agent"),
                           "--heartbeat-s", "0.5", "--stop-grace-s", "3", "--port-range", "22000-22999",
                           "--stop-engines-on-exit", *extra],
                          self.log_dir / "agent.log", env={**self.env, "LLMGW_AGENT_TOKEN": self.token})
        from fleet.models import Agent
        wait_until(lambda: Agent.objects.filter(pk=self.agent_row.pk, connected=True).exclude(address="").exists(),
                   timeout_s=30, what="the agent to connect")
        return self.agent

    def logs(self) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log()[-4000:]}" for p in (self.web, self.worker, self.agent) if p)

    def stop(self) -> None:
        for proc in (self.agent, self.worker, self.web):
            if proc is not None:
                proc.stop()


def fake_profile(name: str = "fake-cpu", *args: str, gpus: int = 0, startup_timeout_s: int = 30):
    from catalog.models import Profile

    command = (f"{{python}} {FAKE_ENGINE} --host {{host}} --port {{port}} --served-name {{served_name}}"
               " --api-key {api_key} " + " ".join(args))
    profile = Profile(name=name, engine=Profile.Engine.CUSTOM, command=command.strip(), gpus_needed=gpus,
                      gpu_memory_mib=40960 if gpus else 0, cpu_cores=0 if gpus else 0.1, memory_mib=0 if gpus else 64,
                      readiness_path="/v1/models", startup_timeout_s=startup_timeout_s)
    profile.full_clean()
    profile.save()
    return profile


def live_cluster_fixture(name: str, extra_env: dict[str, str] | None = None):
    """A module-scoped pytest fixture yielding a LiveCluster on the test database (with
    ``extra_env`` over FAST_ENV). The module's tests use the database from it (no django_db
    mark: per-test flushes would pull rows from under running processes); it is flushed
    once the cluster has stopped."""
    import pytest

    @pytest.fixture(scope="module")
    def live(django_db_setup, django_db_blocker, tmp_path_factory):
        from django.core.management import call_command

        from catalog.models import ClusterSettings

        with django_db_blocker.unblock():
            ClusterSettings.get_solo()
            cluster = LiveCluster(tmp_path_factory.mktemp(name), extra_env=extra_env)
            try:
                yield cluster
            finally:
                cluster.stop()
                call_command("flush", interactive=False, verbosity=0)

    return live
