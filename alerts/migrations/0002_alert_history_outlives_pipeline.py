"""Alerts outlive their pipeline and rule: the links become SET_NULL, and each alert keeps the names it was
about (filled here for the alerts that exist)."""
import django.db.models.deletion
from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def remember_names(apps, schema_editor):
    Alert = apps.get_model("alerts", "Alert")
    AlertRule = apps.get_model("alerts", "AlertRule")
    Pipeline = apps.get_model("consumers", "Pipeline")
    Alert.objects.update(
        pipeline_name=Subquery(Pipeline.objects.filter(pk=OuterRef("pipeline_id")).values("name")[:1]),
        rule_name=Subquery(AlertRule.objects.filter(pk=OuterRef("rule_id")).values("name")[:1]),
        rule_kind=Subquery(AlertRule.objects.filter(pk=OuterRef("rule_id")).values("kind")[:1]))


class Migration(migrations.Migration):

    dependencies = [
        ('alerts', '0001_initial'),
        ('consumers', '0006_topic_check_job'),
    ]

    operations = [
        migrations.AddField(
            model_name='alert',
            name='pipeline_name',
            field=models.CharField(blank=True, default='', max_length=100),
        ),
        migrations.AddField(
            model_name='alert',
            name='rule_kind',
            field=models.CharField(blank=True, choices=[('lag_records', 'lag above N records'), ('lag_seconds', 'lag above N seconds'), ('lost', 'any lost record'), ('duplicated', 'any duplicated record'), ('phantom', 'phantom rows'), ('gap', 'a gap in the ledger'), ('status', 'status STALL / STOP / ERR'), ('dead_letters', 'dead letters above N per interval'), ('no_consumer', 'should run but no live consumer')], default='', max_length=20),
        ),
        migrations.AddField(
            model_name='alert',
            name='rule_name',
            field=models.CharField(blank=True, default='', max_length=100),
        ),
        migrations.AlterField(
            model_name='alert',
            name='pipeline',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='alerts', to='consumers.pipeline'),
        ),
        migrations.AlterField(
            model_name='alert',
            name='rule',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='alerts', to='alerts.alertrule'),
        ),
        migrations.RunPython(remember_names, migrations.RunPython.noop),
    ]
