"""Tracing one finding of a watch: offset -> the record's value -> the row id it names -> the rows found.

The page (`/watches/NAME/trace/?partition=P&offset=O`) and the API (`/api/watches/NAME/trace?...`) call
`trace()`. It reads the record from Kafka (read_committed, as the audit does), derives its id with the
watch's SPEC and the row-id column's type (the audit's own functions), and looks the rows up in the team's
table now. What the audit found at that offset (`WatchFinding`) is shown beside it, so a row written after
the audit shows as such.
"""
import csv
from dataclasses import dataclass, field

from django.db import connection
from django.db.models import F
from psycopg2 import sql

from consumers.engine import record_ids, sink_checks, table_names
from consumers.kafka import admin as kafka_admin
from consumers.models import Watch, WatchFinding, WatchPartition
from consumers.reconciliation import watch_history
from consumers.reconciliation.trace import (
    KEY_SCAN_LIMIT,
    MAX_ROWS,
    REFUSALS,
    TraceRefused,
    kafka_reads,
    parse_request,
    preview,
    refusal_status,
)

__all__ = ["REFUSALS", "TraceRefused", "WatchTrace", "findings_csv", "parse_request", "refusal_status", "trace"]


@dataclass
class WatchTrace:
    watch: str
    topic: str
    partition: int
    offset: int
    verdict: str = ""
    explanation: str = ""
    finding: dict | None = None        # what the audit stored for this offset: {kind, extra, checked_at}
    record: dict | None = None         # key, value (previews), timestamp_ms; None: no record there
    expected_id: list | None = None    # the row id the record names, one value per row-id column
    row_columns: list = field(default_factory=list)
    rows_found: int = 0                # rows of the table with that id now
    rows: list[dict] = field(default_factory=list)   # the first MAX_ROWS of them

    def as_json(self) -> dict:
        return dict(self.__dict__)

    def id_pairs(self) -> list[tuple]:
        """(column, value) of the expected row id, for the page."""
        return list(zip(self.row_columns, self.expected_id or [], strict=False))


def trace(watch: Watch, partition: int, offset: int) -> WatchTrace:
    if not watch.audits:
        raise TraceRefused(f"watch {watch.name} names no table: there is nothing to trace a record to")
    wp = WatchPartition.objects.filter(watch=watch, partition=partition).first()
    if wp is None:
        raise TraceRefused(f"partition: watch {watch.name} has no partition {partition}", "partition")
    result = WatchTrace(watch.name, watch.topic, partition, offset, row_columns=watch.row_columns)
    stored = (WatchFinding.objects.filter(watch=watch, partition=partition, offset__lte=offset,
                                          offset__gt=offset - F("run_length"))
              .order_by("-checked_at").first())
    if stored is not None:
        result.finding = {"kind": stored.kind, "extra": stored.extra, "checked_at": stored.checked_at.isoformat()}
    with kafka_reads(f"watch {watch.name!r}"):
        found = kafka_admin.read_record(watch.topic, partition, offset, cluster=watch.cluster)
    if found is not None:
        result.record = {"key": preview(found.key), "value": preview(found.value),
                         "timestamp_ms": found.timestamp_ms}
    with connection.cursor() as wrapper:
        types = sink_checks.table_columns(wrapper.cursor, table_names.split(watch.sink_table))
        if types is None or any(c not in types for c in watch.row_columns):
            raise TraceRefused(f"table {watch.sink_table!r} or its column(s) {watch.row_id} no longer exist")
        if not sink_checks.may_read(wrapper.cursor, table_names.split(watch.sink_table)):
            # A grant revoked since the watch was made: said as validation says it, not a failed query
            raise TraceRefused(sink_checks.read_refused(watch.sink_table))
        ignored = _expected_id(watch, result, found, types)
        by_key = _names_by_key(watch, found, ignored)
        if by_key:
            with kafka_reads(f"watch {watch.name!r}"):
                named = _tombstone_names(watch, result, found, types)
        if result.expected_id is not None:
            result.rows_found, result.rows = _rows(wrapper.cursor, watch, result.expected_id)
    if result.finding is None and wp.start_offset <= offset < wp.settled_offset \
            and watch_history.past_retention(watch, partition, offset):
        result.verdict, result.explanation = _past_retention(result)
    elif by_key:
        result.verdict, result.explanation = _tombstone_verdict(watch, wp, result, found, named)
    else:
        result.verdict, result.explanation = _verdict(watch, wp, result, found, ignored)
    return result


def _names_by_key(watch: Watch, found, ignored: str) -> bool:
    """Whether the record is a keyed tombstone that takes its row id from its key (record_ids.names_by_key)."""
    return (found is not None and found.value is None and not ignored and watch.record_id != record_ids.OFFSET
            and record_ids.names_by_key(record_ids.parse_spec(watch.record_id), watch.keyed))


def _tombstone_names(watch: Watch, t: WatchTrace, found, types: dict) -> dict | None:
    """A keyed tombstone of `value` or `json:PATH` ids deletes the row of its key's latest readable record before it
    (by ranked time, then offset, then partition: watch_match.TOMBSTONE_IDS), searched among the newest KEY_SCAN_LIMIT
    records of each partition. Sets t.expected_id to that record's id; returns its {partition, offset} (None: the
    key has no readable record before it there)."""
    spec, normalise = record_ids.parse_spec(watch.record_id), record_ids.normaliser(types[watch.row_columns[0]]["type"])
    ignores = [record_ids.parse_ignore(text) for text in watch.ignore]
    partitions = kafka_admin.partitions_for(watch.topic, cluster=watch.cluster)
    same_key, _ = kafka_admin.find_records_by_key(watch.topic, found.key, partitions, KEY_SCAN_LIMIT,
                                                  cluster=watch.cluster)
    # Ranked among the records TOMBSTONE_IDS ranks: readable ones and the tombstones the watch expects (not an
    # unreadable or ignored record, whose timestamp would move the ones after it).
    derived = [(r, *record_ids.derive(spec, ignores, normalise, r.key, r.value)) for r in same_key]
    ranked = _ranked_times([found, *(r for r, rid, ignored in derived
                                     if rid is not None or (r.value is None and not ignored))])
    at = (ranked[(t.partition, t.offset)], t.offset, t.partition)
    before = []
    for r, rid, _ in derived:   # an ignored record names no row
        if rid is not None and (place := (ranked[(r.partition, r.offset)], r.offset, r.partition)) < at:
            before.append((place, rid, r))
    if not before:
        return None
    _, rid, latest = max(before, key=lambda named: named[0])
    t.expected_id = [rid]
    return {"partition": latest.partition, "offset": latest.offset}


def _ranked_times(records) -> dict[tuple[int, int], int]:
    """{(partition, offset): ranked time} of one key's records, as watch_match ranks them: a record's timestamp, or
    a later one of the key's before it in its partition (the consumer applies a partition in offset order)."""
    times, latest = {}, {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        stamp = r.timestamp_ms if r.timestamp_ms is not None else -1   # Kafka's "no timestamp"
        latest[r.partition] = max(latest.get(r.partition, stamp), stamp)
        times[(r.partition, r.offset)] = latest[r.partition]
    return times


def _tombstone_verdict(watch: Watch, wp: WatchPartition, t: WatchTrace, found, named: dict | None
                       ) -> tuple[str, str]:
    """The verdict of a keyed tombstone whose row id comes from its key: the delete of the row it names, or, when
    its key has no readable record before it, unreadable (it names no row), as the audit counted it."""
    kind = t.finding["kind"] if t.finding else None
    if not (wp.start_offset <= t.offset < wp.settled_offset) or kind not in (None, WatchFinding.LOST):
        return _verdict(watch, wp, t, found, "")
    if named is None:
        return "unreadable", ("a tombstone whose key has no readable record before it (among the newest "
                              f"{KEY_SCAN_LIMIT:,} records of each partition): it names no row, no row expected")
    ids = ", ".join(f"{c} = {v}" for c, v in zip(t.row_columns, t.expected_id, strict=False))
    source = (f"a tombstone: it deletes the row of its key's latest readable record before it (partition "
              f"{named['partition']}, offset {named['offset']}), {ids}")
    if kind == WatchFinding.LOST:
        return "lost", (f"{source}; the audit found that row still there (the delete was lost); "
                        f"{t.rows_found} row(s) with {ids} now")
    if t.rows_found:
        return "superseded", (f"{source}; {t.rows_found} row(s) with {ids} now: a later record of its id decides "
                              "its row (keyed)")
    return "delivered", f"{source}; the audit found that row deleted, and none is there now"


def _expected_id(watch: Watch, result: WatchTrace, found, types: dict) -> str:
    """Sets result.expected_id; returns the ignore spec that matched the record ("" when none did). The ignore
    specs apply to offset ids too, as in the audit (record_ids.derive)."""
    ignored = "" if found is None else next(
        (str(spec) for spec in map(record_ids.parse_ignore, watch.ignore) if spec.matches(found.key, found.value)), "")
    if watch.record_id == record_ids.OFFSET:
        result.expected_id = [result.partition, result.offset]
        return ignored
    if found is None or ignored:
        return ignored
    normalise = record_ids.normaliser(types[watch.row_columns[0]]["type"])
    rid = normalise(record_ids.parse_spec(watch.record_id).extract(found.key, found.value))
    result.expected_id = None if rid is None else [rid]
    return ""


def _rows(cursor, watch: Watch, expected: list) -> tuple[int, list[dict]]:
    where = sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in watch.row_columns)
    table = table_names.identifier(watch.sink_table)
    cursor.execute(sql.SQL("SELECT count(*) FROM {} WHERE {}").format(table, where), expected)
    count = cursor.fetchone()[0]
    cursor.execute(sql.SQL("SELECT * FROM {} WHERE {} LIMIT %s").format(table, where), [*expected, MAX_ROWS])
    names = [d[0] for d in cursor.description]
    return count, [{n: _plain(v) for n, v in zip(names, row, strict=True)} for row in cursor.fetchall()]


def _plain(value):
    return value if value is None or isinstance(value, int | float | bool) else str(value)


def _past_retention(t: WatchTrace) -> tuple[str, str]:
    """An audited offset with no stored finding, in a range retention folded (watch_history): the audit's result is
    gone, whatever it was."""
    history = watch_history.WATCH_HISTORY
    return "past retention", (f"the audit checked it more than {history.days()} days ago ({history.setting}): what "
                              f"it found there was removed, and the watch's totals still count it; {_rows_now(t)}")


def _rows_now(t: WatchTrace) -> str:
    ids = ", ".join(f"{c} = {v}" for c, v in zip(t.row_columns, t.expected_id or [], strict=False))
    return f"{t.rows_found} row(s) with {ids} now" if t.expected_id is not None else "its id is unknown now"


def _verdict(watch: Watch, wp: WatchPartition, t: WatchTrace, found, ignored: str) -> tuple[str, str]:
    audited = wp.start_offset <= t.offset < wp.settled_offset
    kind = t.finding["kind"] if t.finding else None
    ids = ", ".join(f"{c} = {v}" for c, v in zip(t.row_columns, t.expected_id or [], strict=False))
    if kind == WatchFinding.PHANTOM:
        return "phantom", (f"{t.rows_found} row(s) with {ids} name a position that holds no record (a transaction "
                           "marker or an aborted record)")
    if not audited:
        where = ("before the watch's start" if t.offset < wp.start_offset else
                 f"not audited yet: the audit has settled offsets up to {wp.settled_offset} (a range is audited "
                 f"once the group's commit past it is {watch.settle_seconds} s old)")
        return "not audited", f"offset {t.offset} is {where}"
    now = _rows_now(t)
    gone = "" if found is not None else " (the record is no longer in the topic)"
    if kind == WatchFinding.LOST:
        late = " (written after the audit)" if t.rows_found else ""
        return "lost", f"the audit found no row for it; {now}{late}{gone}"
    if kind == WatchFinding.DUPLICATED:
        return "duplicated", f"the audit found {t.finding['extra']} row(s) more than expected; {now}{gone}"
    if found is None:
        return "no record", ("the offset holds no data record now (a transaction marker, an aborted, compacted "
                             "or expired record)")
    if ignored:
        return "ignored", f"the record matches the ignore spec {ignored}: the consumer skips it, no row expected"
    if t.expected_id is None:
        return "unreadable", (f"no {watch.row_id} value can be derived from the record with {watch.record_id}: "
                              "no row expected")
    if watch.keyed and not t.rows_found:
        return "superseded", f"{now}: a later record of its id decides its row (keyed), or it was a tombstone"
    return "delivered", f"the audit found its row; {now}"


CSV_COLUMNS = ["partition", "offset", "kind", "extra_rows", "checked_at"]
EXPORT_CHUNK = 5000


class _Line:
    """csv.writer writes into this and the generator hands each line on (no buffer grows)."""

    def write(self, text):
        return text


def findings_csv(watch: Watch):
    """Every finding of the watch as CSV lines, in partition and offset order, streamed from the database."""
    writer = csv.writer(_Line())
    yield writer.writerow(CSV_COLUMNS)
    runs = (WatchFinding.objects.filter(watch=watch).order_by("partition", "offset", "checked_at")
            .values_list("partition", "offset", "run_length", "kind", "extra", "checked_at")
            .iterator(chunk_size=EXPORT_CHUNK))
    for partition, first, run_length, kind, extra, checked_at in runs:
        checked = checked_at.isoformat()
        for offset in range(first, first + run_length):
            yield writer.writerow([partition, offset, kind, extra, checked])
