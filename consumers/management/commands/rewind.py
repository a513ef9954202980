"""`rewind NAME <mode> [--partition P ...] [--rollback-sink] [--execute] [--json]` — a thin shell over
consumers.operations.rewind. A preview unless --execute, like `kafka-consumer-groups --reset-offsets`.
Exit codes: 0 done, 1 refused (the reason on stderr), 2 usage error."""
import json

from django.core.management.base import CommandError

from consumers.management.cli import TallyCommand, refused
from consumers.operations.errors import Refused
from consumers.operations.rewind import rewind

MODE_OPTIONS = (
    ("--to-earliest", "to-earliest", {"action": "store_true"}, "the log start of each partition"),
    ("--to-latest", "to-latest", {"action": "store_true"}, "the high watermark (skip what is unread)"),
    ("--to-current", "to-current", {"action": "store_true"},
     "stay where it is (re-syncs Kafka's committed offsets with the database)"),
    ("--to-offset", "to-offset", {"metavar": "N"}, "offset N in every chosen partition"),
    ("--to-datetime", "to-datetime", {"metavar": "ISO"},
     "the first record at or after this time, e.g. 2026-11-22T04:00:00Z"),
    ("--by-duration", "by-duration", {"metavar": "ISO8601"},
     "the first record at or after now minus this ISO-8601 duration, e.g. PT10M, P1D"),
    ("--shift-by", "shift-by", {"metavar": "N"}, "move by N records (negative: back)"),
)


def add_mode_arguments(parser):
    modes = parser.add_mutually_exclusive_group(required=True)
    for flag, mode, extra, help_text in MODE_OPTIONS:
        modes.add_argument(flag, dest=mode.replace("-", "_"), help=help_text, **extra)
    parser.add_argument("--partition", type=int, action="append", dest="partitions", metavar="P",
                        help="Only this partition (repeatable); default: all.")


def chosen_mode(options) -> tuple[str, str | None]:
    for _, mode, extra, _ in MODE_OPTIONS:
        value = options.get(mode.replace("-", "_"))
        if extra.get("action") == "store_true":
            if value:
                return mode, None
        elif value is not None:
            return mode, value
    raise CommandError("Choose one mode.", returncode=2)


def print_plan(stdout, data: dict) -> None:
    stdout.write(data["message"])
    stdout.write(f"{'partition':>9} {'current':>10} {'new':>10} {'reprocess':>10} {'skip':>10}")
    for row in data["partitions"]:
        stdout.write(f"{row['partition']:>9} {str(row['current']):>10} {row['new']:>10} {row['reprocess']:>10} "
                     f"{row['skip']:>10}")


class Command(TallyCommand):
    help = ("Move a Tally pipeline's offsets, audited: prints the plan unless --execute. "
            "Exit 0 done, 1 refused, 2 usage error.")

    def add_arguments(self, parser):
        parser.add_argument("name", help="The pipeline's name.")
        add_mode_arguments(parser)
        parser.add_argument("--rollback-sink", action="store_true",
                            help="Delete the sink rows at or beyond each new offset in the same transaction.")
        run = parser.add_mutually_exclusive_group()
        run.add_argument("--execute", action="store_true", help="Apply the plan (default: print it, change nothing).")
        run.add_argument("--dry-run", action="store_true", help="Print the plan and change nothing (the default).")
        parser.add_argument("--json", action="store_true", help="Print the result as JSON.")
        parser.add_argument("--actor", default="cli", help="Who asks (for the action log).")

    def handle(self, *args, name, partitions, rollback_sink, execute, json: bool, actor, **options):
        mode, value = chosen_mode(options)
        try:
            result = rewind(name, mode, value, partitions=partitions, rollback_sink=rollback_sink,
                            dry_run=not execute, actor=actor)
        except Refused as exc:  # Kafka down or refusing a request too (Unavailable), recorded by the operation
            raise refused(str(exc)) from None
        data = result.as_dict()
        if json:
            self.stdout.write(_dumps(data))
        else:
            print_plan(self.stdout, data)
            if not execute:
                self.stdout.write("Preview only: nothing changed. Add --execute to rewind.")


def _dumps(data) -> str:
    return json.dumps(data, indent=2, default=str)
