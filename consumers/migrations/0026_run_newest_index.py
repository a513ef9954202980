"""A pipeline's runs newest first: retention asks "is this its pipeline's newest run?" of every candidate, and the
pipeline page lists the newest runs; this index answers both with one probe instead of a sort of the pipeline's runs.
Built concurrently: runs keep starting and heartbeating while it builds."""
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('consumers', '0025_watch_compacted_positions'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='consumerrun',
            index=models.Index(fields=['pipeline', '-started_at', '-id'], name='run_newest_idx'),
        ),
    ]
