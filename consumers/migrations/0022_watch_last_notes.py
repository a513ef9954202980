"""A watch keeps its last check's notes (why phantoms are not counted, lag in seconds unknown, ...): the page and
the API's detail show them. Existing watches start with none, until their next check."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('consumers', '0021_watch_range_newest_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='watch',
            name='last_notes',
            field=models.JSONField(blank=True, default=list, help_text='What the last check noted, e.g. why rows at positions without a record are not counted as phantoms.'),
        ),
    ]
