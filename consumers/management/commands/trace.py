"""`trace PIPELINE (--partition P --offset N | --key K) [--json]` — where one record went: the Kafka record,
the ledger batch that covered it, its sink row(s), or its dead letter, or why there is none.
A thin shell over consumers.reconciliation.trace.
Exit codes: 0 traced, 1 refused (the reason on stderr), 2 usage error."""
import json

from django.core.management.base import CommandError

from consumers.management.cli import TallyCommand, refused
from consumers.models import Pipeline
from consumers.reconciliation import trace as tracing

MAX_KEY_MATCHES = 10


class Command(TallyCommand):
    help = "Trace one record of a pipeline's topic to its sink row(s), dead letter, or why there is none."
    exit_codes = "0 traced, 1 refused (the reason is printed), 2 usage error"

    def add_arguments(self, parser):
        parser.add_argument("pipeline", help="The pipeline's name (its topic and sink table are used).")
        parser.add_argument("--partition", type=int)
        parser.add_argument("--offset", type=int)
        parser.add_argument("--key", help=f"Find the record(s) by key among the newest {tracing.KEY_SCAN_LIMIT:,} "
                                          "of each partition, instead of --partition/--offset.")
        parser.add_argument("--json", action="store_true", help="Print the trace(s) as JSON.")

    def handle(self, *args, pipeline, partition, offset, key, **options):
        if key is None and (partition is None or offset is None):
            raise CommandError("Give --partition and --offset, or --key.", returncode=2)
        if key is not None and (partition is not None or offset is not None):
            raise CommandError("Give --partition and --offset, or --key: not both.", returncode=2)
        found = Pipeline.objects.filter(name=pipeline).first()
        if found is None:
            raise refused(f"no pipeline named {pipeline!r}.")
        try:
            if key is not None:
                records, scanned = tracing.find_by_key(found, key)
                if not records:
                    raise refused(f"no record with key {key!r} among the {scanned:,} newest records "
                                  f"of topic {found.topic!r}.")
                traces = [tracing.trace(found, r.partition, r.offset) for r in records[-MAX_KEY_MATCHES:]]
            else:
                traces = [tracing.trace(found, partition, offset)]
        except tracing.REFUSALS as exc:
            raise refused(str(exc)) from None
        if options["json"]:
            self.stdout.write(json.dumps([t.as_json() for t in traces], indent=2, default=str))
            return
        for t in traces:
            self.stdout.write(describe(t))


def describe(t: tracing.Trace) -> str:
    lines = [f"{t.pipeline}: {t.topic}[{t.partition}] offset {t.offset}: {t.verdict.upper()} — {t.explanation}"]
    if t.record:
        lines.append(f"  Kafka record: key {t.record['key']!r}, value {t.record['value']!r}")
    else:
        lines.append("  Kafka record: none at this offset")
    lines.append(f"  pipeline position: {t.position if t.position is not None else 'not set'}")
    for b in t.batches:
        superseded = " (superseded by a rewind)" if b["superseded"] else ""
        if b.get("compacted"):
            lines.append(f"  ledger batch {b['id']}: compacted, {b['batches']} batches merged into offsets "
                         f"{b['first_offset']}..{b['end_offset'] - 1}, epoch {b['epoch']}, committed "
                         f"{b['first_committed_at']} to {b['committed_at']}{superseded}")
            continue
        lines.append(f"  ledger batch {b['id']}: offsets {b['first_offset']}..{b['end_offset'] - 1}, "
                     f"epoch {b['epoch']}, committed {b['committed_at']}{superseded}")
    for row in t.rows:
        lines.append(f"  sink row: {row}")
    if t.dead_letter:
        lines.append(f"  dead letter: {t.dead_letter['error']}")
    if t.current_row:
        writer = t.current_row
        batches = ", ".join(f"ledger batch {b['id']} (offsets {b['first_offset']}..{b['end_offset'] - 1}, epoch "
                            f"{b['epoch']}, committed {b['committed_at']})" for b in writer["batches"])
        lines.append(f"  current row of its key: written by partition {writer['partition']} offset "
                     f"{writer['offset']}, in {batches or 'no ledger batch'}: {writer['row']}")
    return "\n".join(lines)
