"""A watch keeps the id of the topic it audits (KIP-516), so a topic deleted and created again under the same name
is told from the one whose ranges it settled. Existing watches start with none and take their topic's at their
next check."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('consumers', '0022_watch_last_notes'),
    ]

    operations = [
        migrations.AddField(
            model_name='watch',
            name='topic_id',
            field=models.CharField(blank=True, default='', help_text="The topic's id (KIP-516) the watch audits: a topic deleted and created again under its name has another. Empty: the broker gives none (or not seen yet).", max_length=36),
        ),
    ]
