"""Every replica gets its own engine key (issue 12: engines reachable only through the
gateway). Existing rows get one each; Django would give them all the same default."""

import secrets

from django.db import migrations, models

import llmgw.tokens


def give_each_replica_a_key(apps, schema_editor):
    Replica = apps.get_model("fleet", "Replica")
    for pk in Replica.objects.filter(engine_key="").values_list("pk", flat=True).iterator():
        Replica.objects.filter(pk=pk).update(engine_key=secrets.token_hex(32))


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0008_act_permissions_and_api_token_last_use'),
    ]

    operations = [
        migrations.AddField(
            model_name='replica',
            name='engine_key',
            field=models.CharField(default="", editable=False, max_length=64),
        ),
        migrations.RunPython(give_each_replica_a_key, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='replica',
            name='engine_key',
            field=models.CharField(default=llmgw.tokens.new_engine_key, editable=False, max_length=64),
        ),
    ]
