"""The commit protocol: the one place where a batch becomes durable. Every engine calls it.

Steps of `commit_batch`, in ONE PostgreSQL transaction:
  1. Lock the pipeline row (FOR SHARE) and check the writer's epoch: an older epoch is fenced.
  2. Lock the partitions' offset rows (FOR UPDATE, in partition order so writers never deadlock).
  3. Exactly-once: refuse a batch fetched from above `next_offset` (a gap); skip records below it (a
     replay). Continuity is judged on the consumer's positions (`Fetch`), never on record offsets: real
     logs have holes (transaction markers, aborted and compacted records). The classic modes write what
     they were given, as the classic consumers do.
  4. Transform each record; a rejected record becomes a dead letter (or stops the batch, by policy).
  5. COPY the sink rows under a savepoint, deferred constraints checked then, not at COMMIT (the values a
     transform takes verbatim go straight to COPY text; an upsert pipeline writes through
     consumers/engine/upsert.py instead, and deletes its tombstones' keys). If PostgreSQL
     refuses the DATA (SQLSTATE class 22: a number too big for its column, a NUL character, ...), roll back
     to the savepoint and bisect the batch to find the poison records (consumers/engine/poison.py); they
     become dead letters with the database's error text (or stop the batch, by policy) and the other rows
     are written. Any other database error (missing table, permission, disk full) refuses the whole batch
     as SinkError. Then insert dead letters and one ledger row per partition.
  6. Set `next_offset` = the consumer's position after the poll (past any trailing hole); the ledger row
     keeps [first offset, that position) and the count of records actually present.
  7. COMMIT.
The engine commits the same offsets to Kafka only afterwards; that commit is advisory (for lag tools).
Fault points `mid-write` and `after-write` sit inside the transaction (see consumers/engine/faults.py).
"""
import io
from dataclasses import dataclass, field

import psycopg2
from psycopg2 import sql
from psycopg2.extras import execute_values

from consumers.engine import poison, sinks, upsert
from consumers.engine.faults import NO_FAULTS, FaultInjector
from consumers.engine.tables import BATCH_LEDGER, DEAD_LETTER, PARTITION_OFFSET, PIPELINE
from consumers.engine.transforms import BadRecord, SourceRecord, Transform, as_source_records, for_pipeline
from consumers.pg_text import exception_text

# The protocol's statements, composed once: a batch only renders them.
_CREATE_POSITIONS = sql.SQL("INSERT INTO {} (pipeline_id, partition, next_offset, updated_at) VALUES %s "
                            "ON CONFLICT (pipeline_id, partition) DO NOTHING").format(PARTITION_OFFSET)
_READ_POSITIONS = sql.SQL("SELECT partition, next_offset FROM {} WHERE pipeline_id = %s").format(PARTITION_OFFSET)
_LOCK_POSITIONS = sql.SQL("SELECT partition, next_offset, replay_until FROM {} "
                          "WHERE pipeline_id = %s AND partition = ANY(%s) ORDER BY partition FOR UPDATE"
                          ).format(PARTITION_OFFSET)
_SHARE_PIPELINE = sql.SQL("SELECT epoch FROM {} WHERE id = %s FOR SHARE").format(PIPELINE)
_INSERT_DEAD_LETTERS = sql.SQL('INSERT INTO {} (pipeline_id, partition, "offset", key, value, error, created_at) '
                               "VALUES %s ON CONFLICT DO NOTHING").format(DEAD_LETTER)
_INSERT_LEDGER = sql.SQL("INSERT INTO {} (pipeline_id, partition, first_offset, end_offset, records, rows_written, "
                         "dead_letters, epoch, committed_at) VALUES %s").format(BATCH_LEDGER)
# GREATEST: the classic modes may replay below the DB position; the position never moves back here.
_ADVANCE_POSITIONS = sql.SQL("UPDATE {} AS o SET next_offset = GREATEST(o.next_offset, v.end_offset), "
                             "replay_until = CASE WHEN o.replay_until <= v.end_offset THEN NULL "
                             "ELSE o.replay_until END, updated_at = now() "
                             "FROM (VALUES %s) AS v(pipeline_id, partition, end_offset) "
                             "WHERE o.pipeline_id = v.pipeline_id AND o.partition = v.partition"
                             ).format(PARTITION_OFFSET)


class CommitRefused(Exception):
    """The batch was not written; nothing changed. `reason` names the refusal (a run's end reason where it
    is one: consumers/engine/lifecycle.py)."""

    reason = "refused"


class Fenced(CommitRefused):
    """The writer's epoch is older than the pipeline's: a restart or rewind happened."""

    reason = "fenced"


class Gap(CommitRefused):
    """Exactly-once: the batch starts above the stored next_offset; writing it would lose records."""

    reason = "gap"


class Fetch:
    """Where one partition's records of a poll came from: the consumer's position before the poll
    (`start`, where it was seeked or where the previous poll ended) and after it (`end`). Records lie in
    [start, end), possibly with holes; a poll that crossed only a hole has no record and still moves."""

    __slots__ = ("start", "end")

    def __init__(self, start: int, end: int):
        if end < start:
            raise ValueError(f"a fetch cannot end ({end}) before it starts ({start})")
        self.start, self.end = start, end

    def __repr__(self):
        return f"Fetch({self.start}, {self.end})"

    @classmethod
    def of_records(cls, records: list[SourceRecord]) -> "Fetch":
        """For callers that only have records (tests, replays): first offset to last offset + 1."""
        return cls(records[0].offset, records[-1].offset + 1)


class StopOnBadRecord(CommitRefused):
    """The pipeline's policy is to stop on a record the transform or the database rejects."""

    reason = "bad_record"


class SinkError(CommitRefused):
    """The database refused the batch for a reason that is not the data (a missing table, permission
    denied, disk full): writing it again will fail again, so the run must end and someone must look."""

    reason = "sink_error"


@dataclass(frozen=True)
class Target:
    """Where and how a pipeline writes; built once per run from the Pipeline row."""

    pipeline_id: int
    topic: str
    sink_table: str
    transform: Transform
    exactly_once: bool
    stop_on_bad_record: bool = False
    upsert_key: tuple[str, ...] = ()   # one row per key, written in place (consumers/engine/upsert.py)
    delete_on_tombstone: bool = False  # upsert: a record with a null value deletes its key's row

    @classmethod
    def for_pipeline(cls, pipeline) -> "Target":
        from consumers.models import BadRecordPolicy

        return cls(pipeline_id=pipeline.pk, topic=pipeline.topic, sink_table=pipeline.sink_table,
                   transform=for_pipeline(pipeline), exactly_once=pipeline.is_exactly_once,
                   stop_on_bad_record=pipeline.on_bad_record == BadRecordPolicy.STOP,
                   upsert_key=tuple(pipeline.upsert_key or ()), delete_on_tombstone=pipeline.delete_on_tombstone)


@dataclass(frozen=True)
class PartitionOutcome:
    partition: int
    first_offset: int
    end_offset: int     # exclusive: the consumer's position after the batch, the partition's new next_offset
    records: int        # records present in [first_offset, end_offset): holes are not records
    rows_written: int
    dead_letters: int
    skipped: int        # replayed records below next_offset (exactly-once only)


def ensure_positions(conn, pipeline_id: int, initial: dict[int, int]) -> dict[int, int]:
    """Create offset rows that do not exist yet with `initial[partition]` and return every partition's
    stored next_offset. Committed in its own short transaction."""
    with conn.cursor() as cur:
        if initial:
            execute_values(cur, _CREATE_POSITIONS,
                           [(pipeline_id, p, o) for p, o in initial.items()], template="(%s, %s, %s, now())")
        cur.execute(_READ_POSITIONS, [pipeline_id])
        positions = dict(cur.fetchall())
    conn.commit()
    return positions


def stored_positions(conn, pipeline_id: int) -> dict[int, int]:
    with conn.cursor() as cur:
        cur.execute(_READ_POSITIONS, [pipeline_id])
        positions = dict(cur.fetchall())
    conn.rollback()
    return positions


def commit_batch(conn, target: Target, epoch: int, batches: dict[int, list[SourceRecord]],
                 faults: FaultInjector = NO_FAULTS, fetches: dict[int, Fetch] | None = None) -> list[PartitionOutcome]:
    """Write one poll's records (per partition, each list in offset order) in one transaction.

    `fetches` gives each partition's positions before and after the poll (a partition may have a fetch
    and no record: the poll crossed a hole). Without it, positions are inferred from the records.
    Returns one outcome per partition that had records or moved. Raises CommitRefused (rolled back) when
    the writer is fenced, the batch has a gap, a bad record meets the stop policy (StopOnBadRecord), or the
    database refuses the batch for a reason that is not its data (SinkError); a transient database error
    (poison.is_transient: a lost connection, a deadlock) is raised as it is, rolled back.
    """
    fetches = dict(fetches or {})
    for p, records in batches.items():
        if records and p not in fetches:
            fetches[p] = Fetch.of_records(records)
    partitions = sorted(p for p, fetch in fetches.items() if batches.get(p) or fetch.end > fetch.start)
    if not partitions:
        return []
    batches = {p: batches.get(p) or [] for p in partitions}
    try:
        with conn.cursor() as cur:
            check_epoch(cur, target.pipeline_id, epoch)
            positions, replay_until = _lock_positions(cur, target, partitions, fetches)
            plans = [_plan_partition(target, p, batches[p], fetches[p], positions.get(p)) for p in partitions]
            plans = [plan for plan in plans if plan.records or plan.end > plan.first]
            # The classic modes keep replay_until only for rewinds to count from: they write their replays again.
            replaying = target.exactly_once and any(replay_until.get(plan.partition) is not None and plan.records
                            and plan.records[0].offset < replay_until[plan.partition] for plan in plans)
            rows, dead = _transform(target, plans, verbatim=not replaying)
            deletes = every_delete = [d for plan in plans for d in plan.deletes]
            every_row = rows
            if target.upsert_key:  # the last record per key wins (consumers/engine/upsert.py)
                rows, deletes = _last_per_key(cur, target, rows, deletes)
            # A sink's DEFERRABLE INITIALLY DEFERRED foreign or unique key would be checked at COMMIT, past the poison
            # search, refusing the whole batch for one record: checked at each write, it refuses that record's.
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
            _write_verbatim(cur, target, plans, rows, dead, faults)
            _write_rows_or_dead_letter(cur, target, plans, rows, dead, faults, replaying)
            if deletes:
                _delete_or_dead_letter(cur, target, plans, deletes, dead)
            if target.upsert_key and dead:
                _apply_the_latest_records_of_refused_keys(cur, target, plans, every_row, every_delete, rows, deletes,
                                                          dead, replaying)
            if dead:
                execute_values(cur, _INSERT_DEAD_LETTERS, [(target.pipeline_id, *d) for d in dead],
                               template="(%s, %s, %s, %s, %s, %s, now())")
            outcomes = [plan.outcome() for plan in plans]
            _write_ledger_and_positions(cur, target, epoch, outcomes)
            faults.maybe_crash("after-write")
        conn.commit()
    except psycopg2.Error as exc:
        conn.rollback()
        if poison.is_transient(exc):
            raise
        raise SinkError(f"the database refused the batch: {poison.describe(exc)}") from exc
    except BaseException:
        conn.rollback()
        raise
    # Partitions whose records were all replays still report where they stand.
    skipped_only = [PartitionOutcome(p, positions[p], positions[p], 0, 0, 0, len(batches[p]))
                    for p in partitions if p not in {plan.partition for plan in plans}]
    return outcomes + skipped_only


def _last_per_key(cur, target: Target, rows: list[tuple], deletes: list) -> tuple[list[tuple], list]:
    """Upsert: the rows and deletes of each key's last record, keys being equal as PostgreSQL says."""
    indexes = upsert.key_indexes(target.transform, target.upsert_key)
    keys = [tuple(row[i] for i in indexes) for row in rows] + [delete.key for delete in deletes]
    same = upsert.same_keys(cur, upsert.key_types(target.transform, target.upsert_key), keys)
    return upsert.last_per_key(rows, deletes, indexes, same)


def check_epoch(cur, pipeline_id: int, epoch: int) -> None:
    """Inside a writing transaction: raise Fenced unless the pipeline is still at `epoch` (its row held
    FOR SHARE until the transaction ends)."""
    # FOR SHARE: concurrent batches proceed together; a restart's epoch bump waits for them, and a batch
    # that starts after the bump sees the new epoch. So no write of an old epoch lands after a bump.
    cur.execute(_SHARE_PIPELINE, [pipeline_id])
    row = cur.fetchone()
    if row is None:
        raise Fenced(f"pipeline {pipeline_id} no longer exists")
    if row[0] != epoch:
        raise Fenced(f"writer epoch {epoch} is fenced: the pipeline is at epoch {row[0]}")


def _lock_positions(cur, target: Target, partitions: list[int], fetches: dict[int, Fetch]):
    """Lock and return ({partition: next_offset}, {partition: replay_until})."""
    if not target.exactly_once:
        # The classic modes resume from Kafka; the DB row only records how far they wrote.
        execute_values(cur, _CREATE_POSITIONS, [(target.pipeline_id, p, fetches[p].start) for p in partitions],
                       template="(%s, %s, %s, now())")
    cur.execute(_LOCK_POSITIONS, [target.pipeline_id, partitions])
    locked = cur.fetchall()
    positions = {p: next_offset for p, next_offset, _ in locked}
    replay_until = {p: until for p, _, until in locked}
    if target.exactly_once:
        missing = [p for p in partitions if p not in positions]
        if missing:
            raise Gap(f"no stored position for partitions {missing}: call ensure_positions first")
    return positions, replay_until


@dataclass
class _Plan:
    partition: int
    first: int          # where the ledger range starts: the fetch start, or next_offset after a replay
    end: int            # the consumer's position after the poll
    records: list         # SourceRecords, or kafka-python's records as polled (the Python engine)
    skipped: int
    rows_written: int = 0
    dead_letters: int = 0
    copy_text: bytes | None = None  # the rows as COPY text, when the transform's verbatim path took them
    deletes: list = field(default_factory=list)  # upsert.Delete of tombstones (--delete-on-tombstone)

    def outcome(self) -> PartitionOutcome:
        return PartitionOutcome(self.partition, self.first, self.end, len(self.records), self.rows_written,
                                self.dead_letters, self.skipped)


def _plan_partition(target: Target, partition: int, records: list[SourceRecord], fetch: Fetch,
                    next_offset) -> _Plan:
    if not target.exactly_once:
        return _Plan(partition, fetch.start, fetch.end, records, 0)
    if fetch.start > next_offset:
        raise Gap(f"partition {partition}: batch fetched from position {fetch.start} but next_offset is "
                  f"{next_offset}; positions {next_offset}..{fetch.start - 1} were never read")
    if fetch.end <= next_offset:  # all of it is a replay
        return _Plan(partition, next_offset, next_offset, [], len(records))
    fresh = [r for r in records if r.offset >= next_offset] if fetch.start < next_offset else records
    return _Plan(partition, next_offset, fetch.end, fresh, len(records) - len(fresh))


def _transform(target: Target, plans: list[_Plan], verbatim: bool = True):
    # The hot loop of every engine: names are hoisted into locals and per-partition counts are taken
    # once at the end, because every attribute access here is paid once per record.
    rows, dead = [], []
    topic, transform = target.topic, target.transform
    func, multi_row = transform.func, transform.multi_row
    # Not for an upsert sink: its rows are cut to the last per key first, and a COPY of a batch holding a key
    # twice would leave that to a fallback that cannot.
    verbatim = verbatim and transform.verbatim is not None and not multi_row and not target.upsert_key
    tombstones_delete = bool(target.upsert_key and target.delete_on_tombstone)
    append = rows.append
    for plan in plans:
        partition = plan.partition
        if verbatim and plan.records:
            values, offsets = _values_and_offsets(plan.records)
            if transform.verbatim(values):
                plan.copy_text = sinks.verbatim_copy_text(values, offsets, topic, partition)
                plan.rows_written, plan.dead_letters = len(values), 0
                continue
        rows_before, dead_before = len(rows), len(dead)
        for record in (plan.records if transform.takes_polled_records else as_source_records(plan.records)):
            try:
                if tombstones_delete and record.value is None:
                    plan.deletes.append(_tombstone(target, topic, record))
                    continue
                produced = func(record)
                if not produced or (not multi_row and len(produced) != 1):
                    produced = transform.rows(record)  # raises BadRecord with the reason
            except Exception as exc:  # any failure of user code is the record's fault, not the batch's
                if target.stop_on_bad_record:
                    where = f"partition {partition} offset {record.offset}"
                    raise StopOnBadRecord(f"{where}: {exception_text(exc)}") from exc
                dead.append((partition, record.offset, record.key, record.value, exception_text(exc)))
                continue
            if multi_row:
                rows.extend(row + (topic, partition, record.offset, i) for i, row in enumerate(produced))
            else:
                append((*produced[0], topic, partition, record.offset))
        plan.rows_written = len(rows) - rows_before
        plan.dead_letters = len(dead) - dead_before
    return rows, dead


def _values_and_offsets(records) -> tuple[list, list]:
    """A partition's values and offsets, for the verbatim path. A client's batch may hand them over without a
    record object each (consumers/engine/rdkafka.py `MessageBatch`); any other list of records is read per record."""
    columns = getattr(records, "values_and_offsets", None)
    if columns is not None:
        return columns()
    return [record.value for record in records], [record.offset for record in records]


def _tombstone(target: Target, topic: str, record: SourceRecord) -> upsert.Delete:
    if target.transform.tombstone_key is None:
        raise BadRecord("a tombstone, and the upsert key does not come from the record's key: it cannot be deleted")
    return upsert.Delete(target.transform.tombstone_key(record), topic, record.partition, record.offset)


def _write_verbatim(cur, target: Target, plans: list[_Plan], rows: list[tuple], dead: list[tuple],
                    faults: FaultInjector) -> None:
    """Step 5, fast path: COPY the partitions whose values the transform took verbatim. When PostgreSQL
    refuses their data (the sink's column is narrower than the transform's, say), undo it and send those
    partitions record by record, to `rows` and `dead`, where the poison search finds the culprits."""
    verbatim = [plan for plan in plans if plan.copy_text is not None]
    if not verbatim:
        return
    text = b"".join(plan.copy_text for plan in verbatim)
    columns = sinks.insert_columns(target.transform)
    cur.execute("SAVEPOINT tally_verbatim")
    try:
        lines = text.count(b"\n")
        if faults.armed("mid-write") and lines > 1:
            half = 0
            for _ in range(lines // 2):
                half = text.index(b"\n", half) + 1
            sinks.copy_text(cur, target.sink_table, columns, io.BytesIO(text[:half]))
            faults.maybe_crash("mid-write")
            text = text[half:]
        sinks.copy_text(cur, target.sink_table, columns, io.BytesIO(text))
    except Exception as exc:
        if not poison.is_data_error(exc):
            raise
        cur.execute("ROLLBACK TO SAVEPOINT tally_verbatim")
        for plan in verbatim:
            plan.copy_text = None
        more_rows, more_dead = _transform(target, verbatim, verbatim=False)
        rows += more_rows
        dead += more_dead
    else:
        cur.execute("RELEASE SAVEPOINT tally_verbatim")


def _write_rows_or_dead_letter(cur, target: Target, plans: list[_Plan], rows: list[tuple], dead: list[tuple],
                               faults: FaultInjector, replaying: bool) -> None:
    """Step 5: write the rows; on a data error, dead-letter the poison records and write the rest."""
    if not rows or _whole(cur, "tally_rows", lambda: _write_rows(cur, target, rows, faults, replaying)):
        return
    # Rows end with (..., partition, offset) or, multi-row, (..., partition, offset, row index).
    def record_of(row):
        return row[-3:-1] if target.transform.multi_row else row[-2:]

    groups: list[list[tuple]] = []
    for row in rows:
        if groups and record_of(groups[-1][0]) == record_of(row):
            groups[-1].append(row)
        else:
            groups.append([row])
    refused = poison.find_poison(cur, lambda some: _write_rows(cur, target, some, NO_FAULTS, replaying), groups)
    _dead_letter_refused(target, plans, dead, [(*record_of(groups[index][0]), error, len(groups[index]))
                                               for index, error in sorted(refused.items())])


def _delete_or_dead_letter(cur, target: Target, plans: list[_Plan], deletes: list[upsert.Delete],
                           dead: list[tuple]) -> None:
    """Upsert: delete the tombstones' keys; a key PostgreSQL refuses for its data (no value of the key's type, as
    "nope" for inet) makes its tombstone a dead letter, as a refused row does, and the other keys are deleted."""
    columns = dict(target.transform.columns)
    key_types = [(c, columns[c]) for c in target.upsert_key]
    if _whole(cur, "tally_deletes", lambda: upsert.delete_keys(cur, target.sink_table, key_types, deletes)):
        return
    refused = poison.find_poison(cur, lambda some: upsert.delete_keys(cur, target.sink_table, key_types, some),
                                 [[delete] for delete in deletes])
    _dead_letter_refused(target, plans, dead, [(deletes[index].partition, deletes[index].offset, error, 0)
                                               for index, error in sorted(refused.items())])


def _apply_the_latest_records_of_refused_keys(cur, target: Target, plans: list[_Plan], rows: list[tuple],
                                              deletes: list, written_rows: list[tuple], written_deletes: list,
                                              dead: list[tuple], replaying: bool) -> None:
    """Upsert: a key whose last record of the batch the database refused (a CHECK, say) takes its latest record
    that it does not refuse, as record by record (or in smaller batches) it would have, and as reconciliation
    expects: the earlier records were only superseded by one that turned out to be a dead letter. Round by round,
    since that record may be refused too; each round dead-letters a record or ends."""
    applied = {row[-2:] for row in written_rows} | {(d.partition, d.offset) for d in written_deletes}
    while True:
        refused = {(partition, offset) for partition, offset, *_ in dead} & applied
        if not refused:
            return
        rows = [row for row in rows if row[-2:] not in refused]
        deletes = [d for d in deletes if (d.partition, d.offset) not in refused]
        latest_rows, latest_deletes = _last_per_key(cur, target, rows, deletes)
        # Keys whose last record was applied keep it; the others' latest records are the ones not applied yet.
        more_rows = [row for row in latest_rows if row[-2:] not in applied]
        more_deletes = [d for d in latest_deletes if (d.partition, d.offset) not in applied]
        if not more_rows and not more_deletes:
            return
        applied -= refused
        applied |= {row[-2:] for row in more_rows} | {(d.partition, d.offset) for d in more_deletes}
        _write_rows_or_dead_letter(cur, target, plans, more_rows, dead, NO_FAULTS, replaying)
        if more_deletes:
            _delete_or_dead_letter(cur, target, plans, more_deletes, dead)


def _whole(cur, savepoint: str, write) -> bool:
    """`write()` under a savepoint: True once done; False, rolled back to the savepoint, when the database refused
    it for its data (the caller then finds the records at fault). Any other error is raised."""
    name = sql.Identifier(savepoint)
    cur.execute(sql.SQL("SAVEPOINT {}").format(name))
    try:
        write()
    except Exception as exc:
        if not poison.is_data_error(exc):
            raise
        cur.execute(sql.SQL("ROLLBACK TO SAVEPOINT {}").format(name))
        return False
    cur.execute(sql.SQL("RELEASE SAVEPOINT {}").format(name))
    return True


def _dead_letter_refused(target: Target, plans: list[_Plan], dead: list[tuple],
                         refused: list[tuple[int, int, str, int]]) -> None:
    """Each (partition, offset, the database's error, the rows it did not write) becomes a dead letter, or, under
    the "stop" policy, stops the batch."""
    records = {(r.partition, r.offset): r for plan in plans for r in plan.records}
    by_partition = {plan.partition: plan for plan in plans}
    for partition, offset, reason, rows in refused:
        record, error = records[(partition, offset)], f"database refused: {reason}"
        if target.stop_on_bad_record:
            raise StopOnBadRecord(f"partition {partition} offset {offset}: {error}")
        dead.append((partition, offset, record.key, record.value, error))
        plan = by_partition[partition]
        plan.rows_written -= rows
        plan.dead_letters += 1


def _write_rows(cur, target: Target, rows: list[tuple], faults: FaultInjector, replaying: bool) -> None:
    if not rows:
        return
    columns = sinks.insert_columns(target.transform)
    if target.upsert_key:
        # In place, on the key: a replay writes the same rows again, so no provenance check is needed.
        if faults.armed("mid-write") and len(rows) > 1:
            upsert.write_rows(cur, target.sink_table, columns, target.upsert_key, rows[:len(rows) // 2])
            faults.maybe_crash("mid-write")
            rows = rows[len(rows) // 2:]
        upsert.write_rows(cur, target.sink_table, columns, target.upsert_key, rows)
    elif replaying and target.exactly_once:
        # After a rewind that kept the sink, these rows may exist already: skip them on the provenance key.
        faults.maybe_crash("mid-write")
        sinks.insert_rows_skipping_existing(cur, target.sink_table, columns, rows,
                                            sinks.provenance_columns(target.transform))
    elif faults.armed("mid-write") and len(rows) > 1:
        half = len(rows) // 2
        sinks.copy_rows(cur, target.sink_table, columns, rows[:half])
        faults.maybe_crash("mid-write")
        sinks.copy_rows(cur, target.sink_table, columns, rows[half:])
    else:
        sinks.copy_rows(cur, target.sink_table, columns, rows)


def _write_ledger_and_positions(cur, target: Target, epoch: int, outcomes: list[PartitionOutcome]) -> None:
    if not outcomes:
        return
    execute_values(cur, _INSERT_LEDGER,
                   [(target.pipeline_id, o.partition, o.first_offset, o.end_offset, o.records, o.rows_written,
                     o.dead_letters, epoch) for o in outcomes],
                   template="(%s, %s, %s, %s, %s, %s, %s, %s, now())")
    execute_values(cur, _ADVANCE_POSITIONS, [(target.pipeline_id, o.partition, o.end_offset) for o in outcomes],
                   template="(%s::bigint, %s::integer, %s::bigint)")
