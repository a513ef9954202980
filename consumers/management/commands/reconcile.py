"""`manage.py reconcile [NAME] [--json] [--full]`: verify pipelines and print the report.

Exit code 0 when every reconciled pipeline is exact, 1 when loss, duplication, a phantom row, a ledger
gap or overlap, or unrecoverable records were found (dead letters are accounted for: exact)."""
import json
import sys

from consumers.management.cli import TallyCommand, refused
from consumers.models import Pipeline
from consumers.reconciliation import reconcile


class Command(TallyCommand):
    help = "Reconcile pipelines: lost, duplicated and phantom records, ledger gaps, lag. Exit 1 if not exact."
    exit_codes = "0 exact, 1 not exact (loss, duplication, phantom rows, gaps or overlaps) or refused, 2 usage error"

    def add_arguments(self, parser):
        parser.add_argument("name", nargs="?", help="Pipeline name (default: every pipeline).")
        parser.add_argument("--json", action="store_true", help="Print the JSON report.")
        parser.add_argument("--full", action="store_true",
                            help="Re-verify everything, not only what is new since the last run.")

    def handle(self, *args, name=None, full=False, **options):
        if name:
            pipeline = Pipeline.objects.filter(name=name).first()
            if pipeline is None:
                raise refused(f"No pipeline named {name!r}.")
            reports = [reconcile.reconcile_pipeline(pipeline, full=full)]
        else:
            reports = reconcile.reconcile_all(full=full)
        if options["json"]:
            self.stdout.write(_dumps(reconcile.report_json(reports)))
        else:
            for report in reports:
                self.stdout.write(_describe(report))
        if not all(r.exact for r in reports):
            sys.exit(1)


def _dumps(data) -> str:
    return json.dumps(data, indent=2, default=str)


def _describe(report) -> str:
    lines = [f"{report.name} [{report.delivery_mode}] {report.status}: lost {report.lost}, duplicated "
             f"{report.duplicated}, phantom {report.phantom}, dead-lettered {report.dead_lettered}, lag "
             f"{_fmt(report.lag_records)} records / {_fmt(report.lag_seconds, '.1f')} s"]
    if report.kafka_error:
        lines.append(f"  Kafka: {report.kafka_error}")
    if report.sink_error:
        lines.append(f"  Sink: {report.sink_error}")
    for p in report.partitions:
        lines.append(f"  partition {p.partition}: {p.status} log start {_fmt(p.log_start)}, high watermark "
                     f"{_fmt(p.high_watermark)}, next offset {_fmt(p.next_offset)}, Kafka committed "
                     f"{_fmt(p.kafka_committed)}, lag {_fmt(p.lag_records)}")
        for f in p.findings:
            if f.kind != "dead_letter":
                lines.append(f"    {f.kind}: offsets {f.start}..{f.end - 1} ({f.count} records)")
    return "\n".join(lines)


def _fmt(value, spec="") -> str:
    return "-" if value is None else format(value, spec)
