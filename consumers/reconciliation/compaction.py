"""Ledger compaction: old, verified, contiguous batches of one partition become one ledger row.

Every committed batch writes a ledger row; a pipeline at one batch a second adds 86,400 a day. Once a range is
verified and old, its rows say nothing one row could not: compaction merges a run of rows into its first row
(which keeps its id, so reconciliation's and the ledger summary's marks by id stay true) and deletes the others.
The merged row keeps the first offset, the end, the sums of records, rows and batches, and the time span
(`first_committed_at` .. `committed_at`). Trace says a record's batch was compacted.

A row joins a run only when all of this holds:
  - it is verified: its end is at or below the partition's `verified_offset` and its id at or below the
    `verified_ledger_id` reconciliation took into account (and below the ledger summary's `upto_id`, so the
    pages' summary already folded it);
  - it was committed before the recent past (`TALLY_LEDGER_KEEP_DAYS`, default 7): recent rows stay whole. The
    commit protocol stamps `committed_at` with the database's clock (`now()`), so that is the clock their age is
    judged by (`database_now`), not the clock of the worker that compacts;
  - no rewind trimmed it (`superseded_from`), it has no note (records skipped by retention), no dead letter;
  - it starts exactly where the run ends (no gap, no overlap) and has the run's epoch.
So rewinds, gaps, overlaps, notes and dead letters keep their own rows, and a run never crosses an epoch.

Work goes in bounded steps (`compact_step`): at most STEP_ROWS rows of one partition in one short transaction,
holding locks only on the rows it merges; a rewind that trims them waits for the step or goes first (the rows
it trimmed are then no longer taken). A step killed at any point rolls back whole: the ledger is either as
before or compacted. Celery beat runs `compact_all` (consumers/tasks/reconciliation.py).
"""
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from psycopg2 import sql

from consumers.engine.faults import NO_FAULTS, FaultInjector
from consumers.engine.tables import table
from consumers.models import BatchLedger, LedgerSummary, PartitionHealth, Pipeline

log = logging.getLogger("tally.compaction")

# Rows read (and at most merged) per step: one step's transaction then takes tens of milliseconds on this kind of
# machine, so a rewind or reconciliation waiting for its row locks hardly notices, while a backlog of 26 million
# rows still compacts at about 100,000 rows a second.
STEP_ROWS = 5_000

_ROWS_SQL = sql.SQL("SELECT id, first_offset, end_offset, records, rows_written, dead_letters, epoch, committed_at, "
                    "superseded_from, note, batches, first_committed_at FROM {} "
                    "WHERE pipeline_id = %s AND partition = %s AND first_offset >= %s "
                    "ORDER BY first_offset, end_offset, id LIMIT %s FOR UPDATE").format(table(BatchLedger))
_MERGE_SQL = sql.SQL("UPDATE {} SET end_offset = %s, records = %s, rows_written = %s, batches = %s, "
                     "first_committed_at = %s, committed_at = %s WHERE id = %s").format(table(BatchLedger))
_DELETE_SQL = sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(table(BatchLedger))
_RESUME_SQL = sql.SQL("UPDATE {} SET compacted_to = %s WHERE pipeline_id = %s AND partition = %s"
                      ).format(table(LedgerSummary))


def keep_whole_for() -> timedelta:
    return timedelta(days=settings.TALLY_LEDGER_KEEP_DAYS)


def database_now() -> datetime:
    """PostgreSQL's clock, which stamped the ledger rows."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


@dataclass
class StepResult:
    rows_read: int = 0
    rows_merged: int = 0      # rows deleted into the first row of their run
    runs: int = 0             # merged rows written
    done: bool = True         # nothing more to do in this partition for now


@dataclass
class _Limits:
    verified_offset: int
    verified_id: int
    cutoff: datetime


@dataclass
class _Row:
    id: int
    first: int
    end: int
    records: int
    rows_written: int
    dead_letters: int
    epoch: int
    committed_at: datetime
    superseded_from: int | None
    note: str
    batches: int
    first_committed_at: datetime | None

    def settled(self, limits: _Limits) -> bool:
        """Verified, folded into the summary and old enough: what a later step may find eligible otherwise."""
        return (self.end <= limits.verified_offset and self.id <= limits.verified_id
                and self.committed_at < limits.cutoff)

    def mergeable(self) -> bool:
        return self.superseded_from is None and not self.note and self.dead_letters == 0


@dataclass
class _Run:
    rows: list = field(default_factory=list)

    def extends(self, row: _Row) -> bool:
        last = self.rows[-1]
        return row.first == last.end and row.epoch == last.epoch


def compact_step(pipeline_id: int, partition: int, *, now: datetime | None = None,
                 faults: FaultInjector = NO_FAULTS) -> StepResult:
    """One bounded step on one partition: read up to STEP_ROWS rows from where the last step stopped, merge
    the runs among them, remember where to go on. One transaction."""
    now = now or database_now()
    result = StepResult()
    with transaction.atomic(), connection.cursor() as cursor:
        limits, start = _limits(cursor, pipeline_id, partition, now)
        if limits is None:
            return result
        cursor.execute(_ROWS_SQL, [pipeline_id, partition, start, STEP_ROWS])
        rows = [_Row(*values) for values in cursor.fetchall()]
        result.rows_read = len(rows)
        runs, resume_at, stopped = _runs(rows, limits)
        for run in runs:
            _merge(cursor, run, faults)
            result.runs += 1
            result.rows_merged += len(run.rows) - 1
        # Go on from the run that may still grow (or the first row not settled yet).
        if resume_at is not None and resume_at > start:
            cursor.execute(_RESUME_SQL, [resume_at, pipeline_id, partition])
        moved = result.runs > 0 or (resume_at is not None and resume_at > start)
        result.done = stopped or len(rows) < STEP_ROWS or not moved
    return result


def _limits(cursor, pipeline_id: int, partition: int, now: datetime):
    """(_Limits, where to start) or (None, None) when nothing of the partition may be compacted yet."""
    health = (PartitionHealth.objects.filter(pipeline_id=pipeline_id, partition=partition)
              .values_list("verified_offset", "verified_ledger_id").first())
    summary = (LedgerSummary.objects.filter(pipeline_id=pipeline_id, partition=partition)
               .values_list("upto_id", "compacted_to").first())
    if health is None or summary is None:
        return None, None
    (verified_offset, verified_id), (upto_id, compacted_to) = health, summary
    return _Limits(verified_offset, min(verified_id, upto_id), now - keep_whole_for()), compacted_to


def _runs(rows: list[_Row], limits: _Limits) -> tuple[list[_Run], int | None, bool]:
    """(runs of two or more rows to merge, the offset the next step starts from, stopped at an unsettled row)."""
    runs, current = [], _Run()
    for row in rows:
        if not row.settled(limits):
            # Newer rows come after it: stop here; the open run may take this row once it is settled.
            return _closed(runs, current), (current.rows[0].first if current.rows else row.first), True
        if not row.mergeable():
            runs = _closed(runs, current)
            current = _Run()
            continue
        if current.rows and current.extends(row):
            current.rows.append(row)
        else:
            runs = _closed(runs, current)
            current = _Run([row])
    if not rows:
        return runs, None, False
    return _closed(runs, current), (current.rows[0].first if current.rows else rows[-1].end), False


def _closed(runs: list[_Run], run: _Run) -> list[_Run]:
    return runs + [run] if len(run.rows) > 1 else runs


def _merge(cursor, run: _Run, faults: FaultInjector) -> None:
    first, last = run.rows[0], run.rows[-1]
    cursor.execute(
        _MERGE_SQL,
        [last.end, sum(r.records for r in run.rows), sum(r.rows_written for r in run.rows),
         sum(r.batches for r in run.rows), first.first_committed_at or first.committed_at, last.committed_at,
         first.id])
    faults.maybe_crash("compaction-mid-step")
    cursor.execute(_DELETE_SQL, [[r.id for r in run.rows[1:]]])


@dataclass
class CompactionReport:
    steps: int = 0
    rows_read: int = 0
    rows_merged: int = 0
    runs: int = 0
    unfinished: bool = False    # the time budget ran out with work left

    def as_json(self) -> dict:
        return dict(self.__dict__)


def compact_all(*, now: datetime | None = None, max_seconds: float | None = None,
                faults: FaultInjector = NO_FAULTS) -> CompactionReport:
    """Step through every partition of every pipeline until nothing is left or `max_seconds` have passed."""
    now = now or database_now()
    deadline = time.monotonic() + max_seconds if max_seconds is not None else None
    report = CompactionReport()
    partitions = list(LedgerSummary.objects.filter(pipeline__in=Pipeline.objects.all())
                      .order_by("pipeline_id", "partition").values_list("pipeline_id", "partition"))
    for pipeline_id, partition in partitions:
        while True:
            if deadline is not None and time.monotonic() > deadline:
                report.unfinished = True
                return report
            step = compact_step(pipeline_id, partition, now=now, faults=faults)
            report.steps += 1
            report.rows_read += step.rows_read
            report.rows_merged += step.rows_merged
            report.runs += step.runs
            if step.done:
                break
    if report.rows_merged:
        log.info("ledger compaction: %s rows merged into %s", report.rows_merged, report.runs)
    return report
