from django.apps import AppConfig


class ConsumersConfig(AppConfig):
    name = "consumers"
    verbose_name = "Consumers and pipelines"
