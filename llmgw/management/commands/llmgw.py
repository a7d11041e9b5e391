"""``manage.py llmgw <command>``: the operator's CLI. Each subcommand lives in ``llmgw.cli``."""

from __future__ import annotations

import argparse

import django
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from fleet.agent import VERSION
from llmgw.cli import COMMANDS
from llmgw.cli.output import FAILED

#: Django's options for every command, still accepted but left out of ``--help``: they say
#: nothing about llmgw (``--version`` stays: it names llmgw's version).
DJANGO_OPTIONS = {"--verbosity", "-v", "--settings", "--pythonpath", "--traceback", "--no-color", "--force-color",
                  "--skip-checks"}


class Command(BaseCommand):
    help = ("Operate the llmgw cluster: up, status, stop, start, restart, service, explain, agents, keys, teams, "
            "bench, simulate, mirror, agent (and more: see the list below). `llmgw COMMAND --help` for each. "
            "Exit codes: 0 ok, 1 failed, 2 bad usage, 3 no systemd here.")

    def get_version(self) -> str:
        """``--version``: llmgw's (and Django's), not Django's alone."""
        return f"llmgw {VERSION} (Django {django.get_version()})"

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        for action in parser._actions:  # argparse has no public way to hide an option once added
            if DJANGO_OPTIONS.intersection(action.option_strings):
                action.help = argparse.SUPPRESS
        sub = parser.add_subparsers(dest="llmgw_command", metavar="COMMAND")
        for name, module in COMMANDS.items():
            child = sub.add_parser(name, help=module.HELP, description=module.HELP,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
            module.add_arguments(child)
        return parser

    def handle(self, *args, **options):
        name = options.get("llmgw_command")
        if not name:
            self.print_help("manage.py", "llmgw")
            raise CommandError("choose a command", returncode=2)
        try:
            code = COMMANDS[name].run(options, self.stdout, self.stderr)
        except DatabaseError as exc:
            self.stderr.write(_database_error(exc))
            code = FAILED
        if code:
            raise SystemExit(code)


def _database_error(exc: DatabaseError) -> str:
    """One line for a database that is away or not migrated, instead of a traceback."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if "no such table" in first or ("relation" in first and "does not exist" in first):
        return f"the database has no llmgw tables yet ({first}): run `manage.py migrate` (or `llmgw up`) first"
    return f"cannot use the database ({first}); is it running, and is LLMGW_DATABASE_URL right?"
