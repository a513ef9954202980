"""Lists that read a long history newest first, each from the top of an index instead of a sort of the whole table:
the action log's pages and retention's "older than" (262 ms a page with 200,000 entries before), a pipeline's newest
dead letters, and the admin's list of every run. Built concurrently: entries, dead letters and runs keep coming."""
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('consumers', '0026_run_newest_index'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='actionlog',
            index=models.Index(fields=['-created_at'], name='action_created_idx'),
        ),
        AddIndexConcurrently(
            model_name='consumerrun',
            index=models.Index(fields=['-started_at', '-id'], name='run_started_idx'),
        ),
        AddIndexConcurrently(
            model_name='deadletter',
            index=models.Index(fields=['pipeline', '-created_at', '-offset'], name='dead_letter_recent_idx'),
        ),
    ]
