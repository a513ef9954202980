"""Alert models now belong to the alerts app: removed from this app's state only; their tables stay
(the alerts app's 0001 takes them over under the same names)."""
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("dashboard", "0002_default_alert_rules"), ("alerts", "0001_initial")]
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="Notification"),
                migrations.DeleteModel(name="Mute"),
                migrations.DeleteModel(name="Alert"),
                migrations.DeleteModel(name="AlertRule"),
            ],
            database_operations=[],
        ),
    ]
