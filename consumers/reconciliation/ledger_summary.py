"""The ledger of each partition, summarised for the pages: bounds, gaps, overlaps, rewinds, holes and batches,
so that the offset timeline costs the same on day 300 as on day 1.

The summary is a fold of the ledger rows over the sweep of consumers/reconciliation/coverage.py: rows in
(first_offset, covered end) order; a row that starts above everything covered before it leaves a gap, one that
starts below it overlaps; rows trimmed by a rewind cover [first_offset, superseded_from). Rows arrive in commit
order, which is that order as long as each new row sorts at or after the last one folded; so the summary is kept
incrementally, up to a ledger row id (`LedgerSummary.upto_id`), and a row that sorts before the last one (a
ledger written out of order) makes the partition fold again from scratch, in sweep order.

- Reconciliation refreshes the summaries (`refresh`, in bounded steps of REFRESH_ROWS rows).
- A rewind trims old rows: it deletes the partition's summary in its transaction; the next refresh folds again.
- Compaction merges rows into the first one's id and keeps their union and sums, so a summary stays true.
- Pages (`read`) take the stored state and fold only the rows committed since: a page never writes.
"""
from dataclasses import asdict, dataclass, field

from django.db import connection, transaction
from psycopg2 import sql

from consumers.engine.tables import table
from consumers.models import BatchLedger, LedgerSummary, PartitionOffset

# More anomalies than this per partition are not kept (the drawing would be unreadable anyway); counts stay exact.
MAX_MARKS = 50
# Ledger rows folded per partition and refresh: bounds the time a refresh holds its transaction (a first refresh
# of a ledger of millions of rows catches up over several reconciliation runs instead of one long one).
REFRESH_ROWS = 200_000
FETCH_ROWS = 10_000

_ROWS_SQL = sql.SQL("SELECT id, partition, first_offset, end_offset, superseded_from, records, batches "
                    "FROM {ledger} WHERE pipeline_id = %s AND id > %s{partition} ORDER BY id{limit}")
_ROWS_SINCE = _ROWS_SQL.format(ledger=table(BatchLedger), partition=sql.SQL(""), limit=sql.SQL(""))
_PARTITION_ROWS_SINCE = _ROWS_SQL.format(ledger=table(BatchLedger), partition=sql.SQL(" AND partition = %s"),
                                         limit=sql.SQL(" LIMIT %s"))
_SWEEP_SQL = sql.SQL("SELECT id, partition, first_offset, end_offset, superseded_from, records, batches "
                     "FROM {} WHERE pipeline_id = %s AND partition = %s "
                     "ORDER BY first_offset, LEAST(end_offset, COALESCE(superseded_from, end_offset)), id"
                     ).format(table(BatchLedger))
_POSITIONS_SQL = sql.SQL("SELECT partition FROM {} WHERE pipeline_id = %s").format(table(PartitionOffset))
_ROWS_EXIST_SQL = sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE pipeline_id = %s AND id > %s)"
                          ).format(table(BatchLedger))


class OutOfOrder(Exception):
    """A row sorts before the last one folded: the partition must be folded again in sweep order."""


@dataclass
class Summary:
    partition: int
    first: int | None = None         # the lowest covered position
    end: int | None = None           # the highest covered end (exclusive)
    batches: int = 0                 # committed batches in rows that cover something (compacted rows count theirs)
    holes: int = 0                   # positions crossed without a record, in rows no rewind trimmed
    gaps: list = field(default_factory=list)
    overlaps: list = field(default_factory=list)
    rewinds: list = field(default_factory=list)   # distinct positions rewinds trimmed rows to
    holey: list = field(default_factory=list)     # ranges of batches that crossed holes (adjacent ones merged)
    last: list | None = None         # (first, covered end) of the last row folded: the sweep's order

    def fold(self, first: int, end: int, superseded_from, records: int, batches: int) -> None:
        """Add one ledger row; raises OutOfOrder for a row that sorts before the last one."""
        covered_end = min(end, superseded_from) if superseded_from is not None else end
        if superseded_from is not None and superseded_from not in self.rewinds and len(self.rewinds) < MAX_MARKS:
            self.rewinds.append(superseded_from)
            self.rewinds.sort()
        if superseded_from is None and records < end - first:
            self.holes += end - first - records
            if self.holey and self.holey[-1][1] >= first:
                self.holey[-1] = [self.holey[-1][0], max(end, self.holey[-1][1])]
            elif len(self.holey) < MAX_MARKS:
                self.holey.append([first, end])
        if covered_end <= first:
            return  # trimmed away by a rewind: covers nothing
        if self.last is not None and [first, covered_end] < self.last:
            raise OutOfOrder(self.partition)
        self.last = [first, covered_end]
        self.batches += batches
        if self.first is None:
            self.first, self.end = first, covered_end
            return
        if first > self.end and len(self.gaps) < MAX_MARKS:
            self.gaps.append([self.end, first])
        elif first < self.end and len(self.overlaps) < MAX_MARKS:
            self.overlaps.append([first, min(covered_end, self.end)])
        self.end = max(self.end, covered_end)

    @classmethod
    def from_state(cls, partition: int, state: dict) -> "Summary":
        known = {k: v for k, v in (state or {}).items() if k in cls.__dataclass_fields__ and k != "partition"}
        return cls(partition, **known)

    def state(self) -> dict:
        data = asdict(self)
        data.pop("partition")
        return data


def _fold_rows(summaries: dict[int, Summary], rows) -> int:
    """Fold (id, partition, first, end, superseded_from, records, batches) rows; returns the highest id."""
    highest = 0
    for row_id, partition, first, end, superseded_from, records, batches in rows:
        summary = summaries.setdefault(partition, Summary(partition))
        summary.fold(first, end, superseded_from, records, batches)
        highest = max(highest, row_id)
    return highest


def _chunks(cursor, statement: sql.Composable, params: list):
    """The rows of a statement, FETCH_ROWS at a time (a fold of millions of rows never holds them all)."""
    cursor.execute(statement, params)
    while rows := cursor.fetchmany(FETCH_ROWS):
        yield from rows


def _sweep(pipeline_id: int, partition: int) -> tuple[Summary, int]:
    """The partition folded from scratch in sweep order; (summary, highest id)."""
    summaries = {partition: Summary(partition)}
    with transaction.atomic(), connection.connection.cursor(name="tally_ledger_sweep") as cursor:
        highest = _fold_rows(summaries, _chunks(cursor, _SWEEP_SQL, [pipeline_id, partition]))
    return summaries[partition], highest


def _positions(cursor, pipeline_id: int) -> set[int]:
    cursor.execute(_POSITIONS_SQL, [pipeline_id])
    return {p for (p,) in cursor.fetchall()}


def read(pipeline_id: int) -> dict[int, Summary]:
    """{partition: Summary} as of now: the stored summaries plus the rows committed since. Writes nothing."""
    stored = {s.partition: s for s in LedgerSummary.objects.filter(pipeline_id=pipeline_id)}
    summaries = {p: Summary.from_state(p, s.state) for p, s in stored.items()}
    with connection.cursor() as cursor:
        # A partition without a summary (never refreshed, or just rewound) is folded from its first row.
        floor = 0 if _positions(cursor, pipeline_id) - set(stored) else min((s.upto_id for s in stored.values()),
                                                                               default=0)
        redo = set()
        for row_id, partition, *row in _chunks(cursor, _ROWS_SINCE, [pipeline_id, floor]):
            mark = stored[partition].upto_id if partition in stored else 0
            if row_id <= mark or partition in redo:
                continue
            try:
                summaries.setdefault(partition, Summary(partition)).fold(*row)
            except OutOfOrder:
                redo.add(partition)
    for partition in redo:
        summaries[partition], _ = _sweep(pipeline_id, partition)
    return summaries


def refresh(pipeline_id: int) -> int:
    """Fold the rows committed since each partition's summary (at most REFRESH_ROWS per partition) and store
    it; returns the number of rows folded."""
    marks = dict(LedgerSummary.objects.filter(pipeline_id=pipeline_id).values_list("partition", "upto_id"))
    with connection.cursor() as cursor:
        # The idle case (every reconciliation run): nothing committed since, nothing locked or written.
        if marks and not _positions(cursor, pipeline_id) - set(marks):
            cursor.execute(_ROWS_EXIST_SQL, [pipeline_id, min(marks.values())])
            if not cursor.fetchone()[0]:
                return 0
    folded = 0
    with transaction.atomic(), connection.cursor() as cursor:
        stored = {s.partition: s for s in LedgerSummary.objects.select_for_update().filter(pipeline_id=pipeline_id)}
        for partition in sorted(_positions(cursor, pipeline_id) | set(stored)):
            entry = stored.get(partition) or LedgerSummary(pipeline_id=pipeline_id, partition=partition)
            summary = Summary.from_state(partition, entry.state)
            rows = list(_chunks(cursor, _PARTITION_ROWS_SINCE, [pipeline_id, entry.upto_id, partition, REFRESH_ROWS]))
            if not rows and entry.pk is not None:
                continue
            try:
                highest = _fold_rows({partition: summary}, rows)
            except OutOfOrder:
                summary, highest = _sweep(pipeline_id, partition)
            entry.state, entry.upto_id = summary.state(), max(entry.upto_id, highest)
            # Only the summary's own fields: compaction's mark is compaction's.
            entry.save(update_fields=None if entry.pk is None else ["state", "upto_id", "updated_at"])
            folded += len(rows)
    return folded
