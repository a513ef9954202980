"""`watch create|list|show|delete|apply|check` — watches of consumer groups Tally does not run (docs/watch.md).

A thin shell over consumers/operations/watch_setup.py (adding, deleting: the validation every door shares),
consumers/operations/watch_file.py (watches.toml)
and consumers/reconciliation/watch_audit.py (the check). Exit codes: 0 done and clean, 1 findings (lost,
duplicated or phantom records) or a refusal (the reason on stderr), 2 usage error.
"""
from operator import itemgetter

from django.core.management.base import CommandError

from consumers.management.cli import SubcommandsCommand, as_json, not_valid, refused, whole_number
from consumers.models import RANGES_SHOWN, Watch, WatchRange
from consumers.operations import watch_file, watch_setup
from consumers.operations.errors import Refused
from consumers.operations.watch_setup import Invalid, WatchSpec
from consumers.reconciliation import watch_audit, watch_results

# --settle-seconds out of range is a usage error (exit 2), as every malformed option is.
SETTLE_SECONDS = whole_number(0, watch_setup.MAX_SETTLE_SECONDS)
MAX_RANGES_LISTED = 1_000_000   # a bound for --limit: a number past it is a typo, not a watch's history


class Command(SubcommandsCommand):
    help = ("Watch consumer groups Tally does not run: lag, status, and what they lost or duplicated in their "
            "own tables. Exit 0 clean, 1 findings or refused, 2 usage error.")
    exit_codes = "0 done and clean, 1 findings (lost, duplicated or phantom records) or refused, 2 usage error"
    audited_refusals = {"create": "create_watch", "delete": "delete_watch", "apply": "apply_watches"}

    def add_subcommands(self, commands):
        create = self.subcommand(commands, "create", "Watch a group (and audit the table it writes).", json=True)
        create.add_argument("name", help="Lower-case letters, digits, '-' and '_'.")
        create.add_argument("--group", required=True, help="The consumer group to watch.")
        create.add_argument("--topic", required=True, help="The topic the group reads.")
        create.add_argument("--cluster", default="default", help="The Kafka cluster (default: KAFKA_* settings).")
        create.add_argument("--sink-table", default="", help="The table the group writes (for the audit).")
        create.add_argument("--record-id", default="", metavar="value|key|json:PATH|offset",
                            help="What in a record names its row.")
        create.add_argument("--row-id", default="", metavar="COLUMN[,COLUMN]",
                            help="The table's column holding the id (offset: PART_COL,OFFSET_COL).")
        create.add_argument("--from", dest="start_from", default="earliest", metavar="earliest|latest|ISO-DATETIME",
                            help="Where the audit starts (default: the earliest retained offset).")
        create.add_argument("--settle-seconds", type=SETTLE_SECONDS, default=30, metavar="N",
                            help="Audit a committed range once its commit is this old (default 30).")
        create.add_argument("--ignore", action="append", default=[], metavar="SPEC=VALUE",
                            help="Records the consumer skips on purpose, e.g. json:type=heartbeat (repeatable).")
        create.add_argument("--keyed", action="store_true",
                            help="An update stream the consumer upserts: one row per id, for its latest record.")
        self.subcommand(commands, "list", "Every watch with its group, topic, status and lag.", json=True)
        show = self.subcommand(commands, "show", "One watch: settings, partitions and findings of its newest ranges.",
                               "name", json=True)
        show.add_argument("--limit", type=whole_number(1, MAX_RANGES_LISTED), default=RANGES_SHOWN, metavar="N",
                          help=f"List the newest N ranges (default {RANGES_SHOWN}, as the API's watch detail; "
                               "/watches/NAME/findings.csv has every finding).")
        self.subcommand(commands, "delete", "Delete a watch (its group and table are not touched).", "name")
        apply = self.subcommand(commands, "apply", "Create watches from a TOML file ([watches.NAME] tables); "
                                                   "idempotent.", "file")
        apply.add_argument("--dry-run", action="store_true", help="Print what would change; change nothing.")
        check = self.subcommand(commands, "check", "Audit what was committed since the last check; lag, status.",
                                "name", json=True)
        check.add_argument("--settle-seconds", type=SETTLE_SECONDS, default=None, metavar="N",
                           help="This check only: settle commits this old (0: everything committed now).")
        for sub in commands.choices.values():
            sub.add_argument("--actor", default="cli", help="Who asks (for the action log).")

    def do_create(self, *, name, group, topic, cluster, sink_table, record_id, row_id, start_from, settle_seconds,
                  ignore, keyed, actor, json: bool, **options):
        spec = WatchSpec(name=name, group=group, topic=topic, cluster=cluster, sink_table=sink_table,
                         record_id=record_id, row_id=row_id, start_from=start_from, settle_seconds=settle_seconds,
                         ignore=ignore, keyed=keyed)
        try:
            watch, notes = watch_setup.create(spec, actor)
        except Invalid as exc:
            raise not_valid("watch", exc.problems) from None
        for note in notes:
            self.stderr.write(f"Note: {note}")
        if json:
            self.stdout.write(as_json(as_dict(watch)))
            return
        audit = f", auditing {watch.sink_table} by {watch.record_id}" if watch.audits else " (lag and status only)"
        self.stdout.write(f"Created watch {name} of group {watch.group_id} on {watch.topic}{audit}. "
                          f"Check it with: manage.py watch check {name}")

    def do_list(self, *, json: bool, **options):
        self.write_list([as_dict(w) for w in Watch.objects.order_by("name")], json=json, columns=[
            ("NAME", "<24", itemgetter("name")), ("STATUS", "<7", itemgetter("status")),
            ("GROUP", "<24", itemgetter("group")), ("TOPIC", "<24", itemgetter("topic")),
            ("LAG", ">10", lambda row: "" if row["lag_records"] is None else str(row["lag_records"])),
            ("TABLE", "", lambda row: row["sink_table"] or "-")])

    def do_show(self, *, name, limit: int, json: bool, **options):
        watch = _watch(name)
        data = as_dict(watch)
        data["partitions"] = [watch_results.partition_json(wp) for wp in watch.partitions.order_by("partition")]
        ranges = WatchRange.objects.filter(watch=watch)
        newest = sorted(ranges.newest()[:limit],
                        key=lambda r: (r.partition, r.start))
        data["ranges"] = [range_json(r) for r in newest]
        if len(newest) == limit and (total := ranges.count()) > limit:
            self.stderr.write(f"Note: the newest {limit} of {total} ranges; --limit N for more.")
        if json:
            self.stdout.write(as_json(data))
            return
        for key, value in data.items():
            if key not in ("partitions", "ranges"):
                self.stdout.write(f"{key + ':':<16} {value}")
        for part in data["partitions"]:
            self.stdout.write(f"partition {part['partition']}: committed {part['committed']}, settled to "
                              f"{part['settled_offset']}, lag {part['lag_records']}, {part['status']}; checked "
                              f"{part['checked']}, lost {part['lost']}, duplicated {part['duplicated']}, "
                              f"phantom {part['phantom']}")
        for r in data["ranges"]:
            found = ", ".join(f"{k} {r[k]}" for k in ("lost", "duplicated", "phantom") if r[k]) or "clean"
            self.stdout.write(f"  [{r['partition']}] {r['start']}..{r['end'] - 1}: {r['records']} records, {found}"
                              + (f" ({r['note']})" if r["note"] else ""))

    def do_delete(self, *, name, actor, **options):
        self.delete_named(watch_setup.delete, name=name, actor=actor,
                          done=f"Deleted watch {name}; the group and its table are untouched.")

    def do_apply(self, *, file, dry_run, actor, **options):
        self.apply_file(watch_file.apply, file=file, actor=actor, dry_run=dry_run)

    def do_check(self, *, name, settle_seconds, json: bool, actor, **options):
        watch = _watch(name)
        try:
            report = watch_audit.check_now(watch, actor=actor, settle_seconds=settle_seconds)
        except Refused as exc:  # its cluster is no longer configured: audited by the check
            raise refused(str(exc)) from None
        if json:
            self.stdout.write(as_json(report.as_json()))
        else:
            lag = "unknown" if report.lag_records is None else f"{report.lag_records} records"
            if report.lag_seconds is not None:
                lag += f", {report.lag_seconds:.1f} s"
            self.stdout.write(f"{watch.name}: {report.status}; checked {report.checked} records; lost {report.lost}, "
                              f"duplicated {report.duplicated}, phantom {report.phantom}; lag {lag}")
            for kind, offsets in (("lost", report.lost_offsets), ("duplicated", report.duplicated_offsets)):
                if offsets:
                    shown = ", ".join(f"{o['partition']}:{o['offset']}" for o in offsets[:20])
                    self.stdout.write(f"  {kind}: {shown}{' ...' if len(offsets) > 20 else ''}")
            for note in report.notes:
                self.stdout.write(f"  note: {note}")
        if report.error:
            raise refused(f"watch {name}: {report.error}")
        if not report.clean:
            raise CommandError(f"watch {name}: {report.lost} lost, {report.duplicated} duplicated, "
                               f"{report.phantom} phantom", returncode=1)


def _watch(name: str) -> Watch:
    watch = Watch.objects.filter(name=name).first()
    if watch is None:
        raise refused(f"No watch named {name!r}.")
    return watch


def as_dict(watch: Watch) -> dict:
    return {"name": watch.name, **watch_setup.describe(watch), "status": watch.reported_status,
            "lag_records": watch.lag_records, "lag_seconds": watch.lag_seconds,
            "checked_at": watch.checked_at.isoformat() if watch.checked_at else None, "last_error": watch.last_error}


def range_json(r: WatchRange) -> dict:
    return {"partition": r.partition, "start": r.start, "end": r.end, "records": r.records, "ignored": r.ignored,
            "superseded": r.superseded, "unreadable": r.unreadable, "lost": r.lost, "duplicated": r.duplicated,
            "phantom": r.phantom, "lost_offsets": r.lost_offsets, "duplicated_offsets": r.duplicated_offsets,
            "phantom_offsets": r.phantom_offsets, "note": r.note, "checked_at": r.checked_at.isoformat()}
