"""Stored token prefixes recomputed with the fixed rule (``llmgw.tokens.token_prefix``).

The old rule cut at the secret's *last* dash, so a secret containing '-' had most of itself
stored in clear, and the new rule would no longer find those rows. An old prefix always
starts with ``llmgw-<kind>-`` and at least the secret's first 12 characters, so applying the
new rule to it gives exactly the new prefix. The rule is copied here, frozen, as migrations
must not change meaning when the code does."""

from django.db import migrations

PREFIX_LEN = 12


def _prefix(token: str) -> str:
    brand, kind, secret = (token.split("-", 2) + ["", ""])[:3]
    if brand == "llmgw" and kind and secret:
        return f"llmgw-{kind}-{secret[:PREFIX_LEN]}"
    return token[:PREFIX_LEN]


def recompute(apps, schema_editor, rows=(("fleet", "Agent", "token_prefix"), ("fleet", "ApiToken", "prefix"))):
    for app, name, field in rows:
        model = apps.get_model(app, name)
        for pk, old in model.objects.values_list("pk", field):
            new = _prefix(old) if old else old
            if new != old:
                model.objects.filter(pk=pk).update(**{field: new})


class Migration(migrations.Migration):
    dependencies = [("fleet", "0006_scaling_memory")]
    operations = [migrations.RunPython(recompute, migrations.RunPython.noop)]
