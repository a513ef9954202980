"""Verify one partition's offset range of an upsert pipeline (`--upsert-key`): one row per key, kept current.

In append mode every record has its row; here a record overwritten by a later record with the same key
leaves no row of its own, and a tombstone leaves none at all. So the range is checked against the topic
itself (a read_committed read of [start, end), the records the pipeline consumed), with the pipeline's own
transform telling each record's key:
  * a record whose key has a later record in the range is **superseded**, not lost;
  * the last record of each key must be the one the key's row holds (the row's provenance columns name the
    record that wrote it), or, for a tombstone with `--delete-on-tombstone`, the key must have no row;
    a row written from a later position (beyond this range) or from another partition is newer, so it counts;
  * a dead-lettered record takes no part (its key's earlier record stands);
  * a key whose row holds an older record, or lacks the row it should have, has **lost** its last record.
Positions holding no record (markers, aborted or compacted records) are holes, as in append mode. The ledger's
gaps and overlaps are checked as in append mode (consumers/reconciliation/verify.py).
"""
from psycopg2 import sql

from consumers.engine import tables, upsert
from consumers.engine.transforms import SourceRecord, Transform
from consumers.models import DeadLetter
from consumers.reconciliation import verify
from consumers.reconciliation.findings import Finding
from consumers.reconciliation.verify import RangeResult, SinkShape, fold

ROW_LOOKUP_CHUNK = 1000  # keys per lookup statement: bounded statements for large ranges


def records_reader(read_ranges, topic: str, cluster=None):
    """records(partition, start, end) -> the topic's records in [start, end) as SourceRecords, or None when
    Kafka cannot be read. `read_ranges` is consumers.kafka.ranges.read_ranges, wrapped by the caller to report
    its failure (and return None)."""
    def records(partition: int, start: int, end: int):
        found: list = []
        if read_ranges(topic, {partition: (start, end)}, lambda p, batch: found.extend(batch),
                       cluster=cluster) is None:
            return None
        return [SourceRecord(r.partition, r.offset, r.key, r.value, r.timestamp, r.headers) for r in found]
    return records


def verifier(pipeline, transform: Transform, records):
    """verify.verify_range's counterpart for an upsert pipeline, with the same signature."""
    def verify(cur, shape, pipeline_id, p, start, end, ledger, held):
        return verify_upsert_range(cur, shape, pipeline_id, p, start, end, transform, tuple(pipeline.upsert_key),
                                   pipeline.delete_on_tombstone, records(p, start, end) if end > start else [])
    return verify


def verify_upsert_range(cur, shape: SinkShape, pipeline_id: int, partition: int, start: int, end: int,
                        transform: Transform, upsert_key: tuple[str, ...], delete_on_tombstone: bool,
                        records: list[SourceRecord] | None) -> RangeResult:
    """`records`: the topic's records in [start, end) in offset order (None: Kafka could not be read, so
    every position counts as lost, as in append mode)."""
    result = RangeResult(start, end, records=max(0, end - start))
    if end <= start:
        return result
    verify._ledger_findings(cur, result, pipeline_id, partition)
    dead = _dead_letter_offsets(cur, pipeline_id, partition, start, end)
    result.dead_lettered = len(dead)
    if dead:
        result.findings += verify._dead_letter_findings(cur, pipeline_id, partition, start, end)
    if records is None:
        result.lost = result.records - len(dead)
        result.findings += fold([Finding("lost", start, end, result.lost)])
        result.proven = False
        return result
    result.holes = result.records - len(records)
    result.records = len(records)
    latest, unreadable = last_record_per_key(cur, records, dead, transform, upsert_key, delete_on_tombstone)
    rows = _rows_of_keys(cur, shape, transform, upsert_key, list(latest))
    lost, current, deleted = [], 0, 0
    for key, (offset, is_delete) in latest.items():
        row = rows.get(key)
        newer = row is not None and (row[1] != partition or row[2] >= end or row[0] != shape.topic)
        if is_delete:
            if row is None or newer:
                deleted += 1
            else:
                lost.append(offset)
        elif row is not None and (row[2] == offset and row[1] == partition and row[0] == shape.topic or newer):
            current += 1
        else:
            lost.append(offset)
    lost += unreadable
    result.rows = current
    result.lost = len(lost)
    superseded = len(records) - len([r for r in records if r.offset in dead]) - len(latest) - len(unreadable)
    if superseded:
        result.findings.append(Finding("superseded", start, end, superseded))
    if deleted:
        result.findings.append(Finding("deleted", start, end, deleted))
    result.findings += fold([Finding("lost", o, o + 1, 1) for o in sorted(lost)])
    result.proven = not lost and not result.gap and not result.overlap
    return result


def last_record_per_key(cur, records, dead: set[int], transform: Transform, upsert_key: tuple[str, ...],
                        delete_on_tombstone: bool) -> tuple[dict, list[int]]:
    """({key: (offset of its last record, is a tombstone)}, offsets of records that are not dead letters
    yet cannot be keyed by the transform now). The one reading of "the latest record per key": keys are equal as
    PostgreSQL says, as the writer judges them (consumers/engine/upsert.py), and each is named by its first record."""
    names = [name for name, _ in transform.columns]
    indexes = [names.index(column) for column in upsert_key]
    keyed, unreadable = [], []
    for record in records:
        if record.offset in dead:
            continue
        try:
            if record.value is None and delete_on_tombstone and transform.tombstone_key is not None:
                keyed.append((tuple(transform.tombstone_key(record)), record.offset, True))
                continue
            row = transform.rows(record)[0]
        except Exception:  # a record the pipeline should have dead-lettered: it is neither written nor accounted
            unreadable.append(record.offset)
            continue
        keyed.append((tuple(row[i] for i in indexes), record.offset, False))
    same = upsert.same_keys(cur, upsert.key_types(transform, upsert_key), [key for key, _, _ in keyed]) or {}
    latest = {}
    for key, offset, is_delete in keyed:
        latest[same.get(key, key)] = (offset, is_delete)
    return latest, unreadable


def _dead_letter_offsets(cur, pipeline_id: int, partition: int, start: int, end: int) -> set[int]:
    cur.execute(sql.SQL('SELECT "offset" FROM {} WHERE pipeline_id = %s AND partition = %s '
                        'AND "offset" >= %s AND "offset" < %s').format(tables.table(DeadLetter)),
                [pipeline_id, partition, start, end])
    return {row[0] for row in cur.fetchall()}


def _rows_of_keys(cur, shape: SinkShape, transform: Transform, upsert_key: tuple[str, ...],
                  keys: list[tuple]) -> dict[tuple, tuple]:
    """{key: (source_topic, source_partition, source_offset)} of the rows these keys have. Keys are compared
    in the key columns' own types (the transform's values are their COPY text or numbers)."""
    types = dict(transform.columns)
    names = [sql.Identifier(c) for c in upsert_key]
    template = sql.SQL("(%s::integer, {})").format(sql.SQL(", ").join(
        sql.SQL("%s::{}").format(sql.SQL(types[c])) for c in upsert_key))  # types read from the catalog
    found = {}
    for i in range(0, len(keys), ROW_LOOKUP_CHUNK):
        chunk = keys[i:i + ROW_LOOKUP_CHUNK]
        # Each key comes back by its index in the chunk, so it matches the dict's key exactly.
        statement = sql.SQL("SELECT v.i, s.source_topic, s.source_partition, s.source_offset FROM (VALUES {}) "
                            "AS v (i, {}) JOIN {} AS s ON {}").format(
            sql.SQL(", ").join([template] * len(chunk)), sql.SQL(", ").join(names), sql.Identifier(shape.table),
            sql.SQL(" AND ").join(sql.SQL("s.{0} = v.{0}").format(n) for n in names))
        cur.execute(statement, [part for index, key in enumerate(chunk) for part in (index, *key)])
        for index, topic, partition, offset in cur.fetchall():
            found[chunk[index]] = (topic, partition, offset)
    return found


def fate(cur, table: str, topic: str, transform: Transform, upsert_key: tuple[str, ...], delete_on_tombstone: bool,
         record: SourceRecord, position: int, read_ranges, cluster=None) -> tuple[str, str, tuple | None] | None:
    """Why a consumed record of an upsert pipeline has no row of its own: (verdict, explanation, the (partition,
    offset) of the record that wrote its key's current row, if the key has one), or None when nothing explains
    it (then it is lost). A tombstone deleted its key's row; any other record was superseded by a later record of
    its key -- the row's record, or the tombstone that deleted the row."""
    key_text = None
    try:
        if record.value is None and delete_on_tombstone and transform.tombstone_key is not None:
            key = tuple(transform.tombstone_key(record))
            current = _rows_of_keys(cur, SinkShape(table, topic, False, True), transform, upsert_key, [key]).get(key)
            return ("deleted", f"a tombstone: it deleted the row of {_shown_key(upsert_key, key)}",
                    None if current is None or current[0] != topic else current[1:])
        row = transform.rows(record)[0]
    except Exception:
        return None
    names = [name for name, _ in transform.columns]
    key = tuple(row[names.index(column)] for column in upsert_key)
    key_text = _shown_key(upsert_key, key)
    current = _rows_of_keys(cur, SinkShape(table, topic, False, True), transform, upsert_key, [key]).get(key)
    if current is not None and (current[1], current[2]) > (record.partition, record.offset):
        return "superseded", (f"a later record of its key ({key_text}) overwrote it: the row now holds partition "
                              f"{current[1]} offset {current[2]}"), (current[1], current[2])
    if current is not None:
        return None
    later: list = []
    read_ranges(topic, {record.partition: (record.offset + 1, position)}, lambda p, batch: later.extend(batch),
                cluster=cluster)
    # The record itself first, so that its key names the group of the later records PostgreSQL holds equal to it.
    latest, _ = last_record_per_key(
        cur, [record] + [SourceRecord(r.partition, r.offset, r.key, r.value, r.timestamp, r.headers) for r in later],
        set(), transform, upsert_key, delete_on_tombstone)
    offset, deleted = latest.get(key, (None, False))
    if deleted:
        return "superseded", f"its key's row ({key_text}) was deleted by the tombstone at offset {offset}", None
    return None


def _shown_key(columns: tuple[str, ...], key: tuple) -> str:
    return ", ".join(f"{column} = {value}" for column, value in zip(columns, key, strict=True))
