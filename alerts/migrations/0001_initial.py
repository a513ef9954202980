"""The alert models, moved from the dashboard app: created in state only, on the tables the dashboard app
created (same names, Meta.db_table). Content types are relabelled so existing permissions follow."""
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

MODELS = ("alertrule", "alert", "mute", "notification")


def relabel_content_types(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label="alerts", model__in=MODELS).exists():
        ContentType.objects.filter(app_label="dashboard", model__in=MODELS).update(app_label="alerts")


def restore_content_types(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label="dashboard", model__in=MODELS).exists():
        ContentType.objects.filter(app_label="alerts", model__in=MODELS).update(app_label="dashboard")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('consumers', '0002_rewind_markers'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('dashboard', '0002_default_alert_rules'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='AlertRule',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=100)),
                        ('kind', models.CharField(choices=[('lag_records', 'lag above N records'), ('lag_seconds', 'lag above N seconds'), ('lost', 'any lost record'), ('duplicated', 'any duplicated record'), ('phantom', 'phantom rows'), ('gap', 'a gap in the ledger'), ('status', 'status STALL / STOP / ERR'), ('dead_letters', 'dead letters above N per interval'), ('no_consumer', 'should run but no live consumer')], max_length=20)),
                        ('threshold', models.FloatField(blank=True, help_text='N for lag (records or seconds) and dead letters per interval.', null=True)),
                        ('interval_seconds', models.PositiveIntegerField(default=300, help_text='Window for dead letters per interval.')),
                        ('statuses', models.CharField(blank=True, default='STALL,STOP,ERR', help_text='For the status rule: comma-separated statuses that fire.', max_length=50)),
                        ('recipients', models.TextField(blank=True, default='', help_text='Comma-separated addresses; empty: settings.ALERT_RECIPIENTS.')),
                        ('reminder_seconds', models.PositiveIntegerField(default=3600, help_text='Reminder interval while firing; 0: no reminders.')),
                        ('enabled', models.BooleanField(default=True)),
                        ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                        ('pipeline', models.ForeignKey(blank=True, help_text='Empty: applies to every pipeline.', null=True, on_delete=django.db.models.deletion.CASCADE, related_name='alert_rules', to='consumers.pipeline')),
                    ],
                    options={
                        'db_table': 'dashboard_alertrule',
                        'ordering': ['kind', 'name'],
                    },
                ),
                migrations.CreateModel(
                    name='Alert',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('state', models.CharField(choices=[('firing', 'firing'), ('acknowledged', 'acknowledged'), ('resolved', 'resolved')], default='firing', max_length=15)),
                        ('summary', models.CharField(max_length=300)),
                        ('facts', models.JSONField(default=dict, help_text='What evaluation saw last: partitions, offsets, counts.')),
                        ('started_at', models.DateTimeField()),
                        ('last_seen_at', models.DateTimeField()),
                        ('notified_at', models.DateTimeField(blank=True, null=True)),
                        ('next_reminder_at', models.DateTimeField(blank=True, null=True)),
                        ('reminders_sent', models.PositiveIntegerField(default=0)),
                        ('acknowledged_at', models.DateTimeField(blank=True, null=True)),
                        ('acknowledged_by', models.CharField(blank=True, default='', max_length=150)),
                        ('resolved_at', models.DateTimeField(blank=True, null=True)),
                        ('pipeline', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='alerts', to='consumers.pipeline')),
                        ('rule', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='alerts', to='alerts.alertrule')),
                    ],
                    options={
                        'db_table': 'dashboard_alert',
                        'ordering': ['-started_at'],
                    },
                ),
                migrations.CreateModel(
                    name='Mute',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('until', models.DateTimeField()),
                        ('reason', models.CharField(blank=True, default='', max_length=200)),
                        ('created_by', models.CharField(blank=True, default='', max_length=150)),
                        ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                        ('pipeline', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='alert_mutes', to='consumers.pipeline')),
                        ('rule', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='mutes', to='alerts.alertrule')),
                    ],
                    options={
                        'db_table': 'dashboard_mute',
                        'ordering': ['-until'],
                    },
                ),
                migrations.CreateModel(
                    name='Notification',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('kind', models.CharField(choices=[('fired', 'fired'), ('reminder', 'reminder'), ('resolved', 'resolved')], max_length=10)),
                        ('sequence', models.PositiveIntegerField(default=0, help_text='Reminder number; 0 for fired/resolved.')),
                        ('recipients', models.JSONField(default=list)),
                        ('subject', models.CharField(max_length=300)),
                        ('body_text', models.TextField()),
                        ('body_html', models.TextField()),
                        ('created_at', models.DateTimeField()),
                        ('attempts', models.PositiveIntegerField(default=0)),
                        ('next_attempt_at', models.DateTimeField()),
                        ('last_error', models.TextField(blank=True, default='')),
                        ('delivered_at', models.DateTimeField(blank=True, null=True)),
                        ('failed_at', models.DateTimeField(blank=True, help_text='Gave up after the last attempt.', null=True)),
                        ('alert', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='notifications', to='alerts.alert')),
                    ],
                    options={
                        'db_table': 'dashboard_notification',
                        'ordering': ['-created_at'],
                    },
                ),
                migrations.AddIndex(
                    model_name='alert',
                    index=models.Index(fields=['state', '-started_at'], name='alert_state_idx'),
                ),
                migrations.AddConstraint(
                    model_name='alert',
                    constraint=models.UniqueConstraint(condition=models.Q(('state__in', ('firing', 'acknowledged'))), fields=('rule', 'pipeline'), name='uniq_open_alert_per_rule_pipeline'),
                ),
                migrations.AddIndex(
                    model_name='notification',
                    index=models.Index(condition=models.Q(('delivered_at__isnull', True), ('failed_at__isnull', True)), fields=['next_attempt_at'], name='notification_due_idx'),
                ),
                migrations.AddConstraint(
                    model_name='notification',
                    constraint=models.UniqueConstraint(fields=('alert', 'kind', 'sequence'), name='uniq_notification_state'),
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(relabel_content_types, restore_content_types),
    ]
