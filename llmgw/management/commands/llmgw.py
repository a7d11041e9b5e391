"""``manage.py llmgw <command>``: the operator's CLI. Each subcommand lives in ``llmgw.cli``."""

from __future__ import annotations

import argparse

import django
from django.core.management.base import BaseCommand, CommandError

from fleet.agent import VERSION
from llmgw.cli import COMMANDS


class Command(BaseCommand):
    help = ("Operate the llmgw cluster: up, status, stop, start, restart, service, explain, keys, teams, bench, "
            "mirror, agent, agents (and more: see the list below). `llmgw COMMAND --help` for each.")

    def get_version(self) -> str:
        """``--version``: llmgw's (and Django's), not Django's alone."""
        return f"llmgw {VERSION} (Django {django.get_version()})"

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)
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
        code = COMMANDS[name].run(options, self.stdout, self.stderr)
        if code:
            raise SystemExit(code)
