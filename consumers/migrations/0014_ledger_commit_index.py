"""An index on the ledger's (pipeline, id): the rows of one pipeline committed since a row id (the ledger summary's
fold, reconciliation's new rows) without walking the other pipelines' rows on the primary key. It replaces the
foreign key's own index on pipeline_id, which it (and ledger_range_idx) lead with; created first, so lookups by
pipeline always have an index."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('consumers', '0013_cluster_status'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='batchledger',
            index=models.Index(fields=['pipeline', 'id'], name='ledger_commit_idx'),
        ),
        migrations.AlterField(
            model_name='batchledger',
            name='pipeline',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='ledger', to='consumers.pipeline'),
        ),
    ]
