"""Ledger summaries for the pages, compaction's columns, and a range index on the ledger (btree_gist lets one
GiST index hold the pipeline and partition beside the offset range; it is a trusted extension since PostgreSQL
13, so the database owner may create it)."""

import django.contrib.postgres.indexes
import django.db.models.deletion
from django.contrib.postgres.operations import BtreeGistExtension
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('consumers', '0006_topic_check_job'),
    ]

    operations = [
        BtreeGistExtension(),
        migrations.CreateModel(
            name='LedgerSummary',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('partition', models.PositiveIntegerField()),
                ('upto_id', models.BigIntegerField(default=0)),
                ('state', models.JSONField(default=dict)),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
        ),
        migrations.AddField(
            model_name='batchledger',
            name='batches',
            field=models.PositiveIntegerField(db_default=1, default=1),
        ),
        migrations.AddField(
            model_name='batchledger',
            name='first_committed_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='batchledger',
            index=django.contrib.postgres.indexes.GistIndex(models.F('pipeline'), models.F('partition'), models.Func(models.F('first_offset'), models.F('end_offset'), models.Value('[]'), function='int8range'), name='ledger_span_idx'),
        ),
        migrations.AddIndex(
            model_name='batchledger',
            index=models.Index(condition=models.Q(('note', ''), _negated=True), fields=['pipeline', 'partition', 'first_offset'], name='ledger_note_idx'),
        ),
        migrations.AddField(
            model_name='ledgersummary',
            name='pipeline',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='ledger_summaries', to='consumers.pipeline'),
        ),
        migrations.AddConstraint(
            model_name='ledgersummary',
            constraint=models.UniqueConstraint(fields=('pipeline', 'partition'), name='uniq_ledger_summary'),
        ),
    ]
