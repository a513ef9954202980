"""Watch findings are kept as runs of consecutive offsets (`run_length`). Rows written before stay runs of one,
which the default makes them: PostgreSQL adds a column with a constant default without rewriting the table."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('consumers', '0029_topic_check_indexes'),
    ]

    operations = [
        migrations.AddField(
            model_name='watchfinding',
            name='run_length',
            field=models.BigIntegerField(default=1, help_text='Consecutive offsets from `offset`.'),
        ),
        migrations.AlterField(
            model_name='watchfinding',
            name='extra',
            field=models.BigIntegerField(default=0, help_text='duplicated: the rows beyond those expected, at each offset.'),
        ),
        migrations.AlterField(
            model_name='watchfinding',
            name='offset',
            field=models.BigIntegerField(help_text="The run's first offset."),
        ),
    ]
