"""A watch's table may be `schema.table` (consumers/engine/table_names.py): 63 + 1 + 63 characters."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('consumers', '0019_watch_findings_from_ranges'),
    ]

    operations = [
        migrations.AlterField(
            model_name='watch',
            name='sink_table',
            field=models.CharField(blank=True, default='', help_text='table or schema.table: the table the group writes.', max_length=127),
        ),
    ]
