"""Running ``manage.py llmgw …`` in-process, as the CLI tests do."""

from __future__ import annotations

import io

from django.core.management import call_command


def llmgw(*args: str) -> tuple[int, str, str]:
    """Run ``llmgw ARGS``; returns (exit code, stdout, stderr). A command that exits
    (``SystemExit``) gives its code; one that returns gives 0."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("llmgw", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue(), err.getvalue()
