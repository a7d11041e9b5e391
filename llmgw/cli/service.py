"""``llmgw service status|start|stop|restart|install``: this machine's own services."""

from __future__ import annotations

import sys
from pathlib import Path

from django.conf import settings

from llmgw.cli.output import FAILED, NO_SYSTEMD, OK
from llmgw.cli.systemd import UNITS, systemctl, systemd_available

HELP = ("Manage this machine's llmgw services (web, worker, agent) as systemd units. "
        "Exit 0 ok, 1 a systemctl call failed, 3 systemd is not running here.")

UNIT_TEMPLATE = """[Unit]
Description=llmgw {what}
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
WorkingDirectory={base}
EnvironmentFile=-/etc/llmgw/llmgw.env
Environment=PYTHONUNBUFFERED=1
ExecStart={command}
Restart=on-failure
RestartSec=2
{extra}
[Install]
WantedBy=multi-user.target
"""


def unit_files() -> dict[str, str]:
    """Unit name → content. The agent's unit uses KillMode=process so a restart of the
    agent leaves its engines (separate process groups) serving; they are adopted."""
    python, base = sys.executable, Path(settings.BASE_DIR)
    manage = base / "manage.py"
    return {
        # `llmgw web`: uvicorn as `llmgw up` runs it (connection limit, header deadline,
        # keep-alive) and its exposure check (a public address needs LLMGW_ALLOWED_HOSTS);
        # LLMGW_WEB_WORKERS web processes share the port (auto: one per core with Redis, else 1;
        # /etc/llmgw/llmgw.env overrides it, as every Environment= line here).
        UNITS["web"]: UNIT_TEMPLATE.format(what="control plane (web: admin, API, gateway, agent websocket)", base=base,
                                           command=f"{python} {manage} llmgw web --host ${{LLMGW_HOST}} --port ${{LLMGW_PORT}} "
                                                   "--workers ${LLMGW_WEB_WORKERS}",
                                           extra="Environment=LLMGW_HOST=0.0.0.0\nEnvironment=LLMGW_PORT=8000\n"
                                                 "Environment=LLMGW_WEB_WORKERS=auto\n"),
        # `llmgw worker`: django-q2's cluster plus the leader loop; it stops within
        # LLMGW_WORKER_STOP_GRACE of SIGTERM, well inside systemd's own stop timeout.
        UNITS["worker"]: UNIT_TEMPLATE.format(what="reconciler worker (django-q2 and the leader loop)", base=base,
                                              command=f"{python} {manage} llmgw worker", extra=""),
        UNITS["agent"]: UNIT_TEMPLATE.format(what="agent (engines on this machine)", base=base,
                                             command=f"{python} {manage} llmgw agent",
                                             extra="KillMode=process\n"),
    }


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=["status", "start", "stop", "restart", "install"],
                        help="status, start, stop or restart this machine's llmgw units; install writes them")
    parser.add_argument("--only", default="web,worker,agent", help="comma-separated: web, worker, agent")
    parser.add_argument("--dir", default="/etc/systemd/system", help="where install writes unit files")


def run(options, stdout, stderr) -> int:
    wanted = [w.strip() for w in options["only"].split(",") if w.strip()]
    unknown = [w for w in wanted if w not in UNITS]
    if unknown:
        stderr.write(f"unknown service(s): {', '.join(unknown)} (choose from web, worker, agent)\n")
        return 2
    units = [UNITS[w] for w in wanted]
    available, why = systemd_available()
    if options["action"] == "install":
        directory = Path(options["dir"])
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for name, content in unit_files().items():
                if name in units:
                    (directory / name).write_text(content)
                    (directory / name).chmod(0o644)  # no secrets in them; llmgw's umask is 077
                    stdout.write(f"wrote {directory / name}\n")
        except OSError as exc:
            stderr.write(f"cannot write unit files to {directory}: {exc}\n")
            return FAILED
        stdout.write("put LLMGW_* settings in /etc/llmgw/llmgw.env (mode 600): LLMGW_ALLOWED_HOSTS for the web unit "
                     "(it listens on 0.0.0.0 and refuses to start without it), LLMGW_SERVER and LLMGW_AGENT_TOKEN "
                     "for the agent\n")
        if not available:
            stderr.write(f"note: {why}; the units take effect on a machine run by systemd\n")
            return NO_SYSTEMD
        systemctl("daemon-reload")
        return OK
    if not available:
        stderr.write(f"llmgw service: {why}. On this machine run the processes yourself "
                     "(e.g. `manage.py llmgw up`), or install on a machine run by systemd.\n")
        return NO_SYSTEMD
    action = options["action"]
    done = systemctl(action if action != "status" else "status", "--no-pager", *units) if action == "status" \
        else systemctl(action, *units)
    stdout.write(done.stdout)
    if done.returncode != 0 and action != "status":
        stderr.write(done.stderr or f"systemctl {action} failed\n")
        return FAILED
    if action == "status":
        # systemctl status exits 3 for inactive units: report, not a failure of ours.
        stderr.write(done.stderr)
        return OK if done.returncode == 0 else FAILED
    stdout.write(f"{action}: {', '.join(units)}\n")
    return OK
