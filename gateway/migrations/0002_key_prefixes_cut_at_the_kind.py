"""API key prefixes recomputed with the fixed rule (fleet's migration 0007 says why)."""

from importlib import import_module

from django.db import migrations

_fleet = import_module("fleet.migrations.0007_token_prefixes_cut_at_the_kind")


def recompute(apps, schema_editor):
    _fleet.recompute(apps, schema_editor, rows=(("gateway", "ApiKey", "prefix"),))


class Migration(migrations.Migration):
    dependencies = [("gateway", "0001_initial"), ("fleet", "0007_token_prefixes_cut_at_the_kind")]
    operations = [migrations.RunPython(recompute, migrations.RunPython.noop)]
