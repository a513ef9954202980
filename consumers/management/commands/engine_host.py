"""Host pipeline runs for a Celery worker (started by the worker: consumers/engine/hosts.py)."""
from django.core.management.base import BaseCommand

from consumers.engine import host_process


class Command(BaseCommand):
    help = "Host pipeline runs for the Celery worker that started this process (commands on stdin)."
    requires_system_checks = []

    def handle(self, *args, **options):
        host_process.main()
