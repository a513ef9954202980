"""Notifications of an operator's acknowledge ("acknowledged": longer than the kinds before it)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('alerts', '0006_installation_dedup_keys'),
    ]

    operations = [
        migrations.AlterField(
            model_name='notification',
            name='kind',
            field=models.CharField(choices=[('fired', 'fired'), ('reminder', 'reminder'), ('resolved', 'resolved'), ('acknowledged', 'acknowledged')], max_length=15),
        ),
    ]
