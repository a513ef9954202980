"""The delivery audit of a watch: what a consumer Tally does not run lost or duplicated in its own table.

One check (`check_watch`), per partition:
  1. Kafka: the watermarks and the group's committed offset. Each check remembers the committed offsets it
     saw and when (`WatchPartition.commits_seen`); a range is settled up to the newest commit seen at least
     the settle time ago: a consumer that commits before it writes has that long to write (watch_commits).
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
     of them; watch_results) and the mark moves:
     the next check reads only what was committed and settled since.
  5. Lag in records and seconds, and the status by the rules every monitored consumer shares
     (consumers/reconciliation/lag_status.py).
The partitions' rows are locked for the check, so two checks at once never audit a range twice. A group reset
behind the settled mark reopens the ranges from the new committed offset on: they are audited again.
"""
import functools
import logging
from datetime import datetime, timedelta

import psycopg2
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from psycopg2 import sql

from consumers.engine import record_ids, sink_checks, table_names
from consumers.kafka import admin as kafka_admin
from consumers.kafka import ranges as kafka_ranges
from consumers.models import OFFSETS_LISTED, Watch, WatchFinding, WatchPartition
from consumers.operations import actions
from consumers.reconciliation import (
    monitored,
    watch_commits,
    watch_compaction,
    watch_lag,
    watch_match,
    watch_results,
    watch_settled,
)
from consumers.reconciliation.watch_loader import (
    DROP_TEMPORARY,
    FOUND,
    RELATIONS,
    WRITTEN,
    Loader,
    create_temporary_tables,
)
from consumers.reconciliation.watch_results import RangeResult, WatchReport

log = logging.getLogger("tally.watch")

# work_mem of the match's statements: a range of 1,000,000 ids hashes in about 150 MB.
MATCH_WORK_MEM = "256MB"
COMPACTED_NOTE = ("compacted topic (cleanup.policy={policy}): a position without a record may hold a record the "
                  "consumer read before compaction removed it, so rows there are not counted as phantoms")
UNKNOWN_POLICY_NOTE = ("the topic's cleanup.policy could not be read ({reason}; grant DESCRIBE_CONFIGS on the topic): "
                       "a position without a record may be a compacted record, so rows there are not counted as "
                       "phantoms")
POLICY_NOTES = (COMPACTED_NOTE.partition("{")[0], UNKNOWN_POLICY_NOTE.partition("{")[0],
                watch_compaction.COMPACTED_BEFORE_NOTE.partition("{")[0])


class WatchCheckError(RuntimeError):
    pass


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
        if watch_lag.committed_ahead(committed, marks):
            # The group may have read records produced since the marks were read: "past the log end" is believed
            # only of marks read after its commits (a pass's earlier reading included).
            marks = getattr(kafka, "fresh", lambda: kafka)().watermarks(watch.topic)
    except Exception as exc:  # Kafka down or the topic gone: ERR with the reason, nothing moves
        return watch_results.failed(watch, f"Kafka: {type(exc).__name__}: {exc}", now)
    recreated = watch_commits.topic_recreated(watch, marks)
    if recreated:   # its offsets name other records now: nothing is observed, audited or measured
        return watch_results.failed(watch, recreated, now)
    watch_commits.adopt_topic_id(watch, marks)
    notes: list[str] = []
    alive = watch_lag.group_alive(kafka, watch.group_id, notes)
    # Phantoms are judged with offset ids only; whether the topic compacts decides where (watch_compaction).
    compacted = (topic_compacted(kafka, watch.topic, notes)
                 if watch.audits and watch.record_id == record_ids.OFFSET else None)
    try:
        return _check_locked(watch, marks, committed, alive, settle, notes, now, kafka, spark_threshold, compacted)
    except WatchCheckError as exc:  # the transaction rolled back: nothing settled, the reason is stored
        return watch_results.failed(watch, str(exc), now)


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
        rewound = {p for p, wp in parts.items() if watch_commits.observe(wp, committed.get(p), now, keep)}
        if watch.audits:
            # Every check, not only one with records to audit: a dropped table (or one Tally may no longer read) is
            # an ERR until it is back.
            with connection.cursor() as cursor:
                if tables_gone(cursor.cursor, [watch]):
                    raise WatchCheckError(table_problem(cursor.cursor, watch))
            for p in rewound:
                watch_commits.reopen(watch, parts[p], now)
            new_ranges = watch_commits.unread_ranges(parts, marks)
            watch_results.store_ranges(watch, parts, new_ranges, now)   # before planning: they move the settled mark
            watch_compaction.remember(parts, marks, compacted)
            plans = watch_commits.plan_ranges(parts, marks, now - timedelta(seconds=settle))
            if plans:
                phantoms = compacted is False and watch_compaction.holes_judged(parts, plans, notes)
                tails = watch_commits.keyed_tails(parts, marks, plans) if watch.keyed else {}
                settled = watch_settled.settled_marks(parts, marks) if watch.keyed else {}
                audited = _audit(watch, plans, marks, now, spark_threshold, phantoms, tails, settled=settled,
                                 notes=notes)
                watch_results.store_ranges(watch, parts, audited, now)
                new_ranges += audited
        watch_lag.measure(watch, parts, marks, kafka, now, notes)
        notes += watch_lag.ahead_notes(parts)
        watch_lag.evaluate(parts, alive, rewound, now, monitored.window_samples(watch=watch, now=now), watch.created_at)
        for wp in parts.values():
            wp.checked_at = now
            wp.save()
        return watch_results.store_report(watch, parts, new_ranges, notes, now)


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


# Consecutive offsets of one kind (and the same extra rows) are one run: within a run, offset minus its rank is the
# same number (the gaps-and-islands grouping).
STORE_FINDING_RUNS = """
INSERT INTO {} (watch_id, partition, "offset", run_length, kind, extra, checked_at)
SELECT %s, partition, min("offset"), count(*), kind, extra, %s
FROM (SELECT partition, "offset", kind, extra,
             "offset" - row_number() OVER (PARTITION BY partition, kind, extra ORDER BY "offset") AS run
      FROM {}) numbered
GROUP BY partition, kind, extra, run"""

def _audit(watch: Watch, plans: dict, marks: dict, now: datetime, spark_threshold: int | None = None,
           phantoms: bool = True, tails: dict | None = None, *, settled: dict | None = None,
           notes: list | None = None) -> list[RangeResult]:
    """`tails`: keyed, the partitions without a range to settle, read from that offset only to know later records
    (watch_commits.keyed_tails); `settled`: keyed, the positions earlier checks settled
    (watch_settled.settled_marks), of which the records of the ids judged now are read back for the same reason;
    `notes`: the check's notes."""
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
            except watch_settled.ReadBackFailed as exc:
                raise WatchCheckError(str(exc)) from exc
        # Every finding is kept (the export, the trace), a row per run of them; the range lists the first of each kind.
        cur.execute(sql.SQL(STORE_FINDING_RUNS).format(
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
            ranges.append(RangeResult(p, settled, first, note=watch_commits.RETENTION_NOTE))
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
    # A keyed tail reads to the last stable offset: a read_committed reader cannot pass an open transaction.
    reads = {p: (first, marks[p].end if watch.keyed else end) for p, (_, first, end) in plans.items()}
    reads |= {p: (first, marks[p].end) for p, first in tails.items()}
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


def audit_notes(notes: list[str]) -> list[str]:
    """The notes on how the audit judged phantoms (topic_compacted, watch_compaction): a pass that audits nothing
    reads no cleanup.policy, and what the audited ranges show was judged so; it keeps them."""
    return [n for n in notes if n.startswith(POLICY_NOTES)]
