from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "alerts"
    verbose_name = "Tally alerts"

    def ready(self):
        from alerts import signals  # noqa: F401  (registers the receivers)
