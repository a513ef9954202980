"""The matching of a watch's records against the team's table: one definition, as SQL.

Input, one row per record read from the topic (the relation `records`):
    partition, "offset", rid (the record's id in the row-id column's type; NULL: it has none, or an ignore
    spec matched it: no row expected), expected (false for ignored records), tomb (a tombstone: null value),
    ts (the record's timestamp), tail (read beyond the settled range, or keyed, read back from positions
    earlier checks settled: only tells whether a later record of the same id exists; never judged itself),
    k (keyed `value` and `json:PATH` ids: the record key, hex; else NULL)
and the team's table. Output, one row per finding: (partition, "offset", kind, extra) with kind
    lost        a record with no row (keyed: its id's latest record has no row, or a tombstone's row is still
                there -- the delete was lost);
    duplicated  a record with more rows than records that name them; `extra` = the rows beyond those;
    phantom     (offset ids, not on a compacted topic) a row at a position of the range that holds no record.
Ids repeated in the range (not keyed): n records and m rows of one id deliver its first m records; the
rest are lost, and m - n extra rows are counted on its first record.

The statements are plain SQL over named relations, so the Spark path runs the same text on its own
DataFrames registered under the same names (`records`, `written`).
"""
from psycopg2 import sql

# Rows of the team's table per id, restricted to the ids the records name (a semi-join: for a small range
# PostgreSQL looks the ids up in the table's index; for a large one it hashes them and scans once).
WRITTEN_BY_ID = """
SELECT {col} AS rid, count(*) AS n_rows FROM {table}
WHERE {col} IN (SELECT rid FROM {records} WHERE NOT tail AND rid IS NOT NULL) GROUP BY {col}
"""

WRITTEN_BY_OFFSET = """
SELECT {part} AS partition, {off} AS "offset", count(*) AS n_rows FROM {table}
WHERE ({part}, {off}) IN (SELECT partition, "offset" FROM {records} WHERE NOT tail) GROUP BY {part}, {off}
"""

# Per record: each id's records and the team's rows of it counted in one aggregate (one hash over the
# range, no join of two counted relations); only the ids whose counts differ (almost none in a healthy
# range) are numbered in offset order, so a range of millions sorts a handful of records.
MATCH_BY_ID = """
WITH odd AS (
    SELECT rid, sum(n_records) AS n_records, sum(n_rows) AS n_rows FROM (
        SELECT rid, 1 AS n_records, 0 AS n_rows FROM {records} WHERE NOT tail AND rid IS NOT NULL
        UNION ALL
        SELECT {col}, 0, 1 FROM {table}
        WHERE {col} IN (SELECT rid FROM {records} WHERE NOT tail AND rid IS NOT NULL)
    ) counted GROUP BY rid HAVING sum(n_records) <> sum(n_rows)
), numbered AS (
    SELECT r.partition, r."offset", o.n_records, o.n_rows,
           row_number() OVER (PARTITION BY r.rid ORDER BY r.partition, r."offset") AS nth
    FROM {records} r JOIN odd o ON o.rid = r.rid
    WHERE NOT r.tail
)
SELECT partition, "offset", 'lost' AS kind, 0 AS extra FROM numbered WHERE nth > n_rows
UNION ALL
SELECT partition, "offset", 'duplicated', n_rows - n_records FROM numbered WHERE nth = 1 AND n_rows > n_records
"""

# A record's time when ranking records of one id (or key): its timestamp, or a later one of the same id before it in
# its partition. Within a partition the consumer applies records in offset order, whatever their timestamps (two
# producers with skewed clocks, event times): a record never ranks before one of its id earlier in its partition.
# Across partitions (a key written to two), time decides.
def _ranked_time(by: str) -> str:
    return (f'max(ts) OVER (PARTITION BY {by}, partition ORDER BY "offset" '
            'ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)')


# Keyed: judge each id by its latest record (latest ranked time, then offset); ids whose latest record lies in
# the tail are left for the check that settles it.
MATCH_KEYED = """
WITH latest AS (
    SELECT rid, partition, "offset", tomb, tail FROM (
        SELECT rid, partition, "offset", tomb, tail,
               row_number() OVER (PARTITION BY rid ORDER BY at DESC, "offset" DESC, partition DESC) AS newest_first
        FROM (SELECT rid, partition, "offset", tomb, tail, """ + _ranked_time("rid") + """ AS at
              FROM {records} WHERE rid IS NOT NULL) timed
    ) ranked WHERE newest_first = 1
), judged AS (
    SELECT l.partition, l."offset", l.tomb, coalesce(w.n_rows, 0) AS n_rows
    FROM latest l LEFT JOIN {written} w ON w.rid = l.rid WHERE NOT l.tail
)
SELECT partition, "offset", 'lost' AS kind, 0 AS extra FROM judged
WHERE (NOT tomb AND n_rows = 0) OR (tomb AND n_rows > 0)
UNION ALL
SELECT partition, "offset", 'duplicated', n_rows - 1 FROM judged WHERE NOT tomb AND n_rows > 1
"""

# Keyed, ids read from the value: a tombstone has no value, so no id of its own. It deletes the row of its key's
# latest readable record before it (by ranked time, then offset, then partition), among the records read: the id of
# each tombstone that has one. `readable` numbers the key's readable records in that order, so a tombstone shares its
# number with the readable record before it, the first of its group. Ignored records name no row and start no group.
TOMBSTONE_IDS = """
SELECT partition, "offset", rid FROM (
    SELECT partition, "offset", tomb,
           first_value(rid) OVER (PARTITION BY k, readable ORDER BY at, "offset", partition) AS rid
    FROM (
        SELECT partition, "offset", rid, tomb, k, at,
               count(rid) OVER (PARTITION BY k ORDER BY at, "offset", partition
                                ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS readable
        FROM (SELECT partition, "offset", rid, tomb, k, """ + _ranked_time("k") + """ AS at
              FROM {records} WHERE k IS NOT NULL AND (rid IS NOT NULL OR (tomb AND expected))) timed
    ) counted
) grouped WHERE tomb AND rid IS NOT NULL
"""

# Keyed: the timestamp of the oldest record the check judges (or NULL). Only a record at least as new can be newer
# than one of them, so the positions earlier checks settled are read back from there (watch_settled).
OLDEST_JUDGED = """
SELECT min(ts) FROM {records} WHERE NOT tail AND (rid IS NOT NULL OR k IS NOT NULL)
"""

# Keyed: of the records read back from positions earlier checks settled (the relation `settled`, all tail), those of
# an id or a key the check judges: they take part in the ranking, never judged themselves (watch_settled).
SETTLED_BEFORE = """
SELECT * FROM {settled} s
WHERE s.rid IN (SELECT rid FROM {records} WHERE NOT tail AND rid IS NOT NULL)
   OR s.k IN (SELECT k FROM {records} WHERE NOT tail AND k IS NOT NULL)
"""

# Keyed: records that a later record of their id replaced (not judged, counted).
SUPERSEDED_KEYED = """
SELECT partition, count(*) FROM (
    SELECT partition, tail,
           row_number() OVER (PARTITION BY rid ORDER BY at DESC, "offset" DESC, partition DESC) AS newest_first
    FROM (SELECT rid, partition, "offset", tail, """ + _ranked_time("rid") + """ AS at
          FROM {records} WHERE rid IS NOT NULL) timed
) ranked WHERE newest_first > 1 AND NOT tail GROUP BY partition
"""

MATCH_BY_OFFSET = """
SELECT r.partition, r."offset", 'lost' AS kind, 0 AS extra FROM {records} r
LEFT JOIN {written} w ON w.partition = r.partition AND w."offset" = r."offset"
WHERE NOT r.tail AND r.expected AND w.n_rows IS NULL
UNION ALL
SELECT w.partition, w."offset", 'duplicated', w.n_rows - 1 FROM {written} w
JOIN {records} r ON w.partition = r.partition AND w."offset" = r."offset" WHERE w.n_rows > 1
"""

# Offset ids: rows at positions of the settled ranges that hold no record (a marker, an aborted record). Not on a
# compacted topic: there a position without a record may be one the consumer read before compaction removed it.
PHANTOM_BY_OFFSET = """
SELECT t.{part}, t.{off}, 'phantom' AS kind, 0 AS extra FROM {table} t
JOIN {ranges} g ON t.{part} = g.partition AND t.{off} >= g.start AND t.{off} < g."end"
WHERE NOT EXISTS (SELECT 1 FROM {records} r WHERE r.partition = t.{part} AND r."offset" = t.{off})
"""

# Offset ids on a compacted topic: a position without a record held one record at most, so a second row there is
# a duplicate even when the first cannot be judged.
DUPLICATED_AT_HOLES = """
SELECT t.{part}, t.{off}, 'duplicated' AS kind, count(*) - 1 AS extra FROM {table} t
JOIN {ranges} g ON t.{part} = g.partition AND t.{off} >= g.start AND t.{off} < g."end"
WHERE NOT EXISTS (SELECT 1 FROM {records} r WHERE r.partition = t.{part} AND r."offset" = t.{off})
GROUP BY t.{part}, t.{off} HAVING count(*) > 1
"""


RELATIONS = ("records", "written", "ranges")


def _table(table: str | tuple[str, ...]) -> sql.Identifier:
    """The team's table: a name, or (schema, table) parts (consumers/engine/table_names.py)."""
    return sql.Identifier(*table) if isinstance(table, tuple) else sql.Identifier(table)


def _names(relations: dict) -> dict:
    return {name: relations[name] for name in RELATIONS}


def needs_written(by_offset: bool, keyed: bool) -> bool:
    """Whether the findings statement reads the relation `written` (the plain id match counts the team's rows
    itself, in the same aggregate as the records)."""
    return by_offset or keyed


def written_sql(table: str | tuple[str, ...], columns: list[str], by_offset: bool, relations: dict) -> sql.Composed:
    """The team's rows counted per id (or per partition and offset) that the records name."""
    ids = [sql.Identifier(c) for c in columns]
    if by_offset:
        return sql.SQL(WRITTEN_BY_OFFSET).format(part=ids[0], off=ids[1], table=_table(table),
                                                 **_names(relations))
    return sql.SQL(WRITTEN_BY_ID).format(col=ids[0], table=_table(table), **_names(relations))


def findings_sql(table: str | tuple[str, ...], columns: list[str], by_offset: bool, keyed: bool,
                 relations: dict, *, phantoms: bool = True) -> sql.Composed:
    """The statement that lists every finding, given the relations `records`, `written` and `ranges` (their
    names in `relations`, as psycopg2.sql objects). `phantoms`: whether a row at a position without a record is
    one (not on a compacted topic, where the consumer may have read a record compaction removed since)."""
    if by_offset:
        part, off = (sql.Identifier(c) for c in columns)
        phantom = sql.SQL(PHANTOM_BY_OFFSET if phantoms else DUPLICATED_AT_HOLES).format(
            part=part, off=off, table=_table(table), **_names(relations))
        return sql.SQL("{} UNION ALL {}").format(sql.SQL(MATCH_BY_OFFSET).format(**_names(relations)), phantom)
    if keyed:
        return sql.SQL(MATCH_KEYED).format(**_names(relations))
    return sql.SQL(MATCH_BY_ID).format(col=sql.Identifier(columns[0]), table=_table(table),
                                       **_names(relations))


def tombstone_ids_sql(relations: dict) -> sql.Composed:
    """(partition, "offset", rid) of the tombstones that name a row through their key (TOMBSTONE_IDS)."""
    return sql.SQL(TOMBSTONE_IDS).format(**_names(relations))


def oldest_judged_sql(relations: dict) -> sql.Composed:
    return sql.SQL(OLDEST_JUDGED).format(**_names(relations))


def settled_before_sql(relations: dict) -> sql.Composed:
    """The records of `relations["settled"]` that name an id or key the check judges (SETTLED_BEFORE)."""
    return sql.SQL(SETTLED_BEFORE).format(settled=relations["settled"], **_names(relations))


def superseded_sql(relations: dict) -> sql.Composed:
    return sql.SQL(SUPERSEDED_KEYED).format(**_names(relations))
