"""Where the gateway of the cluster on this machine listens, for commands that call it
(``llmgw bench``): ``llmgw up`` and ``llmgw web`` record their web process's base URL in
the data directory (``web_url``), since the port is theirs to choose (``--port``,
``LLMGW_PORT``) and a ``ControlPlane`` row has no port."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
from django.conf import settings

from llmgw.datadir import write_private

#: The file in the data directory holding the web process's base URL.
FILE_NAME = "web_url"
#: Where a gateway is looked for when nothing says otherwise.
DEFAULT_URL = "http://127.0.0.1:8000"


def _path() -> Path:
    return Path(settings.DATA_DIR) / FILE_NAME


def record(base_url: str) -> None:
    """Record ``base_url`` (``http://HOST:PORT``) as this machine's web process."""
    write_private(_path(), base_url + "\n")


def forget(base_url: str) -> None:
    """Remove the record if it still names ``base_url`` (another ``up`` may have replaced it)."""
    try:
        if _path().read_text().strip() == base_url:
            _path().unlink()
    except FileNotFoundError:
        pass


def recorded() -> str | None:
    """The base URL ``up``/``web`` recorded, or None."""
    try:
        return _path().read_text().strip() or None
    except FileNotFoundError:
        return None


def default_url() -> tuple[str, str]:
    """The gateway's base URL when no ``--url`` is given, and where it came from, in words:
    ``LLMGW_GATEWAY_URL``, else the web process ``llmgw up``/``web`` recorded, else
    :data:`DEFAULT_URL`."""
    if os.environ.get("LLMGW_GATEWAY_URL"):
        return os.environ["LLMGW_GATEWAY_URL"], "LLMGW_GATEWAY_URL"
    found = recorded()
    if found:
        return found, f"recorded by `llmgw up` or `llmgw web` in {_path()}"
    return DEFAULT_URL, "the default: no web process recorded on this machine"


def nothing_answers(base_url: str, timeout_s: float = 3.0) -> str | None:
    """Why nothing answers HTTP at ``base_url`` (a GET of ``/healthz``: any status counts as
    an answer), or None when something does."""
    try:
        httpx.get(base_url.rstrip("/") + "/healthz", timeout=timeout_s)
    except httpx.HTTPError as exc:
        return str(exc) or type(exc).__name__
    return None
