"""A watch's page and API read its newest ranges (WatchRange.objects.newest()): this index serves that order, so
the read costs the ranges shown, not the watch's history. Built concurrently: a long history is a large table,
and checks keep writing ranges while it builds."""
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('consumers', '0020_watch_sink_table_schema'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='watchrange',
            index=models.Index(fields=['watch', '-checked_at', 'partition', '-start'], name='watch_range_newest_idx'),
        ),
    ]
