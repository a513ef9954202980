"""Transforms: named, importable functions from a Kafka record to sink rows.

A transform returns one row (a tuple in `columns` order) per record — or, when `multi_row` is set,
one or more rows, numbered by the sink's `source_row` column. A record it cannot handle raises
`BadRecord` (or any exception): the commit protocol turns it into a dead letter with the error and
offset, in the batch's transaction. A transform that returns no rows is treated as a bad record, so that
reconciliation can account for every offset: each one has a row or a dead letter.
"""
import importlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple


class BadRecord(ValueError):
    """The record cannot be transformed; it goes to the dead-letter table with this message."""


class SourceRecord(NamedTuple):
    """The part of a Kafka record that engines pass to the commit protocol. A NamedTuple: one is built
    per record on the hot path, and it builds 3x faster than a frozen dataclass."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None
    headers: tuple | list = ()  # (name, bytes) pairs, as kafka-python gives them

    @property
    def timestamp(self) -> int | None:
        """kafka-python's name for it: code that reads `timestamp` takes either kind of record."""
        return self.timestamp_ms


@dataclass(frozen=True)
class Transform:
    name: str
    columns: tuple[tuple[str, str], ...]  # (column name, PostgreSQL type) of the sink, before provenance
    func: Callable[[SourceRecord], Sequence[tuple]]
    multi_row: bool = False
    description: str = ""
    # Optional fast path for a single-row, single-column transform: given a batch's raw values, True when every
    # value, as it is, is already the COPY text of the row `func` would return (so the engine writes the values
    # without calling `func` per record). False sends the batch through `func` record by record.
    verbatim: Callable[[list], bool] | None = None
    # Upsert pipelines that delete on tombstones: the key columns' values of a record without a value (from its
    # key, partition, ...), in the order of the upsert key. None: the transform cannot key a tombstone.
    tombstone_key: Callable[[SourceRecord], tuple] | None = None
    # True when `func` reads only what kafka-python's records and SourceRecords share (partition, offset, key,
    # value, timestamp, headers): the Python engine then passes its records as polled, without a copy each.
    takes_polled_records: bool = False

    def rows(self, record: SourceRecord) -> Sequence[tuple]:
        rows = self.func(record)
        if not rows:
            raise BadRecord("transform produced no rows")
        if not self.multi_row and len(rows) != 1:
            raise BadRecord(f"transform produced {len(rows)} rows; it is declared single-row")
        return rows


def as_source_records(records: list) -> list[SourceRecord]:
    """A partition's records as SourceRecords. The Python engine keeps kafka-python's records as polled and
    converts them only for a transform that is called per record."""
    if not records or type(records[0]) is SourceRecord:
        return records
    return [SourceRecord(r.partition, r.offset, r.key, r.value, r.timestamp, r.headers) for r in records]


def _shown(value: bytes | None) -> str:
    """A value in an error: its start, or None for a tombstone (whose slice would fail inside the error)."""
    return repr(value if value is None else value[:80])


def _int_value(record: SourceRecord):
    # The classic example: values are integers as text ("1".."100").
    try:
        return ((int(record.value),),)
    except (TypeError, ValueError):
        raise BadRecord(f"value is not an integer: {_shown(record.value)}") from None


# At most 18 digits: always within bigint, so PostgreSQL reads the text as int() would ("007" -> 7).
_PLAIN_INTEGER_LINES = re.compile(rb"(?:-?[0-9]{1,18}\n)+")


def _int_values_verbatim(values: list) -> bool:
    """int_value's fast path: every value is a plain decimal integer (digits, perhaps after a minus), the
    common case. Anything else (a plus sign, spaces, underscores, a tombstone) goes record by record, where
    int() decides."""
    try:
        text = b"\n".join(values) + b"\n"
    except TypeError:  # a None (tombstone) among them
        return False
    return text.count(b"\n") == len(values) and _PLAIN_INTEGER_LINES.fullmatch(text) is not None


def _json_event(record: SourceRecord):
    try:
        event = json.loads(record.value)
        return ((int(event["id"]), str(event.get("kind", "")), json.dumps(event)),)
    except (TypeError, ValueError, KeyError) as exc:
        raise BadRecord(f"not a JSON event with an integer id: {exc}") from None


def _csv_ints(record: SourceRecord):
    # One record, several rows: "1,2,3" -> three rows. Shows the multi-row provenance key.
    try:
        return tuple((int(part),) for part in record.value.decode().split(","))
    except (AttributeError, ValueError):
        raise BadRecord(f"value is not a comma-separated list of integers: {_shown(record.value)}") from None


REGISTRY: dict[str, Transform] = {
    t.name: t
    for t in (
        Transform("int_value", (("id", "bigint"),), _int_value, verbatim=_int_values_verbatim,
                  description="value is an integer as text -> one row (id)"),
        Transform("json_event", (("id", "bigint"), ("kind", "text"), ("payload", "jsonb")), _json_event,
                  description='value is JSON {"id": int, "kind": str, ...} -> one row'),
        Transform("csv_ints", (("id", "bigint"),), _csv_ints, multi_row=True,
                  description='value is "1,2,3" -> one row per integer'),
    )
}


JSON = "json"  # compiled per pipeline from its sink table's columns: consumers/engine/json_map.py


def for_pipeline(pipeline, cursor=None) -> Transform:
    """The transform a pipeline runs: a registered or dotted one, or `json` compiled once from the sink table's
    columns (read with `cursor`, a psycopg2 cursor, or Django's connection) and the pipeline's mapping."""
    if pipeline.transform != JSON:
        return resolve(pipeline.transform)
    from consumers.engine import json_map

    return json_map.plan_for_pipeline(pipeline, cursor).transform(tuple(pipeline.upsert_key or ()))


def resolve(name: str) -> Transform:
    """A registered name (`int_value`) or a dotted path to a Transform object (`myapp.sinks.orders`)."""
    if name in REGISTRY:
        return REGISTRY[name]
    if name == JSON:
        raise LookupError("transform 'json' is compiled from a pipeline's sink table: use for_pipeline()")
    module_name, _, attribute = name.rpartition(".")
    if not module_name:
        raise LookupError(f"Unknown transform {name!r}: use one of {sorted(REGISTRY)} or a dotted path.")
    try:
        candidate = getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:  # noqa: BLE001 -- importing runs the module's code: a relative name is a
        # TypeError, an unconfigured optional app ImproperlyConfigured; each is a refusal, never a crash
        raise LookupError(f"Cannot import transform {name!r}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(candidate, Transform):
        raise LookupError(f"{name!r} is not a consumers.engine.transforms.Transform")
    return candidate
