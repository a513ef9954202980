"""This installation's random key, made once with the database, for PagerDuty's dedup_keys; alerts opened before
keep the key their incidents were opened with ("tally-alert-ID"), so an open incident still closes."""
import uuid

from django.db import migrations, models
from django.db.models import CharField, Value
from django.db.models.functions import Cast, Concat


def create_installation(apps, schema_editor):
    apps.get_model("alerts", "Installation").objects.get_or_create(pk=1, defaults={"key": uuid.uuid4()})


def remember_old_dedup_keys(apps, schema_editor):
    apps.get_model("alerts", "Alert").objects.filter(legacy_dedup_key="").update(
        legacy_dedup_key=Concat(Value("tally-alert-"), Cast("id", CharField())))


class Migration(migrations.Migration):

    dependencies = [
        ('alerts', '0005_mute_watch'),
    ]

    operations = [
        migrations.CreateModel(
            name='Installation',
            fields=[
                ('id', models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ('key', models.UUIDField(default=uuid.uuid4, editable=False)),
            ],
        ),
        migrations.AddField(
            model_name='alert',
            name='legacy_dedup_key',
            field=models.CharField(blank=True, default='', max_length=100),
        ),
        migrations.RunPython(create_installation, migrations.RunPython.noop),
        migrations.RunPython(remember_old_dedup_keys, migrations.RunPython.noop),
    ]
