"""`pipeline (start|stop|pause|resume|restart) NAME [--runs N]` — a thin shell over consumers.operations.actions.
Exit codes: 0 done, 1 refused (the reason on stderr), 2 usage error."""
from django.core.management.base import BaseCommand, CommandError

from consumers.operations import actions


class Command(BaseCommand):
    help = "Start, stop, pause, resume or restart a pipeline (audited). Exit 0 done, 1 refused, 2 usage error."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=actions.ACTIONS)
        parser.add_argument("name", help="The pipeline's name.")
        parser.add_argument("--runs", type=int, default=1,
                            help="start/resume/restart: how many runs to enqueue (they share the partitions).")
        parser.add_argument("--actor", default="cli", help="Who asks (for the audit log).")

    def handle(self, *args, action, name, runs, actor, **options):
        try:
            entry = actions.perform(action, name, actor, runs=runs)
        except actions.ActionRefused as exc:
            raise CommandError(f"Refused: {exc}", returncode=1) from None
        self.stdout.write(f"{name}: {entry.message}")
