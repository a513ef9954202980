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
from psycopg2 import sql

from consumers.engine import record_ids, sink_checks, table_names
from consumers.kafka import admin as kafka_admin
from consumers.models import Watch, WatchFinding, WatchPartition
from consumers.reconciliation.trace import (
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
    stored = (WatchFinding.objects.filter(watch=watch, partition=partition, offset=offset)
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
        if result.expected_id is not None:
            result.rows_found, result.rows = _rows(wrapper.cursor, watch, result.expected_id)
    result.verdict, result.explanation = _verdict(watch, wp, result, found, ignored)
    return result


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
    now = f"{t.rows_found} row(s) with {ids} now" if t.expected_id is not None else "its id is unknown now"
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
    rows = (WatchFinding.objects.filter(watch=watch).order_by("partition", "offset", "checked_at")
            .values_list("partition", "offset", "kind", "extra", "checked_at").iterator(chunk_size=EXPORT_CHUNK))
    for partition, offset, kind, extra, checked_at in rows:
        yield writer.writerow([partition, offset, kind, extra, checked_at.isoformat()])
