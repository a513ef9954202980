"""Reconciliation: prove, per pipeline and partition, that every consumed record landed exactly once.

The one module the views, the JSON API, the CLI (`manage.py reconcile`) and Celery beat call:
`reconcile_pipeline(pipeline)`, `reconcile_all()`, `report_json(reports)`. Rules and the meaning of each
finding: docs/reconciliation.md.

One run, per pipeline:
  1. Kafka: the group's committed offsets and the watermarks (read BEFORE the database, so a batch that
     commits meanwhile never looks lost: Kafka's offset is written after the DB commit).
  2. The database, in one REPEATABLE READ snapshot: positions, the marks of the last run, new ledger
     rows; then the NEW range [verified_offset, next_offset) of each partition is verified
     (consumers/reconciliation/verify.py). A new ledger row that starts below the mark (an at-least-once
     re-write) or a rewind moves the mark back first.
  3. What is re-evaluated every run, never marked as verified: phantom rows (at or beyond the committed
     position), a classic consumer's Kafka offset beyond the DB (records it skipped), a position below the
     log start (unrecoverable).
  4. Lag in records and seconds, status by the lag evaluation rules (consumers/reconciliation/lag_status.py), and the
     results stored in PartitionHealth / PipelineHealth.

Consumed range of a partition: from the first ledger offset to the DB's `next_offset`; for the classic
modes, which resume from Kafka, up to max(next_offset, Kafka's committed offset).
"""
import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from psycopg2 import sql
from psycopg2.extras import execute_values

from consumers.engine import log_bounds, sink_checks
from consumers.engine.tables import table
from consumers.engine.transforms import for_pipeline
from consumers.kafka import admin as kafka_admin
from consumers.kafka import ranges
from consumers.models import (
    BatchLedger,
    ConsumerRun,
    DeliveryMode,
    DesiredState,
    PartitionHealth,
    PartitionOffset,
    Pipeline,
    PipelineError,
    PipelineHealth,
    ResetPolicy,
    Status,
)
from consumers.reconciliation import lag_status, ledger_summary, monitored, pass_kafka, verify_upsert
from consumers.reconciliation import rewinds as reconcile_rewinds
from consumers.reconciliation.coverage import SPAN_OVERLAPS
from consumers.reconciliation.findings import Finding
from consumers.reconciliation.monitored import status_window
from consumers.reconciliation.report import (  # noqa: F401  (public names of this module)
    INCIDENT_KINDS,
    PartitionReport,
    PipelineReport,
    count_findings,
    report_json,
)
from consumers.reconciliation.verify import SinkShape, fold, sink_shape, verify_range

log = logging.getLogger("tally.reconcile")

# Findings of the verified range are kept between runs; "current" ones are recomputed every run.
VERIFIED, CURRENT = "verified", "current"


def reconcile_all(*, full: bool = False, kafka=None) -> list[PipelineReport]:
    """Every pipeline; Kafka's side read in bulk per cluster at the start (consumers/reconciliation/pass_kafka.py)
    unless `kafka` is given (a stand-in in tests). Pipelines are reconciled side by side in
    TALLY_RECONCILE_THREADS threads: each is small database work that mostly waits on PostgreSQL, and a worker
    of hundreds of pipelines must finish a pass well inside its interval."""
    pipelines = list(Pipeline.objects.order_by("name"))
    pass_reads = {} if kafka is not None else pass_kafka.for_pipelines(pipelines)

    def one(pipeline: Pipeline) -> PipelineReport | None:
        try:
            return reconcile_pipeline(pipeline, full=full, kafka=kafka or pass_reads[pipeline.cluster])
        except Exception:  # one broken pipeline must not hide the others' reports
            log.exception("reconciliation of pipeline %s failed", pipeline.name)
            return None

    reports = side_by_side(one, pipelines, settings.TALLY_RECONCILE_THREADS)
    return [report for report in reports if report is not None]


def side_by_side(work, items: list, threads: int) -> list:
    """`[work(item) for item in items]`, in up to `threads` threads, results in the items' order. Each thread
    keeps one database connection for its share and closes it at the end."""
    if threads <= 1 or len(items) <= 1:
        return [work(item) for item in items]
    results: list = [None] * len(items)
    indexes = iter(range(len(items)))
    lock = threading.Lock()

    def drain() -> None:
        try:
            while True:
                with lock:
                    index = next(indexes, None)
                if index is None:
                    return
                results[index] = work(items[index])
        finally:
            connection.close()

    workers = [threading.Thread(target=drain, name=f"tally-reconcile-{n}") for n in range(min(threads, len(items)))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return results


def reconcile_pipeline(pipeline: Pipeline, *, full: bool = False, kafka=None,
                       now: datetime | None = None) -> PipelineReport:
    """Verify what is new since the last run (everything when `full`), measure lag, evaluate the status
    and store PartitionHealth / PipelineHealth. `kafka` is the Kafka admin calls (the pipeline's cluster's
    unless given: a stand-in in tests)."""
    kafka = kafka or kafka_admin.on(pipeline.cluster)
    timer = _Timer()
    errors: list[str] = []
    classic = pipeline.delivery_mode != DeliveryMode.EXACTLY_ONCE
    with timer.kafka:
        committed, marks = _read_kafka(errors, kafka, pipeline)
    now = now or timezone.now()
    with timer.db:
        sink_error = _sink_error(pipeline)
    if sink_error:
        return _sink_broken(pipeline, sink_error, errors, now)
    # The sink can be written again: the reason it could not goes away.
    Pipeline.objects.filter(pk=pipeline.pk).clear_error(PipelineError.SINK)

    def verify() -> dict:
        held = _held_reader(errors, kafka, pipeline.topic, marks)
        return _verify_database(pipeline, classic, committed, marks, full, in_flight=alive, held=held,
                                skipped=rewinds.skipped,
                                records=verify_upsert.records_reader(
                                    lambda *args, **kwargs: _kafka_call(errors, ranges.read_ranges, None, *args,
                                                                        **kwargs),
                                    pipeline.topic, pipeline.cluster))

    with timer.db:
        # Read before the findings are folded: a range a rewind forward skipped never folds into a real loss.
        rewinds = reconcile_rewinds.load(pipeline, now - status_window())
        alive = ConsumerRun.objects.filter(pipeline=pipeline).serving(now).exists()
        states = verify()
    if hasattr(kafka, "fresh") and _beyond_marks(states, marks):
        # Marks read at a pass's start, and this pipeline has since consumed past them (or its log really
        # shrank): read its Kafka again, before the database as always, so "ahead" is never made up.
        kafka, errors = kafka.fresh(), []
        with timer.kafka:
            committed, marks = _read_kafka(errors, kafka, pipeline)
        with timer.db:
            states = verify()
    reports = []
    for p, state in sorted(states.items()):
        mark = marks.get(p)
        report = state.report
        report.log_start, report.high_watermark = (mark.log_start, mark.high) if mark else (None, None)
        report.kafka_committed = committed.get(p)
        if mark is not None:
            # Against the last stable offset: a read_committed consumer cannot pass an open transaction.
            report.lag_records = max(0, mark.end - state.consumed_end)
        reports.append(report)
    for p, mark in marks.items():  # partitions this pipeline never consumed: everything there is lag
        if p not in states:
            start = pipeline.initial_position(mark)
            reports.append(PartitionReport(p, mark.log_start, mark.high, None, committed.get(p),
                                           lag_records=max(0, mark.end - start)))
            states[p] = _PartitionState(reports[-1], consumed_end=start)
    with timer.kafka:
        _lag_seconds(errors, kafka, pipeline.topic, reports, states, marks, now)
    with timer.db:
        for report in reports:
            report.findings = reconcile_rewinds.mark_planned(report.findings,
                                                             rewinds.skipped.get(report.partition, []))
            count_findings(report)
        rate = _evaluate_status(pipeline, reports, states, rewinds, alive, now, kafka_failed=bool(errors))
        for report in reports:
            if any(f.kind == "ahead" for f in report.findings):
                report.status = Status.ERR  # "position ahead of log end": an error, never OK
        report = PipelineReport(pipeline.name, lag_status.worst(r.status for r in reports) if reports else
                                (Status.ERR if errors else Status.OK), pipeline.delivery_mode,
                                sorted(reports, key=lambda r: r.partition),
                                _total(r.lag_records for r in reports), _max(r.lag_seconds for r in reports),
                                rate, now, "; ".join(errors))
        if errors:
            report.status = Status.ERR
        _store(pipeline, report, states)
        ledger_summary.refresh(pipeline.pk)  # what the pages draw, folded as the ledger grows
    report.db_ms, report.kafka_ms = timer.db.ms, timer.kafka.ms
    return report


def _read_kafka(errors: list[str], kafka, pipeline: Pipeline) -> tuple[dict, dict]:
    """The group's committed offsets (where it committed any) and the topic's watermarks."""
    committed = _kafka_call(errors, kafka.committed_offsets, {}, pipeline.group_id, pipeline.topic)
    marks = _kafka_call(errors, kafka.watermarks, {}, pipeline.topic)
    return {p: o for p, o in committed.items() if o is not None}, marks


def _beyond_marks(states: dict, marks: dict) -> bool:
    return any(p in marks and state.report.next_offset > marks[p].high for p, state in states.items())


# --- a sink that cannot be written -------------------------------------------------------------------

def _sink_error(pipeline: Pipeline) -> str:
    """Why the pipeline cannot write its sink now ("" when it can). Checked once the pipeline should run or
    has written: a sink dropped or revoked after creation is an error at once, not silent lag. A transform that
    cannot be resolved is one at once too: the verification needs it."""
    try:
        transform = for_pipeline(pipeline)
    except (LookupError, ValueError) as exc:  # ValueError: a JSON mapping the table no longer fits
        return f"transform: {exc}"
    if pipeline.desired_state != DesiredState.RUNNING and not BatchLedger.objects.filter(pipeline=pipeline).exists():
        return ""
    with connection.cursor() as cursor:
        return sink_checks.problem(cursor.cursor, pipeline.sink_table, transform, pipeline.is_exactly_once,
                                   tuple(pipeline.upsert_key or ()))


def _sink_broken(pipeline: Pipeline, sink_error: str, errors: list[str], now: datetime) -> PipelineReport:
    """ERR for the pipeline and every partition, with the reason in `last_error`; the verified marks, counts
    and findings stay as they are (nothing can be verified against a sink that cannot be read)."""
    with transaction.atomic():
        PartitionHealth.objects.filter(pipeline=pipeline).update(status=Status.ERR, checked_at=now)
        PipelineHealth.objects.update_or_create(pipeline=pipeline, defaults={"status": Status.ERR, "checked_at": now})
        Pipeline.objects.filter(pk=pipeline.pk).set_error(PipelineError.SINK, sink_error)
    log.warning("%s: %s", pipeline.name, sink_error)
    return PipelineReport(pipeline.name, Status.ERR, pipeline.delivery_mode, [], None, None, None, now,
                          "; ".join(errors), sink_error=sink_error)


# --- the database snapshot -----------------------------------------------------------------------------

@dataclass
class _PartitionState:
    report: PartitionReport
    consumed_end: int
    marks_read: tuple[int, int] | None = None     # (verified_offset, verified_ledger_id) as read
    new_marks: tuple[int, int] | None = None      # what this run verified
    moved_at: datetime | None = None
    phantom_from: int | None = None               # rows at or beyond this offset are phantoms


@contextlib.contextmanager
def _snapshot_cursor():
    """A raw psycopg2 cursor in one REPEATABLE READ, read-only transaction: positions, ledger and sink are
    read as of one instant, so a batch committing meanwhile cannot look like phantom rows."""
    connection.ensure_connection()
    if connection.in_atomic_block:  # inside a caller's transaction (e.g. a test): read in it
        with connection.cursor() as cursor:
            yield cursor.cursor
        return
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield cursor.cursor


def _held_reader(errors: list[str], kafka, topic: str, marks: dict):
    """held(partition) -> a function giving the offsets of the records the topic holds in each of some
    ranges (a read_committed read of just those ranges): how reconciliation tells a hole from a loss.
    Positions below the log start can no longer be read: there every position counts as a record (lost).
    When Kafka fails, every absent offset counts as lost and the error is reported."""
    reader = getattr(kafka, "records_held", None)
    if reader is None:
        return lambda partition: None

    def held_for(partition: int):
        def held(ranges: list[tuple[int, int]]) -> list[list[int]]:
            mark = marks.get(partition)
            floor = mark.log_start if mark is not None else 0
            readable = [(max(s, floor), e) for s, e in ranges if e > max(s, floor)]
            found = _kafka_call(errors, reader, None, topic, partition, readable)
            if found is None:
                return [list(range(s, e)) for s, e in ranges]
            found = iter(found)
            return [list(range(s, min(e, floor))) + (list(next(found)) if e > max(s, floor) else [])
                    for s, e in ranges]
        return held
    return held_for


def _verify_database(pipeline, classic: bool, committed: dict, marks: dict, full: bool, in_flight: bool,
                     held=lambda partition: None, records=None, skipped=None) -> dict:
    transform = for_pipeline(pipeline)
    verify = verify_upsert.verifier(pipeline, transform, records) if pipeline.is_upsert and records else verify_range
    with _snapshot_cursor() as cur:
        cur.execute(sql.SQL("SELECT partition, next_offset, replay_until, updated_at FROM {} WHERE pipeline_id = %s")
                    .format(table(PartitionOffset)), [pipeline.pk])
        positions = {p: (n, until, at) for p, n, until, at in cur.fetchall()}
        cur.execute(sql.SQL("SELECT partition, verified_offset, verified_ledger_id, findings FROM {} "
                            "WHERE pipeline_id = %s").format(table(PartitionHealth)), [pipeline.pk])
        # Django's connection hands jsonb over as text (its JSONField decodes it), so decode here.
        health = {p: (v, m, json.loads(f) if isinstance(f, str) else f) for p, v, m, f in cur.fetchall()}
        ledger_marks = {p: (0 if full or p not in health else health[p][1]) for p in set(positions) | set(health)}
        newest = _new_ledger_rows(cur, pipeline.pk, ledger_marks)
        shape = (sink_shape(cur, pipeline.sink_table, pipeline.topic, transform.multi_row)
                 if sink_checks.table_exists(cur, pipeline.sink_table) else None)
        partitions = set(positions) | (set(committed) if classic else set())
        states = {}
        for p in sorted(partitions):
            states[p] = _verify_partition(cur, pipeline, shape, classic, p, positions.get(p), committed.get(p),
                                          marks.get(p), None if full else health.get(p), health.get(p),
                                          newest.get(p), in_flight, held(p), verify,
                                          phantoms_when_idle=full or not pipeline.is_upsert,
                                          skipped=(skipped or {}).get(p, []))
        if shape is not None:
            _phantoms(cur, shape, states)
    return states


def _new_ledger_rows(cur, pipeline_id: int, ledger_marks: dict[int, int]) -> dict[int, tuple[int, int]]:
    """{partition: (lowest first_offset, highest id)} of ledger rows newer than each partition's mark."""
    floor = min(ledger_marks.values(), default=0)
    cur.execute(sql.SQL("SELECT partition, id, first_offset FROM {} WHERE pipeline_id = %s AND id > %s")
                .format(table(BatchLedger)), [pipeline_id, floor])
    newest: dict[int, tuple[int, int]] = {}
    for p, row_id, first in cur.fetchall():
        if row_id > ledger_marks.get(p, 0):
            low, high = newest.get(p, (first, row_id))
            newest[p] = (min(low, first), max(high, row_id))
    return newest


def _verify_partition(cur, pipeline, shape: SinkShape | None, classic: bool, p: int, position, kafka_offset,
                      mark, health, health_as_read, newest, in_flight: bool, held=None,
                      verify=verify_range, phantoms_when_idle: bool = True, skipped=()) -> _PartitionState:
    """`phantoms_when_idle` False (an upsert pipeline's incremental pass): a partition with nothing new keeps
    the phantom findings of the pass that last looked, instead of looking again. An upsert table needs no index
    on the provenance columns (its unique key is the upsert key), so looking is a scan of the whole table; the
    rows Tally writes only change when the position moves, and then the next pass looks."""
    next_offset, replay_until, moved_at = position if position else (None, None, None)
    if health is not None:
        verified, ledger_mark, stored = health
        kept = [f for f in map(Finding.from_json, stored or []) if f.scope == VERIFIED]
    else:
        start = _consumed_start(cur, pipeline, classic, p, next_offset, kafka_offset, mark)
        verified, ledger_mark, kept = start, 0, []
    if next_offset is None:  # a classic consumer that committed to Kafka but never wrote
        next_offset = verified
    if newest:
        verified, ledger_mark = min(verified, newest[0]), max(ledger_mark, newest[1])
    verified = min(verified, next_offset)  # a rewind below the mark that did not move it
    verified, kept = _reopen_findings(verified, kept)
    report = PartitionReport(p, next_offset=next_offset, checked_from=verified, verified_offset=next_offset)
    consumed_end = max(next_offset, kafka_offset) if classic and kafka_offset is not None else next_offset
    state = _PartitionState(report, consumed_end, moved_at=moved_at,
                            marks_read=health_as_read[:2] if health_as_read else None,
                            new_marks=(next_offset, ledger_mark))
    new_findings, current = [], []
    if shape is not None:
        result = verify(cur, shape, pipeline.pk, p, verified, next_offset,
                        _ledger(cur, pipeline.pk, p, verified, next_offset), held)
        report.proven = result.proven
        new_findings = reconcile_rewinds.mark_planned(
            result.findings + _skipped_by_retention(cur, pipeline.pk, p, verified, next_offset), list(skipped))
        # Kafka says consumed, the DB never wrote it: at-most-once lost it if its consumer died; while a
        # consumer is alive it is the batch being written right now (Kafka commit first), not a loss.
        if consumed_end > next_offset and not in_flight:
            current += fold(reconcile_rewinds.mark_planned(
                verify_range(cur, shape, pipeline.pk, p, next_offset, consumed_end,
                             _ledger(cur, pipeline.pk, p, next_offset, consumed_end), held).findings, list(skipped)))
        idle = verified >= next_offset and consumed_end <= next_offset
        if idle and not phantoms_when_idle and health is not None:
            current += [f for f in map(Finding.from_json, health[2] or [])
                        if f.kind == "phantom" and f.scope == CURRENT]
        else:
            state.phantom_from = max(consumed_end, replay_until or 0)
    resume_at = kafka_offset if classic and kafka_offset is not None else next_offset
    if mark is not None and resume_at < mark.log_start:
        current.append(Finding("unrecoverable", resume_at, mark.log_start, mark.log_start - resume_at))
    if mark is not None and next_offset > mark.high:
        # Topic recreated, broker data loss: waiting would wait for offsets that may never come.
        current.append(Finding("ahead", mark.high, next_offset, next_offset - mark.high, reason=log_bounds.AHEAD))
    report.findings = ([replace(f, scope=VERIFIED) for f in fold(kept + new_findings)]
                       + [replace(f, scope=CURRENT) for f in current])
    count_findings(report)
    return state


def _skipped_by_retention(cur, pipeline_id: int, p: int, start: int, end: int) -> list[Finding]:
    """Ledger rows of a skip-by-retention policy: records deleted before they were read (lost before read).
    Their positions are counted: the records are gone, so how many there were can no longer be told."""
    if end <= start:
        return []
    cur.execute(sql.SQL("SELECT first_offset, end_offset, note FROM {} WHERE pipeline_id = %s AND partition = %s "
                        "AND note <> '' AND first_offset < %s AND end_offset > %s ORDER BY first_offset")
                .format(table(BatchLedger)), [pipeline_id, p, end, start])  # ledger_note_idx: rows with a note only
    return [Finding("unrecoverable", first, last, last - first, reason=note) for first, last, note in cur.fetchall()]


def _consumed_start(cur, pipeline, classic: bool, p: int, next_offset, kafka_offset, mark) -> int:
    """Where a partition's consumed range starts: its first ledger offset. A classic consumer that started
    from the earliest offset may have lost its first batches before writing any ledger row, so there
    the log start counts too."""
    cur.execute(sql.SQL("SELECT min(first_offset) FROM {} WHERE pipeline_id = %s AND partition = %s")
                .format(table(BatchLedger)), [pipeline.pk, p])
    first = cur.fetchone()[0]
    candidates = [o for o in (first, next_offset) if o is not None]
    if classic and pipeline.reset_policy == ResetPolicy.EARLIEST and mark is not None:
        candidates.append(mark.log_start)
    if candidates:
        return min(candidates)
    return kafka_offset if kafka_offset is not None else 0


def _reopen_findings(verified: int, kept: list[Finding]) -> tuple[int, list[Finding]]:
    """Findings that reach the mark are dropped and their range verified again (the mark moves to their
    start), so counts never mix old and new evidence."""
    for _ in range(len(kept) + 1):
        crossing = [f for f in kept if f.end > verified]
        if not crossing:
            break
        verified = min(verified, *(f.start for f in crossing))
        kept = [f for f in kept if f.end <= verified]
    return verified, kept


def _ledger(cur, pipeline_id: int, p: int, start: int, end: int) -> list[tuple]:
    """(first, covered end, records, whole) of the ledger rows reaching into [start, end): `whole` when
    the row lies entirely inside and no rewind trimmed it, so its record count applies to the range."""
    if end <= start:
        return []
    cur.execute(sql.SQL("SELECT first_offset, LEAST(end_offset, COALESCE(superseded_from, end_offset)) AS covered_end, "
                        "records, (first_offset >= %(start)s AND end_offset <= %(end)s AND (superseded_from IS NULL "
                        "OR superseded_from >= end_offset)) AS whole "
                        "FROM {} WHERE pipeline_id = %(pipeline)s AND partition = %(partition)s AND first_offset < "
                        "%(end)s AND LEAST(end_offset, COALESCE(superseded_from, end_offset)) > %(start)s "
                        "AND {} ORDER BY first_offset").format(table(BatchLedger), sql.SQL(SPAN_OVERLAPS)),
                {"start": start, "end": end, "pipeline": pipeline_id, "partition": p})
    return cur.fetchall()


def _phantoms(cur, shape: SinkShape, states: dict) -> None:
    """Rows at or beyond each partition's committed position: one query for all partitions."""
    limits = [(p, state.phantom_from) for p, state in states.items() if state.phantom_from is not None]
    if not limits:
        return
    values = sql.SQL(", ").join(sql.SQL("(%s::integer, %s::bigint)") for _ in limits)
    cur.execute(sql.SQL("SELECT v.p, count(*), min(s.source_offset), max(s.source_offset) FROM (VALUES {}) AS "
                        "v(p, o) JOIN {} AS s ON s.source_topic = %s AND s.source_partition = v.p "
                        "AND s.source_offset >= v.o GROUP BY v.p").format(values, sql.Identifier(shape.table)),
                [x for limit in limits for x in limit] + [shape.topic])
    for p, count, low, high in cur.fetchall():
        report = states[p].report
        report.findings.append(Finding("phantom", low, high + 1, count, scope=CURRENT))
        count_findings(report)


# --- lag, status, storing ------------------------------------------------------------------------------

def _lag_seconds(errors, kafka, topic: str, reports, states, marks, now: datetime) -> None:
    """Age of the record at the consumer's position; 0 when caught up."""
    behind = {}
    for report in reports:
        if report.lag_records is None:
            continue
        if report.lag_records == 0:
            report.lag_seconds = 0.0
        else:
            behind[report.partition] = max(states[report.partition].consumed_end, marks[report.partition].log_start)
    if not behind:
        return
    stamps = _kafka_call(errors, kafka.record_timestamps, {}, topic, behind)
    now_ms = now.timestamp() * 1000
    for report in reports:
        stamp = stamps.get(report.partition)
        if stamp is not None:
            report.lag_seconds = max(0.0, (now_ms - stamp) / 1000)


def _evaluate_status(pipeline, reports, states, rewinds, alive: bool, now: datetime,
                     kafka_failed: bool) -> float | None:
    """Set each partition's status; return the records per second over the window."""
    history = monitored.window_samples(pipeline=pipeline, now=now)  # the rules every monitored consumer shares
    rate, rate_known = 0.0, False
    for report in reports:
        state = states[report.partition]
        report.status = monitored.partition_status(
            history.get(report.partition, []), position=state.consumed_end, lag=report.lag_records,
            moved_at=state.moved_at or pipeline.created_at, alive=alive,
            rewound=rewinds.recently_rewound(report.partition), incident=report.incident or kafka_failed, now=now)
        samples = history.get(report.partition) or [lag_status.Sample(now, state.consumed_end, report.lag_records)]
        first = samples[0]
        if first.position is not None and now > first.taken_at and state.consumed_end >= first.position:
            rate += (state.consumed_end - first.position) / (now - first.taken_at).total_seconds()
            rate_known = True
    return rate if rate_known else None


_HEALTH_COLUMNS = ("verified_offset", "verified_ledger_id", "findings", "lost", "duplicated", "phantom",
                   "dead_lettered", "unrecoverable", "log_start", "high_watermark", "next_offset", "kafka_committed",
                   "lag_records", "lag_seconds", "status", "checked_at")


def _store(pipeline, report: PipelineReport, states) -> None:
    """Upsert every partition's health and the pipeline's in a few raw statements (an ORM bulk_update of
    16 columns costs more Python time than the whole idle verification)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cur = cursor.cursor
        cur.execute(sql.SQL("SELECT partition, verified_offset, verified_ledger_id, findings, lost, duplicated, "
                            "phantom, dead_lettered, unrecoverable FROM {} WHERE pipeline_id = %s FOR UPDATE")
                    .format(table(PartitionHealth)), [pipeline.pk])
        stored = {row[0]: row[1:] for row in cur.fetchall()}
        rows = []
        for part in report.partitions:
            state = states[part.partition]
            current = stored.get(part.partition)
            if state.new_marks is None and current is None:
                continue  # never consumed: a health row would plant a wrong mark at 0
            moved = current is not None and state.marks_read is not None and tuple(current[:2]) != state.marks_read
            if state.new_marks is None or moved:
                # A rewind (or another run) moved the marks meanwhile: keep theirs and their findings; the
                # next run verifies from there.
                verified, ledger_id, findings, *counts = current
                findings = findings if isinstance(findings, str) else json.dumps(findings)
            else:
                (verified, ledger_id), findings = state.new_marks, json.dumps([f.as_json() for f in part.findings])
                counts = [part.lost, part.duplicated, part.phantom, part.dead_lettered, part.unrecoverable]
            rows.append((pipeline.pk, part.partition, verified, ledger_id, findings, *counts, part.log_start,
                         part.high_watermark, part.next_offset, part.kafka_committed, part.lag_records,
                         part.lag_seconds, part.status, report.checked_at))
        if rows:
            columns = sql.SQL(", ").join(sql.Identifier(c) for c in _HEALTH_COLUMNS)
            updates = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c))
                                         for c in _HEALTH_COLUMNS)
            statement = sql.SQL("INSERT INTO {} (pipeline_id, partition, {}) VALUES %s "
                                "ON CONFLICT (pipeline_id, partition) DO UPDATE SET {}"
                                ).format(table(PartitionHealth), columns, updates)
            execute_values(cur, statement.as_string(cur), rows,
                           template="(" + ", ".join(["%s"] * 4 + ["%s::jsonb"] + ["%s"] * 13) + ")")
        cur.execute(sql.SQL("INSERT INTO {} (pipeline_id, status, lost, duplicated, phantom, "
                            "dead_lettered, lag_records, lag_seconds, records_per_second, checked_at) "
                            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (pipeline_id) DO UPDATE SET "
                            "status = EXCLUDED.status, lost = EXCLUDED.lost, duplicated = EXCLUDED.duplicated, "
                            "phantom = EXCLUDED.phantom, dead_lettered = EXCLUDED.dead_lettered, "
                            "lag_records = EXCLUDED.lag_records, lag_seconds = EXCLUDED.lag_seconds, "
                            "records_per_second = EXCLUDED.records_per_second, checked_at = EXCLUDED.checked_at"
                            ).format(table(PipelineHealth)),
                    [pipeline.pk, report.status, report.lost, report.duplicated, report.phantom,
                     report.dead_lettered, report.lag_records, report.lag_seconds, report.records_per_second,
                     report.checked_at])


# --- small helpers -------------------------------------------------------------------------------------

def _kafka_call(errors: list[str], func, default, *args, **kwargs):
    try:
        return func(*args, **kwargs)
    except Exception as exc:  # Kafka down must not stop the database verification
        errors.append(f"{func.__name__}: {type(exc).__name__}: {exc}")
        log.warning("reconciliation: %s failed: %s", func.__name__, exc)
        return default


def _total(values):
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def _max(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


class _Stopwatch:
    def __init__(self):
        self.ms = 0.0

    def __enter__(self):
        self._start = time.perf_counter()

    def __exit__(self, *exc):
        self.ms += (time.perf_counter() - self._start) * 1000


class _Timer:
    def __init__(self):
        self.db, self.kafka = _Stopwatch(), _Stopwatch()
