#!/usr/bin/env python
"""Django's command-line entry point for llmgw (``manage.py llmgw …`` is the operator CLI)."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    from django.core.management import execute_from_command_line

    from llmgw.env import ConfigError

    try:
        execute_from_command_line(sys.argv)
    except ConfigError as exc:  # a bad LLMGW_* value: say which, not a traceback
        print(f"llmgw: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
