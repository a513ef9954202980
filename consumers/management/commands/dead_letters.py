"""`dead_letters PIPELINE list|export|discard|replay [filters] [--ids 1,2,3 | --all-matching] [--reason TEXT] [--json]`
— a thin shell over consumers.operations.dead_letter_queries (list, export) and consumers.operations.dead_letters
(replay, discard: one audited transaction per call).

Filters: --state (default pending), --error TEXT, --partition P, --offset-from N, --offset-to N (inclusive).
replay and discard act on --ids, or with --all-matching on every dead letter the filters match (exactly what
`list` with the same filters shows; no filter: all pending ones); `--expect N` refuses unless they are N.
Any number of ids: consumers/operations/dead_letter_batches.py gives them to the domain in batches of
MAX_PER_CALL (1,000) in id order, each batch its own audited transaction; a line per batch and the totals are
printed. Every id is checked against the pipeline before the first batch, so an unknown id refuses the whole
set; a batch that fails anyway leaves the batches before it done: the command prints what was done and exits 1.
Refusals are written to the action log.
Exit codes: 0 done, 1 refused (unknown pipeline, ids that are not the pipeline's, no reason to discard, nothing
matching --all-matching, a failed batch; the reason on stderr), 2 usage error."""
import argparse
import csv
import json

from django.core.management.base import CommandError

from consumers.management.cli import TallyCommand, refused
from consumers.models import Pipeline
from consumers.operations import dead_letter_batches as batches
from consumers.operations import dead_letter_queries as queries
from consumers.operations import dead_letters as dead_letter_ops
from consumers.operations.errors import Invalid
from consumers.operations.offset_specs import MAX_OFFSET

ACTIONS = ("list", "export", "discard", "replay")
LIST_LIMIT = 50


def id_list(text: str) -> list[int]:
    """"1,2, 3" -> [1, 2, 3]; anything else is a usage error (exit 2)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"expected dead letter ids separated by commas, e.g. 1,2,3; got {text!r}")
    return [int(part) for part in parts]


def row_limit(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--limit is a whole number from 1, got {text!r}")
    return int(text)


def offset(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_OFFSET:
        raise argparse.ArgumentTypeError(f"an offset is a whole number from 0, got {text!r}")
    return int(text)


class Command(TallyCommand):
    help = ("Browse, export, replay or discard a pipeline's dead letters. "
            "Exit 0 done, 1 refused (the reason on stderr), 2 usage error.")

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
        parser.add_argument("--all-matching", action="store_true",
                            help="replay/discard: every dead letter the filters match (as list shows them; "
                                 "without a filter, all pending ones), in batches of "
                                 f"{dead_letter_ops.MAX_PER_CALL}.")
        parser.add_argument("--expect", type=int, metavar="N",
                            help="With --all-matching: the number of dead letters you expect the filters to match "
                                 "(as list counted them); any other number refuses and changes nothing.")
        parser.add_argument("--reason", default="", help="Why they are discarded (required by discard).")
        parser.add_argument("--from-kafka", action="store_true",
                            help="replay: re-read the records from Kafka instead of the stored copies.")
        parser.add_argument("--limit", type=row_limit, default=LIST_LIMIT,
                            help=f"list: rows shown, in text or --json (default {LIST_LIMIT}; export: every row).")
        parser.add_argument("--json", action="store_true", help="Print JSON.")
        parser.add_argument("--actor", default="cli", help="Who asks (for the action log).")

    def handle(self, *args, pipeline, action, **options):
        if options["partition"] is not None and options["partition"] < 0:
            raise CommandError("--partition is 0 or more.", returncode=2)
        try:
            queries.validate_range(options["offset_from"], options["offset_to"])
        except Invalid as exc:
            raise CommandError(f"--offset-from and --offset-to: {exc.problems['offset_to']}", returncode=2) from None
        if action in ("list", "export"):
            found = Pipeline.objects.filter(name=pipeline).first()
            if found is None:
                raise refused(f"no pipeline named {pipeline!r}.")
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
            self.stdout.write(json.dumps([queries.export_row(row) for row in rows[:options["limit"]]], indent=2))
            return
        total = rows.count()
        self.stdout.write(f"{'id':>8} {'state':<9} {'partition':>9} {'offset':>10}  error / value")
        for row in rows[:options["limit"]]:
            value = queries.text(row["value_bytes"])
            self.stdout.write(f"{row['letter_id']:>8} {row['state']:<9} {row['partition']:>9} {row['offset']:>10}  "
                              f"{row['error_text'][:100]}" + (f"  | {value[:60]!r}" if value is not None else ""))
        shown = min(total, options["limit"])
        self.stdout.write(f"{total} dead letter(s) match" + (f"; {shown} shown (export for all)" if shown < total
                                                             else "") + ".")

    def _export(self, rows, options):
        if options["json"]:
            self.stdout.write(json.dumps([queries.export_row(row) for row in rows.iterator()], indent=2))
            return
        writer = csv.writer(self.stdout, lineterminator="\n")
        writer.writerow(queries.EXPORT_NAMES)
        for row in rows.iterator():
            writer.writerow(queries.csv_row(row))

    def _act(self, name, action, options):
        ids = options["ids"]
        filtered = (options["error"] or options["partition"] is not None or options["offset_from"] is not None
                    or options["offset_to"] is not None)
        if ids is not None and options["all_matching"]:
            raise CommandError(f"{action}: give --ids or --all-matching, not both.", returncode=2)
        if ids is None and not options["all_matching"]:
            hint = (" (add --all-matching to act on every dead letter these filters match)" if filtered else "")
            raise CommandError(f"{action}: give --ids, or --all-matching with the filters of list (--state, "
                               f"--error, --partition, --offset-from, --offset-to){hint}.", returncode=2)
        if options["expect"] is not None and not options["all_matching"]:
            raise CommandError(f"{action}: --expect goes with --all-matching.", returncode=2)
        found = Pipeline.objects.filter(name=name).first()
        kwargs = {"actor": options["actor"], "reason": options["reason"],
                  "source": "kafka" if options["from_kafka"] else "stored",
                  "on_batch": None if options["json"] else self._progress(name, action)}
        if ids is None and found is not None:
            ended = batches.attempt(action, lambda: batches.act_on_matching(
                found, action, self._filters(options, options["state"]), options["expect"], **kwargs))
        else:  # ids, or an unknown pipeline: the domain refuses that name, audited
            ended = batches.attempt(action, lambda: batches.act_on_ids(found or name, action, ids or [], **kwargs))
        if ended.refusal:
            raise refused(str(ended.refusal))
        if ended.stopped:
            self._failed(name, action, ended.stopped, options)
        if ended.failed:
            raise refused(f"{ended.failed[0].lower()}{ended.failed[1:]}")
        outcome = ended.result
        if len(outcome.done) == 1:
            return self._print_one(name, action, outcome.done[0], options)
        if options["json"]:
            self.stdout.write(json.dumps(outcome.as_dict(), indent=2))
            return
        self.stdout.write(f"{name}: {action}: done, {outcome.batches} batch(es), {outcome.ids} dead letter(s): "
                          f"{outcome.totals_text()}")

    def _progress(self, name, action):
        def line(number, total, batch, result):
            if total > 1:
                self.stdout.write(f"{name}: {action}: batch {number}/{total} ({len(batch)} id(s), {batch[0]}.."
                                  f"{batch[-1]}): {result.message} (action log #{result.action_log.pk})")
        return line

    def _failed(self, name, action, outcome, options):
        """A batch after the first failed (it changed nothing): report what the earlier ones did; exit 1."""
        if options["json"]:
            self.stdout.write(json.dumps(outcome.as_dict(), indent=2))
        else:
            self.stdout.write(f"{name}: {action}: stopped after {len(outcome.done)} of {outcome.batches} batch(es); "
                              f"done (committed): {outcome.ids - outcome.untouched} dead letter(s): "
                              f"{outcome.totals_text()}")
        raise refused(outcome.message()) from None

    def _print_one(self, name, action, result, options):
        if options["json"]:
            self.stdout.write(json.dumps(result.as_dict(), indent=2))
            return
        self.stdout.write(f"{name}: {action}: {result.message} (action log #{result.action_log.pk})")
        for outcome in result.outcomes:
            where = f"p{outcome.partition}@{outcome.offset}" if outcome.partition is not None else "-"
            self.stdout.write(f"{outcome.dead_letter_id:>8} {where:>14} {outcome.result}"
                              + (f" ({outcome.rows} row(s))" if outcome.rows else "")
                              + (f": {outcome.error}" if outcome.error else ""))
