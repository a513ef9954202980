"""Stored positions against the log's bounds: real losses stay loud.

Before an engine seeks to the database's positions it checks them against each partition's log start
and log end (`kafka_admin.watermarks`, or any object with the same `watermarks(topic, partitions)`):

- **log start past the stored position** (retention, DeleteRecords, a recreated topic): the records
  `[position, log start)` were deleted before they were read. The pipeline's `on_log_truncated` policy
  decides: `stop` (default) ends the run with the reason; `skip` moves the position to the log start in
  one audited transaction -- a ledger row with no records and the note "skipped by retention: offsets
  A..B", which reconciliation reports as lost before read (and the lost-records alert fires).
- **stored position above the log end** (topic deleted and recreated, broker data loss, unclean leader
  election): an error, "position ahead of log end" -- never a silent wait for offsets that may never
  come. The pipeline page offers the rewind that fixes it.
"""
from dataclasses import dataclass

from psycopg2 import sql
from psycopg2.extras import execute_values

from consumers.engine import commit
from consumers.engine.tables import table
from consumers.models import BatchLedger, LogTruncatedPolicy, PartitionOffset

AHEAD = "position ahead of log end"
SKIPPED_NOTE = "skipped by retention: offsets {start}..{last}"


class LogBoundsError(Exception):
    """The stored position cannot be read from: the run must stop with this reason."""


@dataclass(frozen=True)
class Skipped:
    partition: int
    start: int
    end: int   # the log start the position moved to

    @property
    def note(self) -> str:
        return SKIPPED_NOTE.format(start=self.start, last=self.end - 1)


def ahead_message(partition: int, position: int, log_end: int) -> str:
    return (f"partition {partition}: {AHEAD}: the stored position {position} is above the log end {log_end} "
            f"(topic recreated or broker data loss); rewind the pipeline to the log end to go on")


def check(conn, pipeline, target: commit.Target, epoch: int, positions: dict[int, int], marks) -> list[Skipped]:
    """Check `positions` ({partition: stored next_offset}) against `marks` ({partition: Watermarks}).
    Raises LogBoundsError (stop policy, or a position ahead of the log end); with the skip policy moves
    truncated partitions to their log start and returns what was skipped (positions updated in place)."""
    skipped = []
    for p, position in sorted(positions.items()):
        mark = marks.get(p)
        if mark is None:
            continue
        if position > mark.high:
            raise LogBoundsError(ahead_message(p, position, mark.high))
        if position < mark.log_start:
            lost = (f"partition {p}: the log start {mark.log_start} moved past the stored position {position}: "
                    f"offsets {position}..{mark.log_start - 1} were deleted before they were read "
                    f"(retention, DeleteRecords or a recreated topic)")
            if pipeline.on_log_truncated != LogTruncatedPolicy.SKIP:
                raise LogBoundsError(f"{lost}; the pipeline's policy is to stop")
            skip = Skipped(p, position, mark.log_start)
            skip_truncated(conn, target, epoch, skip)
            positions[p] = mark.log_start
            skipped.append(skip)
    return skipped


def skip_truncated(conn, target: commit.Target, epoch: int, skip: Skipped) -> None:
    """One transaction: epoch check, the position row locked and still where it was, a ledger row with no
    records and the note, and the position moved to the log start."""
    try:
        with conn.cursor() as cur:
            commit.check_epoch(cur, target.pipeline_id, epoch)
            cur.execute(sql.SQL("SELECT next_offset FROM {} WHERE pipeline_id = %s AND partition = %s FOR UPDATE")
                        .format(table(PartitionOffset)), [target.pipeline_id, skip.partition])
            row = cur.fetchone()
            if row is None or row[0] != skip.start:
                raise commit.CommitRefused(f"partition {skip.partition} moved meanwhile; not skipping")
            execute_values(cur, sql.SQL("INSERT INTO {} (pipeline_id, partition, first_offset, end_offset, records, "
                                        "rows_written, dead_letters, epoch, committed_at, note) VALUES %s")
                           .format(table(BatchLedger)),
                           [(target.pipeline_id, skip.partition, skip.start, skip.end, 0, 0, 0, epoch, skip.note)],
                           template="(%s, %s, %s, %s, %s, %s, %s, %s, now(), %s)")
            cur.execute(sql.SQL("UPDATE {} SET next_offset = %s, updated_at = now() "
                                "WHERE pipeline_id = %s AND partition = %s").format(table(PartitionOffset)),
                        [skip.end, target.pipeline_id, skip.partition])
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
