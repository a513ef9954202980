"""What the batch ledger covers, per partition: bounds, gaps and overlaps. The one definition, read by
reconciliation (verify.py, over the range it verifies) and by the offset timeline (dashboard/timeline.py,
over the whole ledger), so the two never disagree about where a gap is.

A ledger row covers positions [first_offset, end_offset), trimmed to [first_offset, superseded_from) once a
rewind superseded it (docs/architecture.md "Rewinds"). The rows are swept in (first, end) order: a row that
starts above everything covered before it leaves a gap, one that starts below it overlaps. Coverage is of
positions, not records: a batch that crossed holes (transaction markers, aborted or compacted records;
`records` below its width) still covers them, so a hole is never a gap.

One window query in PostgreSQL returns only where coverage is not continuous (plus one bounds row per
partition), so its answer does not grow with the number of healthy batches. Within a range it reads only the
rows that reach into it, through the ledger's range index (SPAN_OVERLAPS), so verifying what is new costs what
is new. The whole ledger's coverage is for tests and small ledgers: pages read the ledger summary
(consumers/reconciliation/ledger_summary.py), which folds rows the same way.
"""
from dataclasses import dataclass, field

from psycopg2 import sql

from consumers.engine.tables import table
from consumers.models import BatchLedger

# Rows whose closed range [first_offset, end_offset] meets [%(start)s, %(end)s]: the ledger's range index
# (ledger_span_idx) answers it; a superset (zero-width rows and rows that only touch are in), so every query that
# uses it keeps its exact bounds too.
SPAN_OVERLAPS = ("int8range(first_offset, end_offset, '[]') && int8range(%(start)s::bigint, %(end)s::bigint, '[]')")

_COVERAGE_SQL = sql.SQL("""
WITH trimmed AS (
    SELECT partition, GREATEST(first_offset, %(start)s) AS f,
           LEAST(end_offset, COALESCE(superseded_from, end_offset), %(end)s) AS e
    FROM {ledger}
    WHERE pipeline_id = %(pipeline)s AND (%(partition)s::int IS NULL OR partition = %(partition)s::int){within}
), covered AS (
    SELECT partition, f, e FROM trimmed WHERE e > f
), swept AS (
    -- Within a range, a zero-width row at its end closes it: coverage that stops short of it is a gap.
    SELECT partition, f, e FROM covered
    UNION ALL SELECT %(partition)s::int, %(end)s::bigint, %(end)s::bigint WHERE %(end)s::bigint IS NOT NULL
), ordered AS (
    SELECT partition, f, e,
           COALESCE(MAX(e) OVER (PARTITION BY partition ORDER BY f, e
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), %(start)s::bigint) AS covered_to
    FROM swept
)
SELECT 'bounds' AS kind, partition, MIN(f), MAX(e), COUNT(*) FROM covered GROUP BY partition
UNION ALL
SELECT CASE WHEN f > covered_to THEN 'gap' ELSE 'overlap' END, partition,
       CASE WHEN f > covered_to THEN covered_to ELSE f END,
       CASE WHEN f > covered_to THEN f ELSE LEAST(e, covered_to) END, NULL::bigint
FROM ordered WHERE covered_to IS NOT NULL AND f <> covered_to
ORDER BY 2, 3
""")
# Composed once each: the whole ledger, and only the rows that reach into a range.
_WHOLE = _COVERAGE_SQL.format(ledger=table(BatchLedger), within=sql.SQL(""))
_WITHIN = _COVERAGE_SQL.format(ledger=table(BatchLedger), within=sql.SQL(" AND " + SPAN_OVERLAPS))


@dataclass
class Coverage:
    partition: int
    first: int | None = None      # the lowest covered position
    end: int | None = None        # the highest covered end (exclusive)
    batches: int = 0              # ledger rows that cover something
    gaps: list[tuple[int, int]] = field(default_factory=list)      # [start, end) no row covers
    overlaps: list[tuple[int, int]] = field(default_factory=list)  # [start, end) covered again, in sweep order


def ledger_coverage(cursor, pipeline_id: int, *, partition: int | None = None,
                    within: tuple[int, int] | None = None) -> dict[int, Coverage]:
    """{partition: Coverage} of the pipeline's ledger (of one partition if given). `within=(start, end)`, for
    one partition: only [start, end) counts, and positions in it that no row covers -- at its start, its end,
    or all of it when no row reaches in -- are gaps. Works on a Django or a raw psycopg2 cursor."""
    start, end = within if within is not None else (None, None)
    if within is not None and partition is None:
        raise ValueError("a range of positions belongs to one partition")
    if within is not None and end <= start:
        return {partition: Coverage(partition)}
    cursor.execute(_WITHIN if within is not None else _WHOLE,
                   {"pipeline": pipeline_id, "partition": partition, "start": start, "end": end})
    result: dict[int, Coverage] = {}
    if within is not None:
        result[partition] = Coverage(partition)
    for kind, p, lo, hi, batches in cursor.fetchall():
        coverage = result.setdefault(p, Coverage(p))
        if kind == "bounds":
            coverage.first, coverage.end, coverage.batches = lo, hi, batches
        elif kind == "gap":
            coverage.gaps.append((lo, hi))
        else:
            coverage.overlaps.append((lo, hi))
    return result
