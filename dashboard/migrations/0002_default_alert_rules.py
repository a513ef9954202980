"""Global default alert rules (alerts/defaults.py): loss, duplicates, phantoms, gaps, bad status,
no live consumer, dead letters."""
from django.db import migrations

from alerts.defaults import DEFAULT_RULES, ensure_default_rules


def add_defaults(apps, schema_editor):
    ensure_default_rules(apps.get_model("dashboard", "AlertRule"))


def remove_defaults(apps, schema_editor):
    AlertRule = apps.get_model("dashboard", "AlertRule")
    for name, kind, _ in DEFAULT_RULES:
        AlertRule.objects.filter(name=name, kind=kind, pipeline=None).delete()


class Migration(migrations.Migration):
    dependencies = [("dashboard", "0001_initial")]
    operations = [migrations.RunPython(add_defaults, remove_defaults)]
