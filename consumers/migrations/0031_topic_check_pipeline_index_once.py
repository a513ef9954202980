"""TopicCheckJob.pipeline loses the index Django gives a foreign key: topic_check_pipeline_idx (0029) leads with the
same column."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('consumers', '0030_watch_finding_runs'),
    ]

    operations = [
        migrations.AlterField(
            model_name='topiccheckjob',
            name='pipeline',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='topic_checks', to='consumers.pipeline'),
        ),
    ]
