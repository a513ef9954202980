"""The Spark topic-vs-table job is the "topic check" (the operator log is the action log): rename only."""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("consumers", "0005_dead_letter_replays"),
    ]

    operations = [
        migrations.RenameModel(old_name="AuditJob", new_name="TopicCheckJob"),
        migrations.AlterField(
            model_name="topiccheckjob",
            name="pipeline",
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL,
                                    related_name="topic_checks", to="consumers.pipeline"),
        ),
    ]
