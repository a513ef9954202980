"""Host pipeline runs for a Celery worker (started by the worker: consumers/engine/hosts.py)."""
from django.core.management.base import BaseCommand

from consumers.engine import gc_tuning, host_process


class Command(BaseCommand):
    help = "Host pipeline runs for the Celery worker that started this process (commands on stdin)."
    requires_system_checks = []

    def run_from_argv(self, argv):
        gc_tuning.tune_for_engine()  # a process of its own: its collector is tuned for runs
        super().run_from_argv(argv)

    def handle(self, *args, **options):
        host_process.main()
