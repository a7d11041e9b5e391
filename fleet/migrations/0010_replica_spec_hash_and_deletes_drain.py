"""Issue 14: a replica records the spec it was started from (``spec_hash``; existing rows
get "" = unknown, treated as current, so an upgrade restarts nothing) and the name of its
model (``model_name``), which it keeps when the model is deleted: ``model`` is now
``SET_NULL``, so a delete drains replicas instead of deleting rows under running engines."""

import django.db.models.deletion
from django.db import migrations, models


def copy_model_names(apps, schema_editor):
    Replica = apps.get_model("fleet", "Replica")
    Model = apps.get_model("catalog", "Model")
    for model_id, name in Model.objects.values_list("id", "name").iterator():
        Replica.objects.filter(model_id=model_id).update(model_name=name)


class Migration(migrations.Migration):

    dependencies = [
        ('catalog', '0006_presets_start_engines_with_a_key'),
        ('fleet', '0009_replica_engine_key'),
    ]

    operations = [
        migrations.AddField(
            model_name='replica',
            name='model_name',
            field=models.CharField(blank=True, default='', max_length=128),
        ),
        migrations.AddField(
            model_name='replica',
            name='spec_hash',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AlterField(
            model_name='replica',
            name='model',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='replicas', to='catalog.model'),
        ),
        migrations.RunPython(copy_model_names, migrations.RunPython.noop),
    ]
