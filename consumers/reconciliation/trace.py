"""Tracing one record of a pipeline's topic to where it went: the Kafka record, the ledger batch(es) that
covered its offset, its sink row(s) found by provenance key — or its dead letter, or why there is none.

The command (`manage.py trace`), the API (`/api/pipelines/NAME/trace`) and the page
(`/pipelines/NAME/trace/`) all call `trace()`. It takes a pipeline, never a table name: the sink table
and its columns are the pipeline's.

Verdicts, in the order they are decided:
  written          one sink row (or one per row of a multi-row record) carries its provenance
  duplicated       more rows than the record should have (at-least-once replays)
  dead-lettered    the transform rejected it; the dead letter holds the error
  not yet consumed the pipeline's position has not reached it
  lost (at-most-once)  an at-most-once pipeline moved past it (Kafka commit first) and never wrote it
  lost             the position moved past it, yet there is no row and no dead letter (reconciliation
                   reports the same offsets as lost)
  no record        the offset holds no data record (a transaction marker, an aborted or compacted record)
  skipped by a rewind  a rewind to a later offset moved the position past it on purpose
An upsert pipeline (one row per key) adds, for a consumed record without a row of its own:
  superseded       a later record of its key overwrote the row (the row names that record), or deleted it
  deleted          it is a tombstone: it deleted its key's row
"""
import contextlib
from dataclasses import dataclass, field

from django.db import connection
from kafka.errors import KafkaError
from psycopg2 import sql

from consumers.engine import sinks
from consumers.engine.transforms import SourceRecord, for_pipeline
from consumers.kafka import admin as kafka_admin
from consumers.kafka import ranges
from consumers.kafka.errors import ClusterConfigError
from consumers.models import BatchLedger, DeadLetter, DeliveryMode, PartitionOffset, Pipeline
from consumers.operations.errors import Refused, Unavailable
from consumers.operations.offset_specs import MAX_OFFSET, MAX_PARTITION
from consumers.reconciliation import verify_upsert
from consumers.reconciliation.rewinds import skipped_by_a_rewind

PREVIEW_BYTES = 500        # enough of a value to recognise it, not a dump of the payload
MAX_ROWS = 20              # a record has a few rows; more means something else is wrong, show a sample
KEY_SCAN_LIMIT = 100_000   # records per partition scanned to find a key (Kafka has no key index)


class TraceRefused(ValueError):
    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


REFUSALS = (TraceRefused, Refused)   # what a trace refuses with, at every door; nothing is changed


def refusal_status(exc: Exception, bad_request: int = 400) -> int:
    """The HTTP status of a trace's refusal (one of REFUSALS): the request's own fault (400 from the API, 422 on a
    page, whose form shows why), Kafka that cannot be read now (503), or a cluster no longer configured (409)."""
    if isinstance(exc, TraceRefused):
        return bad_request
    return 503 if isinstance(exc, Unavailable) else 409


@contextlib.contextmanager
def kafka_reads(traced: str):
    """A trace's Kafka reads of `traced` ("pipeline 'orders'"): a cluster no longer configured, or whose settings are
    wrong, raises errors.Refused naming it, which doors answer with a 409 (waiting would not help); a cluster that
    cannot be used now (also one that went down after its check passed: kafka-python's own errors) raises
    errors.Unavailable, which doors answer with a 503; anything else Kafka says no to (a topic that does not exist)
    is the request's TraceRefused."""
    try:
        yield
    except ClusterConfigError as exc:  # before KafkaUnreachable, its base: not an outage
        raise Refused(f"Cannot trace a record of {traced}: {exc}.") from None
    except (kafka_admin.KafkaUnreachable, KafkaError) as exc:
        raise Unavailable.of(exc) from None
    except kafka_admin.KafkaAdminError as exc:
        raise TraceRefused(f"Kafka: {exc}") from None


def parse_request(params) -> tuple[int | None, int | None, str | None]:
    """(partition, offset, key) from query parameters: a key, or a partition and an offset as whole numbers (not
    both; empty ones are absent). Raises TraceRefused naming the field."""
    key = params.get("key") or None
    if key is not None:
        if params.get("partition") or params.get("offset"):  # tracing one of them silently would mislead
            raise TraceRefused("Give a key, or a partition and an offset: not both.", "key")
        if len(key) > 1000:
            raise TraceRefused("key: at most 1000 characters", "key")
        return None, None, key
    numbers = {}
    for name in ("partition", "offset"):
        text = (params.get(name) or "").strip()
        if not text.isascii() or not text.isdigit():
            raise TraceRefused(f"{name}: a whole number >= 0 is required (or give a key)", name)
        numbers[name] = int(text)
    check_position(numbers["partition"], numbers["offset"])
    return numbers["partition"], numbers["offset"], None


def check_position(partition: int, offset: int) -> None:
    """A partition and an offset Kafka can have (int32, int64), else TraceRefused naming the field."""
    for name, number, largest in (("partition", partition, MAX_PARTITION), ("offset", offset, MAX_OFFSET)):
        if not 0 <= number <= largest:
            raise TraceRefused(f"{name}: a whole number from 0 to {largest} is required", name)


@dataclass
class Trace:
    pipeline: str
    topic: str
    partition: int
    offset: int
    verdict: str
    explanation: str
    record: dict | None = None
    position: int | None = None
    batches: list[dict] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    dead_letter: dict | None = None
    # An upsert pipeline: the record that wrote its key's current row, that row and the ledger batch that
    # committed it ({"partition", "offset", "row", "batches"}), when the traced record is not that record.
    current_row: dict | None = None

    def as_json(self) -> dict:
        return dict(self.__dict__)


def preview(data: bytes | memoryview | None) -> str | None:
    if data is None:
        return None
    data = bytes(data)
    text = data[:PREVIEW_BYTES].decode("utf-8", errors="replace")
    return text + (f" … ({len(data)} bytes)" if len(data) > PREVIEW_BYTES else "")


def trace(pipeline: Pipeline, partition: int, offset: int) -> Trace:
    """Where the record at (pipeline's topic, partition, offset) went. Raises TraceRefused for a request that
    cannot be traced, errors.Refused when the pipeline's cluster is no longer configured, errors.Unavailable when
    Kafka cannot be read now."""
    check_position(partition, offset)
    with kafka_reads(f"pipeline {pipeline.name!r}"):
        partitions = kafka_admin.partitions_for(pipeline.topic, cluster=pipeline.cluster)
        if partition not in partitions:
            raise TraceRefused(f"partition: topic {pipeline.topic!r} has no partition {partition} "
                               f"(it has {len(partitions)})", "partition")
        mark = kafka_admin.watermarks(pipeline.topic, [partition], cluster=pipeline.cluster)[partition]
        found = (kafka_admin.read_record(pipeline.topic, partition, offset, cluster=pipeline.cluster)
                 if mark.log_start <= offset < mark.high else None)
    result = Trace(pipeline.name, pipeline.topic, partition, offset, "", "")
    if found is not None:
        result.record = {"key": preview(found.key), "value": preview(found.value), "timestamp_ms": found.timestamp_ms}
    result.position = (PartitionOffset.objects.filter(pipeline=pipeline, partition=partition)
                       .values_list("next_offset", flat=True).first())
    result.batches = [_batch(b, offset) for b in _covering_batches(pipeline, partition, offset)]
    result.rows = _sink_rows(pipeline, partition, offset)
    letter = DeadLetter.objects.filter(pipeline=pipeline, partition=partition, offset=offset).first()
    if letter is not None:
        result.dead_letter = {"error": letter.error, "created_at": letter.created_at.isoformat(),
                              "value": preview(letter.value)}
    result.verdict, result.explanation = _verdict(pipeline, result, mark, found)
    return result


def _covering_batches(pipeline: Pipeline, partition: int, offset: int):
    """The ledger rows whose range holds `offset`, found through the ledger's range index (not by reading
    every row below it)."""
    return (BatchLedger.objects.filter(pipeline=pipeline, partition=partition, first_offset__lte=offset,
                                       end_offset__gt=offset)
            .extra(where=["int8range(first_offset, end_offset, '[]') @> %s::bigint"], params=[offset])
            .order_by("committed_at"))


def _batch(b: BatchLedger, offset: int) -> dict:
    batch = {"id": b.pk, "first_offset": b.first_offset, "end_offset": b.end_offset, "records": b.records,
             "rows_written": b.rows_written, "epoch": b.epoch, "committed_at": b.committed_at.isoformat(),
             "superseded": b.superseded_from is not None and offset >= b.superseded_from,
             "compacted": b.batches > 1, "batches": b.batches}
    if b.batches > 1:
        # Its own batch's bounds are gone: the row says how many batches it merged, and over what time.
        batch["first_committed_at"] = b.first_committed_at.isoformat() if b.first_committed_at else None
    return batch


def find_by_key(pipeline: Pipeline, key: str) -> tuple[list[kafka_admin.KafkaRecord], int]:
    """(records of the pipeline's topic with this key, among the newest KEY_SCAN_LIMIT per partition,
    records scanned). Raises as trace()."""
    with kafka_reads(f"pipeline {pipeline.name!r}"):
        partitions = kafka_admin.partitions_for(pipeline.topic, cluster=pipeline.cluster)
        return kafka_admin.find_records_by_key(pipeline.topic, key.encode(), partitions, KEY_SCAN_LIMIT,
                                              cluster=pipeline.cluster)


def _sink_rows(pipeline: Pipeline, partition: int, offset: int) -> list[dict]:
    transform = for_pipeline(pipeline)
    columns = [name for name, _ in transform.columns] + list(sinks.provenance_columns(transform))
    statement = sql.SQL("SELECT {} FROM {} WHERE source_topic = %s AND source_partition = %s AND "
                        "source_offset = %s LIMIT %s").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in columns), sql.Identifier(pipeline.sink_table))
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [sql.Identifier(pipeline.sink_table).as_string(cursor.cursor)])
        if cursor.fetchone()[0] is None:
            return []
        cursor.execute(statement.as_string(cursor.cursor), [pipeline.topic, partition, offset, MAX_ROWS + 1])
        return [{c: _plain(v) for c, v in zip(columns, row, strict=True)} for row in cursor.fetchall()]


def _plain(value):
    """A sink value as JSON can carry it (dates, decimals and the like as text)."""
    return value if value is None or isinstance(value, int | float | bool) else str(value)


def _verdict(pipeline: Pipeline, result: Trace, mark, found) -> tuple[str, str]:
    in_kafka = found is not None
    multi_row = for_pipeline(pipeline).multi_row
    rows = result.rows
    if rows and pipeline.is_upsert:
        return "written", f"it wrote the current row of its key in {pipeline.sink_table}"
    if rows:
        row_numbers = [r.get("source_row", 0) for r in rows]
        if len(set(row_numbers)) < len(row_numbers):
            return "duplicated", f"{len(rows)} sink rows carry this record's provenance: it was written more than once"
        return "written", (f"{len(rows)} sink row(s) in {pipeline.sink_table}" if multi_row
                           else f"one sink row in {pipeline.sink_table}")
    if result.dead_letter is not None:
        return "dead-lettered", f"the transform rejected it: {result.dead_letter['error']}"
    position = result.position
    if position is None or result.offset >= position:
        if result.offset >= mark.high:
            return "not yet consumed", f"offset {result.offset} is beyond the log end ({mark.high}): not produced yet"
        return "not yet consumed", (f"the pipeline's position is {position if position is not None else 'not set'}"
                                    f"; it has not reached offset {result.offset}")
    if not in_kafka and mark.log_start <= result.offset:
        return "no record", ("the offset holds no data record (a transaction marker, an aborted or compacted "
                             "record): nothing to write, nothing lost")
    if skipped_by_a_rewind(pipeline, result.partition, result.offset):
        return "skipped by a rewind", "an operator's rewind moved the position past this offset"
    if pipeline.is_upsert and in_kafka:
        told = _upsert_fate(pipeline, found, position)
        if told is not None:
            verdict, explanation, writer = told
            if writer is not None:
                result.current_row = _current_row(pipeline, *writer)
            return verdict, explanation
    if pipeline.delivery_mode == DeliveryMode.AT_MOST_ONCE:
        return "lost (at-most-once)", ("the position moved past it (Kafka was committed before the write) and no "
                                       "row or dead letter holds it")
    return "lost", "the position moved past it, yet no sink row or dead letter holds it (reconciliation reports it)"


def _upsert_fate(pipeline: Pipeline, found, position: int):
    record = SourceRecord(found.partition, found.offset, found.key, found.value, found.timestamp_ms)
    with connection.cursor() as cursor:
        return verify_upsert.fate(cursor.cursor, pipeline.sink_table, pipeline.topic, for_pipeline(pipeline),
                                  tuple(pipeline.upsert_key), pipeline.delete_on_tombstone, record, position,
                                  ranges.read_ranges, pipeline.cluster)


def _current_row(pipeline: Pipeline, partition: int, offset: int) -> dict:
    """The record that wrote a key's current row: its row (by provenance) and the ledger batch that committed it."""
    rows = _sink_rows(pipeline, partition, offset)
    return {"partition": partition, "offset": offset, "row": rows[0] if rows else None,
            "batches": [_batch(b, offset) for b in _covering_batches(pipeline, partition, offset)]}


