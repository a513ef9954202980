"""The delivery audit of a watch: what a consumer Tally does not run lost or duplicated in its own table.

One check (`check_watch`), per partition:
  1. Kafka: the watermarks and the group's committed offset. Each check remembers the committed offsets it
     saw and when (`WatchPartition.commits_seen`); a range is settled up to the newest commit seen at least
     the settle time ago: a consumer that commits before it writes has that long to write.
  2. The new settled range [settled_offset, settled end) is read from the topic, read_committed: holes
     (transaction markers, aborted records) are positions without a record, never lost. Records beyond the
     committed offset are lag, never read as settled. Keyed watches also read the unsettled tail up to the
     log end, and read back what earlier checks settled of the ids they judge (watch_settled), only to know
     which ids a later record replaces.
  3. Each record's id goes into a temporary table (COPY), and one set-based statement matches them with the
     team's table (consumers/reconciliation/watch_match.py, the one definition of the matching). A check of
     at least WATCH_SPARK_THRESHOLD records runs the same statements on Spark executors instead
     (consumers/reconciliation/watch_spark.py), ids derived by the same function (record_ids.derive), unless
     the row-id column is citext, char(n) or of a nondeterministic collation ('a' = 'A'): Spark compares text
     by its bytes.
  4. The range's findings are stored (`WatchRange`, the first 1,000 offsets of each kind; `WatchFinding`, all
     of them) and the mark moves:
     the next check reads only what was committed and settled since.
  5. Lag in records and seconds, and the status by the rules every monitored consumer shares
     (consumers/reconciliation/lag_status.py).
The partitions' rows are locked for the check, so two checks at once never audit a range twice. A group reset
behind the settled mark reopens the ranges from the new committed offset on: they are audited again.
"""
import functools
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import psycopg2
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from psycopg2 import sql

from consumers.engine import record_ids, sink_checks, table_names
from consumers.kafka import admin as kafka_admin
from consumers.kafka import ranges as kafka_ranges
from consumers.models import OFFSETS_LISTED, Status, Watch, WatchFinding, WatchPartition, WatchRange, error_text
from consumers.operations import actions
from consumers.reconciliation import monitored, watch_compaction, watch_lag, watch_match, watch_settled
from consumers.reconciliation.watch_loader import (
    DROP_TEMPORARY,
    FOUND,
    RELATIONS,
    WRITTEN,
    Loader,
    create_temporary_tables,
)

log = logging.getLogger("tally.watch")

# work_mem of the match's statements: a range of 1,000,000 ids hashes in about 150 MB.
MATCH_WORK_MEM = "256MB"
RETENTION_NOTE = "removed by retention before the audit read them: not audited"
# Positions the log start passed while the group's committed offset was below them: the consumer never read them.
DELETED_UNREAD_NOTE = "deleted by retention before the group read them: never delivered"
COMPACTED_NOTE = ("compacted topic (cleanup.policy={policy}): a position without a record may hold a record the "
                  "consumer read before compaction removed it, so rows there are not counted as phantoms")
UNKNOWN_POLICY_NOTE = ("the topic's cleanup.policy could not be read ({reason}; grant DESCRIBE_CONFIGS on the topic): "
                       "a position without a record may be a compacted record, so rows there are not counted as "
                       "phantoms")
POLICY_NOTES = (COMPACTED_NOTE.partition("{")[0], UNKNOWN_POLICY_NOTE.partition("{")[0],
                watch_compaction.COMPACTED_BEFORE_NOTE.partition("{")[0])


class WatchCheckError(RuntimeError):
    pass


@dataclass
class RangeResult:
    partition: int
    start: int
    end: int
    records: int = 0
    ignored: int = 0
    superseded: int = 0
    unreadable: int = 0
    lost: int = 0
    duplicated: int = 0
    phantom: int = 0
    lost_offsets: list = field(default_factory=list)
    duplicated_offsets: list = field(default_factory=list)   # [[offset, extra rows], ...]
    phantom_offsets: list = field(default_factory=list)
    note: str = ""

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.phantom or self.note)


@dataclass
class WatchReport:
    watch: str
    status: str
    checked: int
    lost: int
    duplicated: int
    phantom: int
    lag_records: int | None
    lag_seconds: float | None
    lost_offsets: list
    duplicated_offsets: list
    partitions: list = field(default_factory=list)
    new_ranges: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    error: str = ""

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.phantom or self.error)

    def as_json(self) -> dict:
        """What `watch check --json` prints: these fields, exactly (the API's check answers them too). `error` is why
        the check failed (null when it did not): the command exits 1 then, and a script reading the JSON needs it."""
        return {"lost": self.lost, "duplicated": self.duplicated, "phantom": self.phantom, "checked": self.checked,
                "lag": {"records": self.lag_records, "seconds": self.lag_seconds}, "status": self.status,
                "lost_offsets": self.lost_offsets, "duplicated_offsets": self.duplicated_offsets,
                "notes": list(self.notes), "error": self.error or None}


def check_all(*, kafka=None, now: datetime | None = None) -> list[WatchReport]:
    """Every watch, in one pass that reads Kafka and the database in bulk (consumers/reconciliation/watch_pass.py)."""
    from consumers.reconciliation import watch_pass

    return watch_pass.check_all(kafka=kafka, now=now)


CHECK = "check_watch"   # the action log's name of an operator's check (its refusals: a check itself is a read)


def check_now(watch: Watch, *, actor: str = "cli", settle_seconds: int | None = None) -> WatchReport:
    """An operator's check (the API, `watch check`). A watch whose cluster is no longer configured (or whose settings
    are wrong) is refused up front naming the cluster (Refused, audited), its stored state unchanged, as start and
    rewind are: the check would only store an ERR, and waiting would not help. The periodic pass (check_all) still
    records the problem on the watch: that is monitoring, not an operator's request."""
    if problem := actions.cluster_problem(watch):
        actions.refuse(None, CHECK, actor, {"watch": watch.name, "cluster": watch.cluster},
                       f"Cannot check watch {watch.name!r}: {problem}. Nothing was changed.")
    return check_watch(watch, settle_seconds=settle_seconds)


def check_watch(watch: Watch, *, settle_seconds: int | None = None, now: datetime | None = None,
                kafka=None, spark_threshold: int | None = None) -> WatchReport:
    """Audit what was committed and settled since the last check, measure lag and status, store it all.
    `kafka` is the Kafka admin calls (the watch's cluster's by default; a stand-in in tests; a pass over every
    watch hands its reading of the cluster, pass_kafka.PassKafka).
    `spark_threshold`: records from which the check matches on Spark (default: WATCH_SPARK_THRESHOLD)."""
    kafka = kafka or kafka_admin.on(watch.cluster)
    now = now or timezone.now()
    settle = watch.settle_seconds if settle_seconds is None else settle_seconds
    try:
        marks = kafka.watermarks(watch.topic)
        committed = kafka.committed_offsets(watch.group_id, watch.topic, sorted(marks))
    except Exception as exc:  # Kafka down or the topic gone: ERR with the reason, nothing moves
        return _failed(watch, f"Kafka: {type(exc).__name__}: {exc}", now)
    recreated = topic_recreated(watch, marks)
    if recreated:   # its offsets name other records now: nothing is observed, audited or measured
        return _failed(watch, recreated, now)
    adopt_topic_id(watch, marks)
    notes: list[str] = []
    alive = watch_lag.group_alive(kafka, watch.group_id, notes)
    # Phantoms are judged with offset ids only; whether the topic compacts decides where (watch_compaction).
    compacted = (topic_compacted(kafka, watch.topic, notes)
                 if watch.audits and watch.record_id == record_ids.OFFSET else None)
    try:
        return _check_locked(watch, marks, committed, alive, settle, notes, now, kafka, spark_threshold, compacted)
    except WatchCheckError as exc:  # the transaction rolled back: nothing settled, the reason is stored
        return _failed(watch, str(exc), now)


def _check_locked(watch: Watch, marks: dict, committed: dict, alive: bool, settle: int, notes: list,
                  now: datetime, kafka, spark_threshold: int | None = None, compacted: bool | None = None
                  ) -> WatchReport:
    new_ranges: list[RangeResult] = []
    with transaction.atomic():
        Watch.objects.select_for_update().filter(pk=watch.pk).first()
        parts = {wp.partition: wp for wp in WatchPartition.objects.select_for_update().filter(watch=watch)}
        for p, mark in marks.items():
            if p not in parts:  # a partition added to the topic since: all of it is new
                parts[p] = WatchPartition.objects.create(watch=watch, partition=p, start_offset=mark.log_start,
                                                         settled_offset=mark.log_start)
        keep = max(settle, watch.settle_seconds)
        rewound = {p for p, wp in parts.items() if observe(wp, committed.get(p), now, keep)}
        if watch.audits:
            # Every check, not only one with records to audit: a dropped table (or one Tally may no longer read) is
            # an ERR until it is back.
            with connection.cursor() as cursor:
                if tables_gone(cursor.cursor, [watch]):
                    raise WatchCheckError(table_problem(cursor.cursor, watch))
            for p in rewound:
                _reopen(watch, parts[p], now)
            new_ranges = unread_ranges(parts, marks)
            _store_ranges(watch, parts, new_ranges, now)   # before planning: they move the settled mark
            watch_compaction.remember(parts, marks, compacted)
            plans = plan_ranges(parts, marks, now - timedelta(seconds=settle))
            if plans:
                phantoms = compacted is False and watch_compaction.holes_judged(parts, plans, notes)
                tails = keyed_tails(parts, marks, plans) if watch.keyed else {}
                settled = watch_settled.settled_marks(parts, marks) if watch.keyed else {}
                audited = _audit(watch, plans, marks, now, spark_threshold, phantoms, tails, settled=settled,
                                 notes=notes)
                _store_ranges(watch, parts, audited, now)
                new_ranges += audited
        watch_lag.measure(watch, parts, marks, kafka, now, notes)
        watch_lag.evaluate(parts, alive, rewound, now, monitored.window_samples(watch=watch, now=now), watch.created_at)
        for wp in parts.values():
            wp.checked_at = now
            wp.save()
        return _summarise(watch, parts, new_ranges, notes, now)


def topic_recreated(watch: Watch, marks: dict) -> str:
    """Why the topic is no longer the one the watch audited, or "": deleted and created again under its name (another
    topic id), its offsets start again from 0, so the settled marks and ranges are the old topic's. Auditing on would
    take the new topic's records from the old mark on for the rest of the old one (and a group reset for a rewind):
    the watch says so instead, until it is created again."""
    now_id = kafka_admin.topic_id_of(marks)
    if not (watch.topic_id and now_id) or now_id == watch.topic_id:
        return ""
    return (f"topic {watch.topic!r} was deleted and created again (its id was {watch.topic_id}, it is {now_id}): its "
            "offsets start again, and what this watch audited was the old topic's records; delete the watch and "
            "create it again to audit the new topic")


def adopt_topic_id(watch: Watch, marks: dict) -> None:
    """A watch that has no topic id yet (created before watches kept one, or on a broker that gave none) takes the
    one Kafka gives now."""
    now_id = kafka_admin.topic_id_of(marks)
    if now_id and not watch.topic_id:
        Watch.objects.filter(pk=watch.pk, topic_id="").update(topic_id=now_id)
        watch.topic_id = now_id


# --- commits and settling --------------------------------------------------------------------------------

def observe(wp: WatchPartition, committed: int | None, now: datetime, keep_seconds: int) -> bool:
    """Remember the committed offset seen now; True when it went back (the group's offsets were reset). A group
    whose offsets were gone at the last check (deleted, or expired) went back when it commits behind the last
    commit seen: it reads those records again."""
    seen = list(wp.commits_seen or [])
    previous = wp.committed if wp.committed is not None else (seen[-1][0] if seen else None)
    went_back = committed is not None and previous is not None and committed < previous
    if committed is not None and (not seen or seen[-1][0] != committed):
        seen.append([committed, now.isoformat()])
    if committed != wp.committed:
        wp.moved_at = now
    wp.committed = committed
    # Keep what a later check may still need: the commits of the settle window and the newest one before it.
    horizon = now - timedelta(seconds=keep_seconds)
    while len(seen) > 1 and parse_datetime(seen[1][1]) <= horizon:
        seen.pop(0)
    wp.commits_seen = seen
    return went_back


def _reopen(watch: Watch, wp: WatchPartition, now: datetime) -> None:
    """The group's offsets went back behind what was settled: the consumer reads those records again (and may
    write them again), so the settled ranges from the one holding the new committed offset on are dropped,
    with their findings and counts, and audited afresh once the reset commit has settled. Commits seen past the
    reset commit settle nothing: the consumer has yet to read those records again."""
    if wp.committed is None:
        return
    wp.commits_seen = [seen for seen in wp.commits_seen or [] if seen[0] <= wp.committed]
    if wp.committed >= wp.settled_offset:
        return
    ranges = WatchRange.objects.filter(watch=watch, partition=wp.partition)
    holding = ranges.filter(end__gt=wp.committed).order_by("start").first()
    restart = max(wp.start_offset, holding.start if holding is not None else wp.committed)
    dropped = list(ranges.filter(start__gte=restart))
    for r in dropped:
        wp.checked -= r.records
        wp.lost -= r.lost
        wp.duplicated -= r.duplicated
        wp.phantom -= r.phantom
    WatchRange.objects.filter(pk__in=[r.pk for r in dropped]).delete()
    WatchFinding.objects.filter(watch=watch, partition=wp.partition, offset__gte=restart).delete()
    wp.settled_offset = restart
    wp.commits_seen = [[wp.committed, now.isoformat()]]   # the re-read range settles from the reset on
    log.info("watch %s partition %s: offsets reset to %s; re-auditing from %s", watch.name, wp.partition,
             wp.committed, restart)


def _settled_end(wp: WatchPartition, cutoff: datetime) -> int | None:
    """The newest commit seen at or before `cutoff` (None: none is that old yet)."""
    settled = None
    for offset, seen_at in wp.commits_seen or []:
        if parse_datetime(seen_at) <= cutoff:
            settled = offset
    return settled


def plan_ranges(parts: dict, marks: dict, cutoff: datetime) -> dict[int, tuple[int, int, int]]:
    """{partition: (settled_offset, first readable offset, settled end)} of the partitions with a new range."""
    plans = {}
    for p, wp in parts.items():
        mark, end = marks.get(p), _settled_end(wp, cutoff)
        if mark is None or end is None:
            continue
        end = min(end, mark.high)   # a commit past the log end (topic recreated): nothing there to read
        if end > wp.settled_offset:
            plans[p] = (wp.settled_offset, min(max(wp.settled_offset, mark.log_start), end), end)
    return plans


def keyed_tails(parts: dict, marks: dict, plans: dict) -> dict[int, int]:
    """{partition: first unsettled offset} of the partitions with no range to settle now. A keyed watch reads their
    unsettled records too, as it reads the planned partitions' tails: a key the producer wrote into two partitions
    has its latest record in the one whose commit has not settled yet, and judging the older record would report a
    row the consumer rightly replaced or deleted as lost."""
    return {p: max(wp.settled_offset, marks[p].log_start) for p, wp in parts.items()
            if p in marks and p not in plans and marks[p].high > max(wp.settled_offset, marks[p].log_start)}


def unread_ranges(parts: dict, marks: dict) -> list["RangeResult"]:
    """The ranges the log start passed while the group's committed offset was below it: the part the group had
    committed (read) the audit can no longer judge; the rest the group never read, nor ever will."""
    ranges = []
    for p, wp in sorted(parts.items()):
        mark = marks.get(p)
        if mark is None or wp.committed is None or wp.committed >= mark.log_start \
                or wp.settled_offset >= mark.log_start:
            continue
        read_to = max(wp.settled_offset, wp.committed)
        if read_to > wp.settled_offset:
            ranges.append(RangeResult(p, wp.settled_offset, read_to, note=RETENTION_NOTE))
        ranges.append(RangeResult(p, read_to, mark.log_start, note=DELETED_UNREAD_NOTE))
    return ranges


# --- the audit of the new ranges -------------------------------------------------------------------------

def _load(cur, watch: Watch, id_type: str | None, reads: dict, ends: dict, relation=None,
          after_flush=None) -> Loader:
    """Reads `reads` ({partition: (start, end)}) from the topic into `relation` (`records` by default), a COPY
    chunk at a time. Kafka failing fails the check (WatchCheckError)."""
    loader = Loader(cur, watch, id_type, ends, relation, after_flush)
    try:
        kafka_ranges.read_ranges(watch.topic, reads, loader.add, cluster=watch.cluster)
    except Exception as exc:
        raise WatchCheckError(f"Kafka: reading {watch.topic}: {type(exc).__name__}: {exc}") from exc
    loader.flush()
    return loader


def _audit(watch: Watch, plans: dict, marks: dict, now: datetime, spark_threshold: int | None = None,
           phantoms: bool = True, tails: dict | None = None, *, settled: dict | None = None,
           notes: list | None = None) -> list[RangeResult]:
    """`tails`: keyed, the partitions without a range to settle, read from that offset only to know later records
    (keyed_tails); `settled`: keyed, the positions earlier checks settled (watch_settled.settled_marks), of which
    the records of the ids judged now are read back for the same reason; `notes`: the check's notes."""
    tails, settled, notes = tails or {}, settled or {}, notes if notes is not None else []
    by_offset = watch.record_id == record_ids.OFFSET
    columns = watch.row_columns
    with connection.cursor() as wrapper:
        cur = wrapper.cursor
        types = sink_checks.table_columns(cur, table_names.split(watch.sink_table))
        if types is None or any(c not in types for c in columns):
            raise WatchCheckError(table_gone_message(watch))
        id_type = None if by_offset else types[columns[0]]["type"]
        create_temporary_tables(cur, id_type, plans)
        if _on_spark(plans, spark_threshold) and spark_compares_ids(cur, watch, id_type):
            counts_of, superseded = _match_on_spark(watch, cur, plans, marks, id_type, phantoms, tails, settled,
                                                    notes)
        else:
            try:
                counts_of, superseded = _match_in_postgresql(watch, cur, plans, marks, id_type, by_offset, columns,
                                                             phantoms, tails, settled, notes)
            except psycopg2.Error as exc:  # the table changed under the watch (a column's type, the grant): ERR
                raise WatchCheckError(f"table {watch.sink_table!r} could not be audited: {type(exc).__name__}: "
                                      f"{exc.diag.message_primary or exc}") from exc
        # Every finding is kept (the export, the trace); the range lists the first of each kind.
        cur.execute(sql.SQL('INSERT INTO {} (watch_id, partition, "offset", kind, extra, checked_at) '
                            'SELECT %s, partition, "offset", kind, extra, %s FROM {}').format(
            sql.Identifier(WatchFinding._meta.db_table), RELATIONS["found"]), [watch.pk, now])
        cur.execute(sql.SQL("SELECT partition, kind, count(*), sum(extra), "
                            "(array_agg(\"offset\" ORDER BY \"offset\"))[1:%s], "
                            "(array_agg(extra ORDER BY \"offset\"))[1:%s] FROM {} GROUP BY partition, kind"
                            ).format(RELATIONS["found"]), [OFFSETS_LISTED, OFFSETS_LISTED])
        found = cur.fetchall()
        cur.execute(DROP_TEMPORARY)
    results = {}
    for p, (_, first, end) in sorted(plans.items()):
        counts = counts_of.get(p, {})
        results[p] = RangeResult(p, first, end, counts.get("records", 0), counts.get("ignored", 0),
                                 superseded.get(p, 0), counts.get("unreadable", 0))
    for p, kind, count, extra, offsets, extras in found:
        result = results[p]
        if kind == "lost":
            result.lost, result.lost_offsets = count, list(offsets)
        elif kind == "duplicated":
            result.duplicated = int(extra)
            result.duplicated_offsets = [list(x) for x in zip(offsets, extras, strict=True)]
        else:
            result.phantom, result.phantom_offsets = count, list(offsets)
    ranges = []
    for p, (settled, first, end) in sorted(plans.items()):
        if first > settled:  # the log start passed the mark: those records are gone unaudited
            ranges.append(RangeResult(p, settled, first, note=RETENTION_NOTE))
        if end > first:
            ranges.append(results[p])
    return ranges


def topic_compacted(kafka, topic: str, notes: list) -> bool | None:
    """Whether the topic compacts now (None: its policy could not be read). A row at a position without a record
    is a phantom (offset ids) only where it never compacted (watch_compaction). Not on a compacted topic: a consumer
    that read a record before compaction removed it rightly has a row there, and reading the topic cannot tell a
    compacted record from a transaction marker. A policy that cannot be read (no DESCRIBE_CONFIGS ACL) judges no
    hole either: a finding is a claim the audit can prove, and a false phantom would be an ERR, stored for good,
    on every compacted topic of a secured cluster. The note says which of the two it was."""
    try:
        policy = kafka.cleanup_policy(topic)
    except Exception as exc:  # noqa: BLE001 - the audit goes on; only the phantoms are not judged
        notes.append(UNKNOWN_POLICY_NOTE.format(reason=type(exc).__name__))
        return None
    if "compact" in policy.replace(" ", "").split(","):
        notes.append(COMPACTED_NOTE.format(policy=policy))
        return True
    return False


def table_gone_message(watch: Watch) -> str:
    return f"table {watch.sink_table!r} or its column(s) {watch.row_id} no longer exist"


def table_problem(cursor, watch: Watch) -> str:
    """Why a watch tables_gone named cannot audit its table: gone, or no longer readable by the database user."""
    table = table_names.split(watch.sink_table)
    columns = sink_checks.table_columns(cursor, table)
    if columns is None or any(c not in columns for c in watch.row_columns):
        return table_gone_message(watch)
    return sink_checks.read_refused(watch.sink_table)


def tables_gone(cursor, watches) -> set[int]:
    """The ids of the auditing watches among `watches` whose table, or a column of its row id, no longer
    exists, or whose table the database user may no longer read (its SELECT revoked): one query for them all (a
    beat pass asks it of every quiet watch)."""
    auditing = [w for w in watches if w.audits]
    if not auditing:
        return set()
    cursor.execute(
        "SELECT w.id FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS w(id, relation, columns) "
        "WHERE to_regclass(w.relation) IS NULL"
        " OR NOT has_table_privilege(current_user, to_regclass(w.relation), 'SELECT') OR EXISTS ("
        "  SELECT 1 FROM unnest(string_to_array(w.columns, ',')) AS c(name) WHERE NOT EXISTS ("
        "    SELECT 1 FROM pg_attribute a WHERE a.attrelid = to_regclass(w.relation) AND a.attname = c.name"
        "    AND a.attnum > 0 AND NOT a.attisdropped))",
        [[w.pk for w in auditing], [sink_checks.quoted(cursor, table_names.split(w.sink_table)) for w in auditing],
         [",".join(w.row_columns) for w in auditing]])
    return {row[0] for row in cursor.fetchall()}


def _on_spark(plans: dict, threshold: int | None) -> bool:
    """Whether this check's settled ranges, together, hold at least `threshold` records (the setting
    WATCH_SPARK_THRESHOLD unless a check names its own; 0: never)."""
    threshold = settings.WATCH_SPARK_THRESHOLD if threshold is None else threshold
    return threshold > 0 and sum(end - first for _, first, end in plans.values()) >= threshold


def spark_compares_ids(cur, watch: Watch, id_type: str | None) -> bool:
    """Whether Spark holds the watch's ids equal as PostgreSQL does: not for a row-id column of type citext or of a
    nondeterministic collation, where 'Ann' names the row 'ann' in PostgreSQL but no row on Spark, which compares
    text bytes; nor of type char(n), whose equality ignores trailing blanks (Spark reads the rows padded)."""
    if id_type is None:
        return True
    if record_ids.column_type(id_type) in ("citext", "bpchar"):
        log.info("watch %s: matching in PostgreSQL: %s is %s", watch.name, watch.row_columns[0], id_type)
        return False
    cur.execute("SELECT c.collisdeterministic FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation "
                "WHERE a.attrelid = %s::regclass AND a.attname = %s",
                [sink_checks.quoted(cur, table_names.split(watch.sink_table)), watch.row_columns[0]])
    found = cur.fetchone()
    if found is None or found[0]:
        return True
    log.info("watch %s: matching in PostgreSQL: the collation of %s is nondeterministic", watch.name,
             watch.row_columns[0])
    return False


def _match_in_postgresql(watch: Watch, cur, plans: dict, marks: dict, id_type: str | None, by_offset: bool,
                         columns: list[str], phantoms: bool = True, tails: dict | None = None,
                         settled: dict | None = None, notes: list | None = None) -> tuple[dict, dict]:
    """Record ids COPYed into the temporary table and matched in one statement; the findings in `found`."""
    tails = tails or {}
    ends = {p: end for p, (_, _, end) in plans.items()} | tails   # a tail's records are all beyond its end
    reads = {p: (first, marks[p].high if watch.keyed else end) for p, (_, first, end) in plans.items()}
    reads |= {p: (first, marks[p].high) for p, first in tails.items()}
    loader = _load(cur, watch, id_type, reads, ends)
    if settled and not by_offset:
        watch_settled.read_back(cur, watch, settled, notes if notes is not None else [], RELATIONS,
                                functools.partial(_load, cur, watch, id_type))
    if loader.keys:
        _name_tombstones(cur, loader.counts)
    # The match hashes whole ranges: memory for them rather than spills to disk, and no JIT compilation
    # (a fixed 0.1-0.3 s on statements that are all scans and hashes). SET LOCAL: this check only.
    cur.execute("SET LOCAL work_mem = %s; SET LOCAL jit = off", [MATCH_WORK_MEM])
    cur.execute(sql.SQL("ANALYZE {}").format(RELATIONS["records"]))
    table = table_names.split(watch.sink_table)
    if watch_match.needs_written(by_offset, watch.keyed):
        cur.execute(sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS {}").format(
            sql.Identifier(WRITTEN), watch_match.written_sql(table, columns, by_offset, RELATIONS)))
        cur.execute(sql.SQL("ANALYZE {}").format(RELATIONS["written"]))
    findings = watch_match.findings_sql(table, columns, by_offset, watch.keyed, RELATIONS, phantoms=phantoms)
    cur.execute(sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS {}").format(sql.Identifier(FOUND), findings))
    superseded = {}
    if watch.keyed:
        cur.execute(watch_match.superseded_sql(RELATIONS))
        superseded = dict(cur.fetchall())
    return loader.counts, superseded


def _name_tombstones(cur, counts: dict) -> None:
    """Keyed, ids read from the value: each tombstone takes the id of its key's latest readable record before it
    (watch_match.TOMBSTONE_IDS); those of the settled range are no longer unreadable."""
    cur.execute(sql.SQL('UPDATE {records} r SET rid = t.rid FROM ({ids}) t '
                        'WHERE r.partition = t.partition AND r."offset" = t."offset" RETURNING r.partition, r.tail')
                .format(records=RELATIONS["records"], ids=watch_match.tombstone_ids_sql(RELATIONS)))
    for partition, tail in cur.fetchall():
        if not tail:
            counts[partition]["unreadable"] -= 1


def _match_on_spark(watch: Watch, cur, plans: dict, marks: dict, id_type: str | None, phantoms: bool = True,
                    tails: dict | None = None, settled: dict | None = None, notes: list | None = None
                    ) -> tuple[dict, dict]:
    """The same match on Spark executors (consumers/reconciliation/watch_spark.py); the findings in `found`."""
    from consumers.reconciliation import watch_spark

    cur.execute(sql.SQL('CREATE TEMP TABLE {} (partition integer, "offset" bigint, kind text, extra bigint) '
                        "ON COMMIT DROP").format(sql.Identifier(FOUND)))
    log.info("watch %s: matching %s records on Spark", watch.name,
             sum(end - first for _, first, end in plans.values()))
    try:
        return watch_spark.match(watch, cur, plans, marks, id_type, RELATIONS["found"], phantoms=phantoms,
                                 tails=tails, settled=settled, notes=notes)
    except WatchCheckError:
        raise
    except Exception as exc:  # Spark, JDBC or Kafka: the check fails with the reason's kind, nothing settles
        log.exception("watch %s: the audit on Spark failed", watch.name)
        raise WatchCheckError(f"Spark: the audit of {watch.topic} failed ({type(exc).__name__}); "
                              "the details are in the log") from exc


# --- storing, status --------------------------------------------------------------------------------

def _store_ranges(watch: Watch, parts: dict, new_ranges: list[RangeResult], now: datetime) -> None:
    """One WatchRange per new range; a clean range that continues the previous clean one extends it (a
    watch checked every 30 s would otherwise keep thousands of identical rows a day)."""
    for result in new_ranges:
        wp = parts[result.partition]
        wp.settled_offset = max(wp.settled_offset, result.end)
        wp.checked += result.records
        wp.lost += result.lost
        wp.duplicated += result.duplicated
        wp.phantom += result.phantom
        last = WatchRange.objects.filter(watch=watch, partition=result.partition).order_by("-start").first()
        if result.clean and last is not None and last.end == result.start and not last.findings and not last.note:
            WatchRange.objects.filter(pk=last.pk).update(
                end=result.end, records=last.records + result.records, ignored=last.ignored + result.ignored,
                superseded=last.superseded + result.superseded, unreadable=last.unreadable + result.unreadable,
                checked_at=now)
            continue
        WatchRange.objects.create(
            watch=watch, partition=result.partition, start=result.start, end=result.end, records=result.records,
            ignored=result.ignored, superseded=result.superseded, unreadable=result.unreadable, lost=result.lost,
            duplicated=result.duplicated, phantom=result.phantom, lost_offsets=result.lost_offsets,
            duplicated_offsets=result.duplicated_offsets, phantom_offsets=result.phantom_offsets, note=result.note,
            checked_at=now)


def _summarise(watch: Watch, parts: dict, new_ranges: list, notes: list, now: datetime) -> WatchReport:
    summarise(watch, parts.values(), now, notes)
    Watch.objects.filter(pk=watch.pk).update(status=watch.status, lag_records=watch.lag_records,
                                             lag_seconds=watch.lag_seconds, checked_at=now, last_error="",
                                             last_notes=notes)
    return report_of(watch, parts.values(), listed_offsets(watch), new_ranges, notes)


def summarise(watch: Watch, rows, now: datetime, notes: list[str]) -> None:
    """The watch's status (its worst partition's), lag in records (their sum) and in seconds (their most), and
    the check's notes, set on `watch` (not saved)."""
    lags = [wp.lag_records for wp in rows if wp.lag_records is not None]
    ages = [wp.lag_seconds for wp in rows if wp.lag_seconds is not None]
    watch.status = monitored.worst(wp.status for wp in rows)
    watch.lag_records, watch.lag_seconds = sum(lags) if lags else None, max(ages) if ages else None
    watch.checked_at, watch.last_error, watch.last_notes = now, "", list(notes)


def audit_notes(notes: list[str]) -> list[str]:
    """The notes on how the audit judged phantoms (topic_compacted, watch_compaction): a pass that audits nothing
    reads no cleanup.policy, and what the audited ranges show was judged so; it keeps them."""
    return [n for n in notes if n.startswith(POLICY_NOTES)]


def report_of(watch: Watch, rows, listed: tuple[list, list], new_ranges: list, notes: list) -> WatchReport:
    """The report of a check that stored its findings: `watch` and `rows` as stored, `listed` its listed_offsets."""
    rows = sorted(rows, key=lambda wp: wp.partition)
    lost, duplicated = listed
    return WatchReport(
        watch.name, watch.status, sum(wp.checked for wp in rows), sum(wp.lost for wp in rows),
        sum(wp.duplicated for wp in rows), sum(wp.phantom for wp in rows), watch.lag_records, watch.lag_seconds,
        lost, duplicated, partitions=[partition_json(wp) for wp in rows], new_ranges=new_ranges, notes=notes)


def listed_offsets(watch: Watch, limit: int = OFFSETS_LISTED, ranges=None) -> tuple[list, list]:
    """The first `limit` lost and duplicated records of the watch, as {partition, offset}, in offset order.
    `ranges`: the watch's ranges with findings in that order, when a pass read them for many watches at once."""
    lost, duplicated = [], []
    if ranges is None:
        ranges = WatchRange.objects.filter(watch=watch).exclude(lost=0, duplicated=0).order_by("partition", "start")
    for r in ranges:
        lost += [{"partition": r.partition, "offset": o} for o in r.lost_offsets[: limit - len(lost)]]
        duplicated += [{"partition": r.partition, "offset": o}
                       for o, _ in r.duplicated_offsets[: limit - len(duplicated)]]
    return lost, duplicated


def partition_json(wp: WatchPartition) -> dict:
    return {"partition": wp.partition, "start_offset": wp.start_offset, "settled_offset": wp.settled_offset,
            "committed": wp.committed, "log_start": wp.log_start, "high_watermark": wp.high_watermark,
            "lag_records": wp.lag_records, "lag_seconds": wp.lag_seconds, "checked": wp.checked, "lost": wp.lost,
            "duplicated": wp.duplicated, "phantom": wp.phantom, "status": wp.reported_status}


def _failed(watch: Watch, reason: str, now: datetime) -> WatchReport:
    log.warning("watch %s: %s", watch.name, reason)
    Watch.objects.filter(pk=watch.pk).update(status=Status.ERR, checked_at=now, last_error=error_text(reason))
    WatchPartition.objects.filter(watch=watch).update(status=Status.ERR, checked_at=now)
    watch.refresh_from_db()
    rows = list(WatchPartition.objects.filter(watch=watch).order_by("partition"))
    lost, duplicated = listed_offsets(watch)
    return WatchReport(watch.name, Status.ERR, sum(wp.checked for wp in rows), sum(wp.lost for wp in rows),
                       sum(wp.duplicated for wp in rows), sum(wp.phantom for wp in rows), watch.lag_records,
                       watch.lag_seconds, lost, duplicated, partitions=[partition_json(wp) for wp in rows],
                       error=reason)
