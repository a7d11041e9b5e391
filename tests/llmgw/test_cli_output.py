"""What every ``llmgw`` command prints, whatever the verb: help without Django's generic
options, empty lists said in a sentence, times to the second, a database that is not
there said in a line."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import OperationalError
from django.utils import timezone

from fleet.models import ControlPlane, ModelState
from fleet.ops.operations import stop_cluster
from gateway.models import ApiKey, Team
from llmgw.cli import COMMANDS
from llmgw.cli.output import duration, when
from tests.cli import llmgw

pytestmark = pytest.mark.django_db

DJANGO_OPTIONS = ("--verbosity", "--settings", "--pythonpath", "--traceback", "--no-color", "--force-color",
                  "--skip-checks")
#: An instant as isoformat writes it (microseconds, +00:00): never in output for people.
RAW_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d|\.\d{6}|\+00:00")


def _help(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        call_command("llmgw", *args, "--help")
    assert exit_info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_names_no_django_option(capsys, command):
    text = _help(capsys, *([command] if command else []))
    assert text.startswith("usage:") and " llmgw " in text.splitlines()[0]
    for option in DJANGO_OPTIONS:
        assert option not in text, f"{option} in `llmgw {command or ''} --help`"


def test_the_top_help_lists_every_command_and_the_exit_codes(capsys):
    text = _help(capsys)
    assert all(name in text for name in COMMANDS)
    assert "0 ok, 1 failed, 2 bad usage" in " ".join(text.split())


def _options_without_help(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """``COMMAND OPTION`` for each argument of ``parser`` and its subparsers with no help text."""
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                missing += _options_without_help(child, f"{path} {name}".strip())
        elif not isinstance(action, argparse._HelpAction) and not (action.help or "").strip():
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_option_of_every_command_has_help_text():
    from llmgw.management.commands.llmgw import Command
    parser = Command().create_parser("manage.py", "llmgw")
    assert _options_without_help(parser, "") == []


def test_django_options_still_work_though_hidden():
    code, out, _ = llmgw("--verbosity", "0", "status", "--json")
    assert code == 0 and '"serving"' in out


def test_when_is_to_the_second_in_utc_and_duration_to_the_second_under_an_hour():
    instant = datetime(2026, 12, 4, 18, 23, 33, 987654, tzinfo=UTC)
    assert when(instant) == "2026-12-04 18:23:33 UTC"
    assert when(instant.isoformat()) == "2026-12-04 18:23:33 UTC"
    assert when("2026-12-04T21:23:33.5+03:00") == "2026-12-04 18:23:33 UTC"
    assert when(None) == "—" and when("", none="never") == "never"
    assert [duration(s) for s in (0, 4.4, 59.6, 192, 3600, 7500, 90000)] == [
        "0 s", "4 s", "1 min", "3 min 12 s", "1 h", "2 h 5 min", "1 d 1 h"]


@pytest.mark.parametrize(("args", "sentence"), [
    (("keys", "list"), "API keys: none yet: `llmgw keys create NAME` makes one"),
    (("teams", "list"), "teams: none yet: `llmgw teams create NAME` makes one"),
    (("agents", "list"), "agents: no agents registered yet"),
    (("mirror", "list"), "mirrored weights: none yet"),
])
def test_an_empty_list_is_said_in_a_sentence(args, sentence, settings, tmp_path):
    settings.LLMGW_MIRROR_DIR = str(tmp_path)
    code, out, _ = llmgw(*args)
    assert code == 0 and sentence in out
    assert "━" not in out  # no header over nothing


def test_a_team_without_keys_says_so():
    Team.objects.create(name="research")
    code, out, _ = llmgw("teams", "show", "research")
    assert code == 0 and "keys: none in this team yet (`llmgw keys set KEY --team research` adds one)" in out


def test_times_in_keys_status_and_explain_are_to_the_second(make_model):
    key, _ = ApiKey.create_key("ci", expires_at=timezone.now() + timedelta(days=3, microseconds=123456))
    key.revoke()
    ControlPlane.objects.create(host="cp-a", role="web", pid=12)
    model = make_model("lazy", min_replicas=0, on_demand=True)
    ModelState.objects.create(model=model, wanted_at=timezone.now() - timedelta(microseconds=654321))
    stop_cluster("ops")
    outputs = {" ".join(args): llmgw(*args)[1] for args in (("keys", "list"), ("keys", "revoke", "ci"),
                                                            ("status",), ("explain", "lazy"))}
    for command, out in outputs.items():
        assert not RAW_ISO.search(out), f"`llmgw {command}` printed {RAW_ISO.search(out).group()!r}:\n{out}"
    assert re.search(r"expires.*\n.*\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", outputs["keys list"], re.DOTALL)
    assert re.search(r"STOPPED since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC by ops", outputs["status"])
    assert re.search(r"wanted at: +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", outputs["explain lazy"])


def test_a_database_without_tables_is_one_line_and_exit_1(monkeypatch):
    def no_table():
        raise OperationalError("no such table: fleet_controlplane")

    monkeypatch.setattr("llmgw.cli.status.cluster_status", no_table)
    code, out, err = llmgw("status")
    assert code == 1 and out == ""
    assert err.strip() == ("the database has no llmgw tables yet (no such table: fleet_controlplane): run "
                           "`manage.py migrate` (or `llmgw up`) first")


def test_a_database_away_is_one_line_and_exit_1(monkeypatch):
    def refused():
        raise OperationalError('connection to server at "db" (10.0.0.9), port 5432 failed: Connection refused\n'
                               "\tIs the server running on that host and accepting TCP/IP connections?")

    monkeypatch.setattr("llmgw.cli.status.cluster_status", refused)
    code, _, err = llmgw("status")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "cannot use the database (connection to server" in err and "LLMGW_DATABASE_URL" in err
