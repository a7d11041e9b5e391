"""The name of this process among the control plane's: ``host:pid``, as the pass lock's
holder, usage reports and ``ControlPlane`` rows know it. Read per call, never at import:
django-q2 forks its workers after import, so a module-level value would give every worker
the parent's pid.
"""

from __future__ import annotations

import os
import socket


def this_process() -> tuple[str, int]:
    """``(host name, pid)`` of the calling process (``ControlPlane.host``/``.pid``)."""
    return socket.gethostname(), os.getpid()


def process_name() -> str:
    """``host:pid`` of the calling process (``PassLock.holder``, ``UsageReport.process``)."""
    host, pid = this_process()
    return f"{host}:{pid}"
