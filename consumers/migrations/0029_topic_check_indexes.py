"""The topic checks page (`/topic-checks/`, every pipeline's newest checks or one pipeline's) takes them from the top
of an index instead of sorting every check kept (TALLY_RETAIN_TOPIC_CHECKS_DAYS). Built concurrently: checks may
be requested meanwhile."""
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('consumers', '0028_action_deleted_pipeline_index'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='topiccheckjob',
            index=models.Index(fields=['-created_at'], name='topic_check_created_idx'),
        ),
        AddIndexConcurrently(
            model_name='topiccheckjob',
            index=models.Index(fields=['pipeline', '-created_at'], name='topic_check_pipeline_idx'),
        ),
    ]
