"""Talking to systemd for ``llmgw service`` and ``llmgw restart``."""

from __future__ import annotations

import shutil
import subprocess

UNITS = {"web": "llmgw-web.service", "worker": "llmgw-worker.service", "agent": "llmgw-agent.service"}


def systemd_available() -> tuple[bool, str]:
    """(available, why not). systemd runs this machine if ``systemctl`` exists and says so."""
    if shutil.which("systemctl") is None:
        return False, "systemctl is not installed here"
    try:
        done = subprocess.run(["systemctl", "is-system-running"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"systemctl does not answer ({exc})"
    state = (done.stdout or done.stderr).strip().splitlines()[:1]
    state = state[0] if state else ""
    if state in ("running", "degraded", "starting", "initializing", "maintenance"):
        return True, ""
    return False, f"systemd does not manage this machine's services (systemctl says: {state or 'nothing'})"


def systemctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=120)
