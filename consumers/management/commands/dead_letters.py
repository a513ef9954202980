"""`dead_letters PIPELINE list|export|discard|replay [filters] [--ids 1,2,3 | --all-matching] [--reason TEXT] [--json]`
— a thin shell over consumers.operations.dead_letter_queries (list, export) and consumers.operations.dead_letters
(replay, discard: one audited transaction per call).

Filters: --state (default pending), --error TEXT, --partition P, --offset-from N, --offset-to N (inclusive).
replay and discard act on --ids, or with --all-matching on every dead letter the filters match (exactly what
`list` with the same filters shows; no filter: all pending ones). Any number of ids: they go to the domain
function in batches of MAX_PER_CALL (1,000) in id order, each batch its own audited transaction; a line per batch
and the totals are printed. Every id is checked against the pipeline before the first batch, so an unknown id
refuses the whole set; a batch that fails anyway leaves the batches before it done: the command prints what was
done and exits 1.
Exit codes: 0 done, 1 refused (unknown pipeline, ids that are not the pipeline's, no reason to discard, nothing
matching --all-matching, a failed batch; the reason on stderr), 2 usage error."""
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
        parser.add_argument("--all-matching", action="store_true",
                            help="replay/discard: every dead letter the filters match (as list shows them; "
                                 "without a filter, all pending ones), in batches of "
                                 f"{dead_letter_ops.MAX_PER_CALL}.")
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
        filtered = (options["error"] or options["partition"] is not None or options["offset_from"] is not None
                    or options["offset_to"] is not None)
        if ids is not None and options["all_matching"]:
            raise CommandError(f"{action}: give --ids or --all-matching, not both.", returncode=2)
        if ids is None and not options["all_matching"]:
            hint = (" (add --all-matching to act on every dead letter these filters match)" if filtered else "")
            raise CommandError(f"{action}: give --ids, or --all-matching with the filters of list (--state, "
                               f"--error, --partition, --offset-from, --offset-to){hint}.", returncode=2)
        found = Pipeline.objects.filter(name=name).first()
        if ids is None:
            if found is not None:
                matching = queries.dead_letters(found, self._filters(options, options["state"]))
                ids = [row["letter_id"] for row in matching.iterator()]
                if not ids:
                    raise CommandError(f"Refused: no {options['state']} dead letters of pipeline {name!r} match "
                                       f"the filters; nothing was changed.", returncode=1)
            else:
                ids = []  # the domain refuses the unknown name and writes the refusal to the action log
        ids = sorted(set(ids))
        size = dead_letter_ops.MAX_PER_CALL
        batches = [ids[i:i + size] for i in range(0, len(ids), size)] or [[]]
        if len(batches) > 1:
            self._check_all(found, action, ids, options)
        done = []
        for number, batch in enumerate(batches, 1):
            try:
                result = self._call(name, action, batch, options)
            except Exception as exc:
                self._failed(name, action, batches, done, exc, options)
            done.append(result)
            if len(batches) > 1 and not options["json"]:
                self.stdout.write(f"{name}: {action}: batch {number}/{len(batches)} ({len(batch)} id(s), "
                                  f"{batch[0]}..{batch[-1]}): {result.message} (action log #{result.action_log.pk})")
        if len(done) == 1:
            return self._print_one(name, action, done[0], options)
        if options["json"]:
            self.stdout.write(json.dumps(self._combined(name, action, done, len(batches)), indent=2))
            return
        self.stdout.write(f"{name}: {action}: done, {len(done)} batch(es), {len(ids)} dead letter(s): "
                          f"{self._totals_text(action, done)}")

    def _check_all(self, pipeline, action, ids, options):
        """Before the first of several batches: every id must be the pipeline's (else refuse the whole set, audited
        as the domain audits its refusals), and discard needs a reason — so a refusal changes nothing."""
        if pipeline is None:
            return  # the first batch refuses the unknown name
        if action == "discard":
            params = {"ids": [str(i) for i in ids[:dead_letter_ops.MAX_PER_CALL]],
                      "reason": options["reason"].strip()[:dead_letter_ops.MAX_REASON]}
            op = dead_letter_ops.DISCARD
            if not params["reason"]:
                return  # the first batch refuses it
        else:
            params = {"ids": [str(i) for i in ids[:dead_letter_ops.MAX_PER_CALL]],
                      "source": "kafka" if options["from_kafka"] else "stored"}
            op = dead_letter_ops.REPLAY
        params["count"] = len(ids)
        try:
            dead_letter_ops.refuse_unknown(pipeline, op, options["actor"], params, ids)
        except Refused as exc:
            raise CommandError(f"Refused: {exc}", returncode=1) from None

    @staticmethod
    def _call(name, action, ids, options):
        if action == "replay":
            return dead_letter_ops.replay(name, ids, actor=options["actor"],
                                          source="kafka" if options["from_kafka"] else "stored")
        return dead_letter_ops.discard(name, ids, options["reason"], actor=options["actor"])

    def _failed(self, name, action, batches, done, exc, options):
        """A call refused or failed (that call changed nothing): report it, and what earlier batches did; exit 1."""
        if isinstance(exc, Refused):
            reason = str(exc)
        else:  # rolled back and audited as failed
            reason = f"the {action} failed and changed nothing: {type(exc).__name__}: {exc}"
        if len(batches) > 1:
            batch = batches[len(done)]
            reason = f"batch {len(done) + 1}/{len(batches)} ({len(batch)} id(s), {batch[0]}..{batch[-1]}): {reason}"
        if done:
            done_ids = sum(len(b) for b in batches[:len(done)])
            left = sum(len(b) for b in batches[len(done):])
            if options["json"]:
                self.stdout.write(json.dumps({**self._combined(name, action, done, len(batches)), "failed": reason},
                                             indent=2))
            else:
                self.stdout.write(f"{name}: {action}: stopped after {len(done)} of {len(batches)} batch(es); done "
                                  f"(committed): {done_ids} dead letter(s): {self._totals_text(action, done)}")
            reason += (f". Batches 1-{len(done)} ({done_ids} dead letter(s)) were done and stay done; the other "
                       f"{left} were not touched")
        raise CommandError(f"Refused: {reason}", returncode=1) from None

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

    @staticmethod
    def _totals(done) -> dict[str, int]:
        totals: dict[str, int] = {}
        for result in done:
            for key, count in result.counts.items():
                totals[key] = totals.get(key, 0) + count
        return totals

    def _totals_text(self, action, done) -> str:
        totals = self._totals(done)
        return ", ".join(f"{count} {key.replace('_', ' ')}" for key, count in sorted(totals.items())) or "nothing"

    def _combined(self, name, action, done, batches) -> dict:
        """Several calls as one JSON answer: the totals, one entry per batch and every dead letter's outcome."""
        return {"pipeline": name, "action": done[0].action, "batches": batches, "batches_done": len(done),
                "action_ids": [r.action_log.pk for r in done], "counts": self._totals(done),
                "messages": [r.message for r in done],
                "dead_letters": [o.as_dict() for r in done for o in r.outcomes]}
