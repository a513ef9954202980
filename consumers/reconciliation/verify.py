"""Verify one partition's offset range against the ledger and the sink (the SQL half of reconciliation).

Every consumed offset must have exactly one outcome: one row (or, for multi-row transforms, one set of
rows numbered by `source_row`) or exactly one dead letter. Counts come from one cheap aggregate per
range over the provenance index: a count bounded by [start, end) (so min and max are implied), plus a
distinct count only where no unique index proves "no duplicate". When `rows + dead letters == end -
start` with no duplicate, the range is proven and nothing else is read. Only a range that fails the
cheap check is searched for *where* (islands over the present offsets with `lag()`); an anti-join
against `generate_series` is never used (several times slower).

The ledger is checked apart from the sink: its ranges (trimmed by rewinds: a row with `superseded_from`
covers only `[first_offset, min(end_offset, superseded_from))`) must tile the range with no gap and no
overlap -- gaps and overlaps as consumers/reconciliation/coverage.py defines them, the same definition the
offset timeline draws.

Ranges are of positions; counts are of records. Real logs have holes -- positions that hold no data
record (transaction markers, aborted records under read_committed, compacted records) -- so an offset
with neither a row nor a dead letter is lost only if the topic holds a record there. The ledger counts the
records each batch's fetch returned: when the ledger rows of a range are whole and their counts match
what the sink holds, every absent offset is a hole and nothing else is read. Otherwise the absent ranges
are checked against the topic itself (`held`, a read_committed read of exactly those ranges): records
the topic holds there are lost, the rest are holes (docs/reconciliation.md).

Findings are `Finding`s (consumers/reconciliation/findings.py): kind, [start, end), count, ...; counts are numbers
of records.
"""
from dataclasses import dataclass, field, replace

from psycopg2 import sql

from consumers.engine import tables
from consumers.engine.sinks import PROVENANCE
from consumers.models import DeadLetter
from consumers.reconciliation.coverage import ledger_coverage
from consumers.reconciliation.findings import Finding

_DEAD_LETTERS = tables.table(DeadLetter)

# More findings than this per kind are folded: the oldest into one covering finding (counts stay exact), so
# a partition that dead-letters every other record does not store millions of ranges.
MAX_FINDINGS_PER_KIND = 100
# Sample offsets kept in a duplicated finding, for the operator and the alert email.
SAMPLE_OFFSETS = 10


@dataclass(frozen=True)
class SinkShape:
    """What the verification needs to know about a pipeline's sink table."""

    table: str
    topic: str
    multi_row: bool
    unique_key: bool   # a unique index on the provenance key proves "no duplicate row" for free


@dataclass
class RangeResult:
    start: int
    end: int
    records: int = 0        # records in the range: positions minus holes
    rows: int = 0
    lost: int = 0
    holes: int = 0          # positions holding no data record (markers, aborted, compacted): never lost
    duplicated: int = 0
    dead_lettered: int = 0
    gap: int = 0
    overlap: int = 0
    proven: bool = True     # the cheap aggregate alone proved the range exact
    findings: list[Finding] = field(default_factory=list)


def sink_shape(cur, table: str, topic: str, multi_row: bool) -> SinkShape:
    """Read from the catalog whether the sink has a unique index on exactly its provenance key."""
    key = sorted(PROVENANCE + (("source_row",) if multi_row else ()))
    cur.execute("SELECT coalesce(bool_or(i.indisunique AND i.indpred IS NULL AND (SELECT array_agg(a.attname::text "
                "ORDER BY a.attname::text) FROM pg_attribute a WHERE a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey)) = %s::text[]), false) FROM pg_index i "
                "WHERE i.indrelid = to_regclass(%s)", [key, sql.Identifier(table).as_string(cur)])
    unique = bool(cur.fetchone()[0])
    return SinkShape(table, topic, multi_row, unique)


def verify_range(cur, shape: SinkShape, pipeline_id: int, partition: int, start: int, end: int,
                 ledger: list[tuple], held=None) -> RangeResult:
    """Verify [start, end) of one partition. `ledger` holds the (first, effective end[, records, whole])
    of the ledger rows that reach into it: `records` is the count the batch's fetch returned and `whole`
    whether the row lies entirely in the range, untrimmed (gaps and overlaps are read from the ledger table
    itself, coverage.py). `held(ranges)` returns the number of records the topic holds in each [s, e) of
    `ranges` (None: every absent offset counts as lost). Lost and gap findings come back unfolded: the caller
    marks what a rewind skipped first, then folds (reconcile.py)."""
    result = RangeResult(start, end, records=max(0, end - start))
    if end <= start:
        return result
    _ledger_findings(cur, result, pipeline_id, partition)
    counts = _aggregate(cur, shape, pipeline_id, partition, start, end)
    rows, distinct_offsets, distinct_rows, dead, collisions = counts
    result.rows, result.dead_lettered = rows, dead
    present = distinct_offsets + dead - collisions
    absent = result.records - present
    located_lost = None
    if absent and _ledger_accounts_for(result, ledger, present):
        result.holes = absent  # the batches' own fetches returned exactly what the sink holds
    elif absent and held is not None:
        located_lost = _split_absent(result, _absent_findings(cur, shape, pipeline_id, partition, start, end), held)
    result.records -= result.holes
    result.lost = absent - result.holes
    # Single-row: every row beyond the first of an offset is an extra copy. Multi-row: a record's copy is
    # a repeated (offset, source_row); a dead-lettered record that also has rows produced rows it should not.
    extra_rows = rows - (distinct_rows if shape.multi_row else distinct_offsets)
    result.proven = result.lost == 0 and extra_rows == 0 and collisions == 0
    if dead:
        result.findings += _dead_letter_findings(cur, pipeline_id, partition, start, end)
    if not result.proven:
        if result.lost:
            result.findings += (located_lost if located_lost is not None
                                else _lost_findings(cur, shape, pipeline_id, partition, start, end))
        if extra_rows or collisions:
            duplicated = _duplicated_findings(cur, shape, pipeline_id, partition, start, end)
            result.findings += duplicated
            result.duplicated = sum(f.count for f in duplicated)
    return result


def _ledger_accounts_for(result: RangeResult, ledger: list[tuple], present: int) -> bool:
    """The ledger rows tile the range exactly (no gap, no overlap), each whole, and their record counts sum
    to `present`."""
    if not ledger or result.gap or result.overlap or any(len(row) < 4 or not row[3] for row in ledger):
        return False
    return sum(row[2] for row in ledger) == present


def _split_absent(result: RangeResult, absent: list[Finding], held) -> list[Finding]:
    """Ask the topic which absent offsets hold records: islands of those are lost, the rest are holes.
    Returns the lost findings (hole findings go to the result)."""
    lost, holes = [], []
    for finding, offsets in zip(absent, held([(f.start, f.end) for f in absent]), strict=True):
        offsets = set(offsets)
        island_start, island_kind = finding.start, None
        for o in range(finding.start, finding.end + 1):
            kind = None if o == finding.end else ("lost" if o in offsets else "hole")
            if kind != island_kind:
                if island_kind is not None:
                    (lost if island_kind == "lost" else holes).append(
                        Finding(island_kind, island_start, o, o - island_start))
                island_start, island_kind = o, kind
        result.holes += (finding.end - finding.start) - len(offsets)
    result.findings += fold(holes)
    return lost


def _sink_filter(shape: SinkShape, partition: int, start: int, end: int):
    return (sql.SQL("source_topic = %s AND source_partition = %s AND source_offset >= %s AND source_offset < %s"),
            [shape.topic, partition, start, end])


def _aggregate(cur, shape: SinkShape, pipeline_id: int, partition: int, start: int, end: int):
    """(rows, distinct offsets, distinct (offset, source_row), dead letters, offsets with both)."""
    table = sql.Identifier(shape.table)
    where, params = _sink_filter(shape, partition, start, end)
    cur.execute(sql.SQL("SELECT count(*) FROM {} WHERE {}").format(table, where), params)
    rows = cur.fetchone()[0]
    distinct_offsets = distinct_rows = rows
    if rows and (shape.multi_row or not shape.unique_key):
        # Only where no unique index proves it (count == max - min + 1 alone does not: a duplicate can hide
        # a hole). GROUP BY over the index streams in order (no sort, unlike count(DISTINCT)).
        cur.execute(sql.SQL("SELECT count(*) FROM (SELECT source_offset FROM {} WHERE {} "
                            "GROUP BY source_offset) AS o").format(table, where), params)
        distinct_offsets = cur.fetchone()[0]
        if shape.multi_row and not shape.unique_key:
            cur.execute(sql.SQL("SELECT count(*) FROM (SELECT source_offset, source_row FROM {} WHERE {} "
                                "GROUP BY source_offset, source_row) AS r").format(table, where), params)
            distinct_rows = cur.fetchone()[0]
    cur.execute(sql.SQL('SELECT count(*) FROM {} WHERE pipeline_id = %s AND partition = %s '
                        'AND "offset" >= %s AND "offset" < %s').format(_DEAD_LETTERS),
                [pipeline_id, partition, start, end])
    dead = cur.fetchone()[0]
    collisions = 0
    if dead and rows:
        cur.execute(sql.SQL('SELECT count(*) FROM {} d WHERE d.pipeline_id = %s '
                            'AND d.partition = %s AND d."offset" >= %s AND d."offset" < %s AND EXISTS '
                            '(SELECT 1 FROM {} s WHERE s.source_topic = %s AND s.source_partition = %s '
                            'AND s.source_offset = d."offset")').format(_DEAD_LETTERS, table),
                    [pipeline_id, partition, start, end, shape.topic, partition])
        collisions = cur.fetchone()[0]
    return rows, distinct_offsets, distinct_rows, dead, collisions


def _lost_findings(cur, shape: SinkShape, pipeline_id: int, partition: int, start: int,
                   end: int) -> list[Finding]:
    return _absent_findings(cur, shape, pipeline_id, partition, start, end)


def _absent_findings(cur, shape: SinkShape, pipeline_id: int, partition: int, start: int,
                     end: int) -> list[Finding]:
    """Ranges of offsets with neither a row nor a dead letter: the spaces between consecutive present
    offsets (sentinels start-1 and end close the range)."""
    where, params = _sink_filter(shape, partition, start, end)
    cur.execute(sql.SQL(
        'WITH present AS (SELECT source_offset AS o FROM {} WHERE {} GROUP BY source_offset '
        '  UNION SELECT "offset" FROM {} WHERE pipeline_id = %s AND partition = %s '
        '  AND "offset" >= %s AND "offset" < %s '
        '  UNION ALL SELECT %s::bigint UNION ALL SELECT %s::bigint), '
        'steps AS (SELECT o, lag(o) OVER (ORDER BY o) AS prev FROM present) '
        'SELECT prev + 1, o FROM steps WHERE o - prev > 1 ORDER BY o').format(sql.Identifier(shape.table), where,
                                                                               _DEAD_LETTERS),
        params + [pipeline_id, partition, start, end, start - 1, end])
    return [Finding("lost", s, e, e - s) for s, e in cur.fetchall()]


def _duplicated_findings(cur, shape: SinkShape, pipeline_id: int, partition: int, start: int,
                         end: int) -> list[Finding]:
    """Offsets with extra copies, as islands of consecutive offsets; count = extra copies of records."""
    table = sql.Identifier(shape.table)
    where, params = _sink_filter(shape, partition, start, end)
    if shape.multi_row:
        per_offset = sql.SQL("SELECT source_offset AS o, max(n) - 1 AS extra FROM (SELECT source_offset, "
                             "count(*) AS n FROM {} WHERE {} GROUP BY source_offset, source_row) AS r "
                             "GROUP BY source_offset HAVING max(n) > 1").format(table, where)
    else:
        per_offset = sql.SQL("SELECT source_offset AS o, count(*) - 1 AS extra FROM {} WHERE {} "
                             "GROUP BY source_offset HAVING count(*) > 1").format(table, where)
    # A dead-lettered record that also has rows: the transform produced nothing, so every row is extra.
    with_rows = sql.SQL('SELECT d."offset" AS o, (SELECT count(*) FROM {} s WHERE s.source_topic = %s '
                        'AND s.source_partition = %s AND s.source_offset = d."offset") AS extra '
                        'FROM {} d WHERE d.pipeline_id = %s AND d.partition = %s '
                        'AND d."offset" >= %s AND d."offset" < %s').format(table, _DEAD_LETTERS)
    cur.execute(sql.SQL(
        "WITH extra AS ({} UNION ALL SELECT o, extra FROM ({}) AS dl WHERE extra > 0), "
        "islands AS (SELECT o, extra, o - row_number() OVER (ORDER BY o) AS island FROM extra) "
        "SELECT min(o), max(o) + 1, sum(extra)::bigint, (array_agg(o ORDER BY o))[1:%s] "
        "FROM islands GROUP BY island ORDER BY 1").format(per_offset, with_rows),
        params + [shape.topic, partition, pipeline_id, partition, start, end, SAMPLE_OFFSETS])
    return fold([Finding("duplicated", s, e, int(n), offsets=tuple(sample)) for s, e, n, sample in cur.fetchall()])


def _dead_letter_findings(cur, pipeline_id: int, partition: int, start: int, end: int) -> list[Finding]:
    cur.execute(sql.SQL('SELECT min("offset"), max("offset") + 1, count(*) FROM (SELECT "offset", "offset" - '
                        'row_number() OVER (ORDER BY "offset") AS island FROM {} WHERE pipeline_id = %s '
                        'AND partition = %s AND "offset" >= %s AND "offset" < %s) AS d GROUP BY island ORDER BY 1'
                        ).format(_DEAD_LETTERS),
                [pipeline_id, partition, start, end])
    return fold([Finding("dead_letter", s, e, n) for s, e, n in cur.fetchall()])


def _ledger_findings(cur, result: RangeResult, pipeline_id: int, partition: int) -> None:
    """Gaps (positions no ledger row covers) and overlaps (positions covered more than once) in the range."""
    coverage = ledger_coverage(cur, pipeline_id, partition=partition, within=(result.start, result.end))[partition]
    result.gap = sum(e - s for s, e in coverage.gaps)
    result.overlap = sum(e - s for s, e in coverage.overlaps)
    result.findings += [Finding("gap", s, e, e - s) for s, e in coverage.gaps]
    result.findings += fold([Finding("overlap", s, e, e - s) for s, e in sorted(coverage.overlaps)])


def fold(findings: list[Finding]) -> list[Finding]:
    """At most MAX_FINDINGS_PER_KIND findings per kind: the oldest (lowest offsets) are folded into one
    covering finding, so the recent ones stay precise and the stored list stays bounded run after run. Planned
    findings (a rewind forward skipped them) fold apart from the others, so neither count takes the other's."""
    by_kind: dict[str, list[Finding]] = {}
    for finding in findings:
        by_kind.setdefault(finding.kind, []).append(finding)
    result = []
    for same in by_kind.values():
        planned = [f for f in same if f.planned]
        if planned and len(planned) < len(same):
            result += sorted(_fold_kind([f for f in same if not f.planned]) + _fold_kind(planned),
                             key=lambda f: f.start)
        else:
            result += _fold_kind(same)
    return result


def _fold_kind(same: list[Finding]) -> list[Finding]:
    if len(same) > MAX_FINDINGS_PER_KIND:
        same = sorted(same, key=lambda f: f.start)
        old, same = same[:len(same) - MAX_FINDINGS_PER_KIND + 1], same[len(same) - MAX_FINDINGS_PER_KIND + 1:]
        folded = replace(old[0], offsets=None, end=max(f.end for f in old), count=sum(f.count for f in old),
                         folded=sum(f.folded or 1 for f in old))
        same.insert(0, folded)
    return same
