"""`dead_letters PIPELINE list|export|discard|replay [filters] [--ids 1,2,3] [--reason TEXT] [--json]` — a thin
shell over consumers.operations.dead_letter_queries (list, export) and consumers.operations.dead_letters (replay,
discard: one audited transaction each).

Filters: --state (default pending), --error TEXT, --partition P, --offset-from N, --offset-to N (inclusive).
replay and discard act on --ids, or else on the pending dead letters the filters match (at least one filter).
Exit codes: 0 done, 1 refused (unknown pipeline, ids that are not the pipeline's, no reason to discard; the reason
on stderr), 2 usage error."""
import argparse
import csv
import json

from django.core.management.base import BaseCommand, CommandError

from consumers.models import Pipeline
from consumers.operations import dead_letter_queries as queries
from consumers.operations import dead_letters as dead_letter_ops
from consumers.operations.offset_specs import Refused

ACTIONS = ("list", "export", "discard", "replay")
LIST_LIMIT = 50


def id_list(text: str) -> list[int]:
    """"1,2, 3" -> [1, 2, 3]; anything else is a usage error (exit 2)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"expected dead letter ids separated by commas, e.g. 1,2,3; got {text!r}")
    return [int(part) for part in parts]


def offset(text: str) -> int:
    if not text.isdigit() or int(text) > queries.MAX_OFFSET:
        raise argparse.ArgumentTypeError(f"an offset is a whole number from 0, got {text!r}")
    return int(text)


class Command(BaseCommand):
    help = ("Browse, export, replay or discard a pipeline's dead letters. "
            "Exit 0 done, 1 refused (the reason on stderr), 2 usage error.")

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.epilog = "Exit codes: 0 done, 1 refused (the reason is printed), 2 usage error."
        return parser

    def add_arguments(self, parser):
        parser.add_argument("pipeline", help="The pipeline's name.")
        parser.add_argument("action", choices=ACTIONS,
                            help="list (a table), export (CSV, or JSON with --json), replay or discard.")
        parser.add_argument("--state", choices=queries.STATES, default=queries.PENDING,
                            help="Which dead letters to list or export (default: pending).")
        parser.add_argument("--error", default="", help="Only those whose error contains this text (any case).")
        parser.add_argument("--partition", type=int, help="Only this partition.")
        parser.add_argument("--offset-from", type=offset, metavar="N", help="Only offsets N and above.")
        parser.add_argument("--offset-to", type=offset, metavar="N", help="Only offsets N and below.")
        parser.add_argument("--ids", type=id_list, metavar="1,2,3",
                            help="The dead letters to replay or discard (or to list/export).")
        parser.add_argument("--reason", default="", help="Why they are discarded (required by discard).")
        parser.add_argument("--from-kafka", action="store_true",
                            help="replay: re-read the records from Kafka instead of the stored copies.")
        parser.add_argument("--limit", type=int, default=LIST_LIMIT, help=f"list: rows shown (default {LIST_LIMIT}).")
        parser.add_argument("--json", action="store_true", help="Print JSON.")
        parser.add_argument("--actor", default="cli", help="Who asks (for the action log).")

    def handle(self, *args, pipeline, action, **options):
        if options["partition"] is not None and options["partition"] < 0:
            raise CommandError("--partition is 0 or more.", returncode=2)
        if (options["offset_from"] is not None and options["offset_to"] is not None
                and options["offset_from"] > options["offset_to"]):
            raise CommandError("--offset-from is above --offset-to.", returncode=2)
        if action in ("list", "export"):
            found = Pipeline.objects.filter(name=pipeline).first()
            if found is None:
                raise CommandError(f"Refused: no pipeline named {pipeline!r}.", returncode=1)
            rows = queries.dead_letters(found, self._filters(options, options["state"]))
            return self._list(rows, options) if action == "list" else self._export(rows, options)
        return self._act(pipeline, action, options)

    @staticmethod
    def _filters(options, state, ids=()) -> queries.Filters:
        return queries.Filters(error=options["error"], partition=options["partition"],
                               offset_from=options["offset_from"], offset_to=options["offset_to"], state=state,
                               ids=tuple(ids or options["ids"] or ()))

    def _list(self, rows, options):
        if options["json"]:
            self.stdout.write(json.dumps([queries.export_row(row) for row in rows], indent=2))
            return
        total = rows.count()
        self.stdout.write(f"{'id':>8} {'state':<9} {'partition':>9} {'offset':>10}  error / value")
        for row in rows[:max(options["limit"], 0)]:
            value = queries.text(row["value_bytes"])
            self.stdout.write(f"{row['letter_id']:>8} {row['state']:<9} {row['partition']:>9} {row['offset']:>10}  "
                              f"{row['error_text'][:100]}" + (f"  | {value[:60]!r}" if value is not None else ""))
        shown = min(total, max(options["limit"], 0))
        self.stdout.write(f"{total} dead letter(s) match" + (f"; {shown} shown (export for all)" if shown < total
                                                             else "") + ".")

    def _export(self, rows, options):
        if options["json"]:
            self.stdout.write(json.dumps([queries.export_row(row) for row in rows.iterator()], indent=2))
            return
        writer = csv.writer(self.stdout, lineterminator="\n")
        writer.writerow(queries.EXPORT_NAMES)
        for row in rows.iterator():
            writer.writerow(["" if v is None else v for v in queries.export_row(row).values()])

    def _act(self, name, action, options):
        ids = options["ids"]
        if ids is None:
            if not (options["error"] or options["partition"] is not None or options["offset_from"] is not None
                    or options["offset_to"] is not None):
                raise CommandError(f"{action}: give --ids, or a filter (--error, --partition, --offset-from, "
                                   f"--offset-to) to {action} the pending dead letters it matches.", returncode=2)
            found = Pipeline.objects.filter(name=name).first()
            # Unknown names go on to the domain, which refuses them and writes the refusal to the action log.
            matching = queries.dead_letters(found, self._filters(options, queries.PENDING)) if found else None
            ids = [] if matching is None else [row["letter_id"] for row in matching]
        try:
            if action == "replay":
                result = dead_letter_ops.replay(name, ids, actor=options["actor"],
                                                source="kafka" if options["from_kafka"] else "stored")
            else:
                result = dead_letter_ops.discard(name, ids, options["reason"], actor=options["actor"])
        except Refused as exc:
            raise CommandError(f"Refused: {exc}", returncode=1) from None
        except Exception as exc:  # rolled back and audited as failed
            raise CommandError(f"Refused: the {action} failed and changed nothing: {type(exc).__name__}: {exc}",
                               returncode=1) from None
        if options["json"]:
            self.stdout.write(json.dumps(result.as_dict(), indent=2))
            return
        self.stdout.write(f"{name}: {action}: {result.message} (action log #{result.action_log.pk})")
        for outcome in result.outcomes:
            where = f"p{outcome.partition}@{outcome.offset}" if outcome.partition is not None else "-"
            self.stdout.write(f"{outcome.dead_letter_id:>8} {where:>14} {outcome.result}"
                              + (f" ({outcome.rows} row(s))" if outcome.rows else "")
                              + (f": {outcome.error}" if outcome.error else ""))
