"""Global rules every installation gets: data loss, duplicates, phantoms, gaps, bad status, dead consumer.
Lag thresholds depend on the deployment, so they are left for operators to add."""
from django.db import migrations

DEFAULT_RULES = [
    ("Lost records", "lost", None),
    ("Duplicated records", "duplicated", None),
    ("Phantom rows", "phantom", None),
    ("Ledger gap", "gap", None),
    ("Stalled, stopped or erroring", "status", None),
    ("No live consumer", "no_consumer", None),
    ("Dead letters (over 100 in 5 minutes)", "dead_letters", 100),
]


def add_defaults(apps, schema_editor):
    AlertRule = apps.get_model("dashboard", "AlertRule")
    for name, kind, threshold in DEFAULT_RULES:
        AlertRule.objects.get_or_create(name=name, kind=kind, pipeline=None, defaults={"threshold": threshold})


def remove_defaults(apps, schema_editor):
    AlertRule = apps.get_model("dashboard", "AlertRule")
    for name, kind, _ in DEFAULT_RULES:
        AlertRule.objects.filter(name=name, kind=kind, pipeline=None).delete()


class Migration(migrations.Migration):
    dependencies = [("dashboard", "0001_initial")]
    operations = [migrations.RunPython(add_defaults, remove_defaults)]
