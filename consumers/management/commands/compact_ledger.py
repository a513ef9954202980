"""`manage.py compact_ledger [--max-seconds N] [--json]`: merge old, verified, contiguous ledger rows now (Celery beat
does it every TALLY_COMPACTION_INTERVAL_SECONDS). `--crash-at compaction-mid-step@N` kills the process inside the
N-th merge (tests prove a killed step leaves the ledger as it was)."""
import json

from django.core.management.base import CommandError

from consumers.engine.faults import FaultInjector
from consumers.management.cli import TallyCommand
from consumers.reconciliation import compaction


class Command(TallyCommand):
    help = "Compact the batch ledger: merge old, verified, contiguous rows of each partition."
    exit_codes = "0 done, 1 refused, 2 usage error"

    def add_arguments(self, parser):
        parser.add_argument("--max-seconds", type=float, default=None, help="Stop after this long (default: done).")
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
        parser.add_argument("--crash-at", default="", help="Fault injection, e.g. compaction-mid-step@2.")

    def handle(self, *args, max_seconds=None, crash_at="", **options):
        if max_seconds is not None and not max_seconds > 0:   # `not >` also refuses nan
            raise CommandError("--max-seconds must be more than 0.")
        try:
            faults = FaultInjector.parse(crash_at)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        report = compaction.compact_all(max_seconds=max_seconds, faults=faults)
        if options["json"]:
            self.stdout.write(json.dumps(report.as_json()))
        else:
            self.stdout.write(f"{report.rows_merged} ledger rows merged into {report.runs} in {report.steps} steps"
                              + (" (time budget reached: more to do)" if report.unfinished else ""))
