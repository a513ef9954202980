"""What a `--transform json` pipeline would write, before anything is created: the form's and the API's preview.

  1. Read the sink table's columns from the catalog and the topic's first PREVIEW_RECORDS records.
  2. Propose a mapping: a column whose name is no top-level field of the records takes a field whose path
     spells it (`customer_name` <- `customer.name`) or ends with it; a column with a default takes the field
     of its name when every record carries one (otherwise its default would be written; and a mapped column
     takes no default: a record without the field would be a dead letter).
  3. Compile the mapping as the run does (consumers/engine/json_map.py) and turn each record into its row or
     its dead letter, with the reason the run would store.
  4. The rows go through PostgreSQL itself -- COPY into a temporary copy of the table, in a transaction that is
     rolled back -- so the preview shows each value as the table will hold it, and a value the database
     refuses as the dead letter it would be. Nothing is written.
  5. Notes on what is likely a mistake though it converts: a number read as epoch milliseconds (the default) that
     lands in 1970 is most likely epoch seconds. A note only: the rows shown are what the run would write.
"""
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal

from django.db import connection, transaction
from psycopg2 import sql

from consumers.engine import json_map, json_time, poison, sinks
from consumers.engine.transforms import SourceRecord
from consumers.kafka import admin as kafka_admin
from consumers.kafka import ranges
from consumers.operations import pipeline_setup
from consumers.operations.pipeline_setup import Invalid, PipelineSpec

PREVIEW_RECORDS = 20
# Epoch seconds of any date since 1971 read as milliseconds land within a year of 1970-01-01 (1714559400 s is
# 2024-05-01; as milliseconds, 1970-01-20), where few real millisecond timestamps are.
LIKELY_SECONDS_MS = 365 * 24 * 3600 * 1000
PATH_DEPTH = 4          # how deep a proposal looks into the records' objects
SHOWN_KEY_CHARS = 80


@dataclass
class PreviewRecord:
    partition: int
    offset: int
    key: str | None
    row: dict | None = None          # column -> the value as the table holds it (text), or None (NULL)
    dead_letter: str | None = None   # the error the run would store with the dead letter
    deletes: dict | None = None      # a tombstone of an upsert pipeline: the key whose row it deletes

    @property
    def cells(self) -> list:
        """The row's values in column order (for a table of records)."""
        return list(self.row.values()) if self.row else []

    def as_json(self) -> dict:
        return {"partition": self.partition, "offset": self.offset, "key": self.key, "row": self.row,
                "dead_letter": self.dead_letter, "deletes": self.deletes}


@dataclass
class Preview:
    columns: list[dict]                      # every column of the table: name, type, source (None: not written)
    mapping: dict[str, str]                  # the mapping previewed: the spec's, plus what was proposed
    proposed: dict[str, str]                 # what the preview added to the spec's mapping
    records: list[PreviewRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # likely mistakes that still convert (_seconds_notes)

    @property
    def written_columns(self) -> list[str]:
        return [c["name"] for c in self.columns if c["source"] is not None]

    def as_json(self) -> dict:
        return {"columns": self.columns, "mapping": self.mapping, "proposed": self.proposed,
                "records": [r.as_json() for r in self.records], "notes": self.notes}


def preview(spec: PipelineSpec) -> Preview:
    """The preview of `spec` (topic, sink_table, map, upsert_key, delete_on_tombstone are read); Invalid naming
    the field when the topic or the table cannot be read or the mapping does not fit."""
    problems: dict[str, str] = {}
    pipeline_setup.check_table_name(spec.sink_table or "", problems)  # never a table of Tally, Django or PostgreSQL
    if problems:
        raise Invalid(problems)
    with connection.cursor() as wrapper:
        columns = json_map.read_columns(wrapper.cursor, spec.sink_table) if spec.sink_table else None
    if columns is None:
        raise Invalid({"sink_table": f"table {spec.sink_table!r} does not exist: --transform json maps onto the "
                                     "columns of an existing table"})
    try:
        records = first_records(spec.topic, PREVIEW_RECORDS, spec.cluster or None)
    except Exception as exc:  # a missing topic or a broker that does not answer: say which
        raise Invalid({"topic": f"cannot read topic {spec.topic!r}: {type(exc).__name__}: {exc}"}) from None
    proposed = propose(columns, [_object(r) for r in records], spec.map)
    mapping = {**proposed, **spec.map}
    try:
        plan = json_map.plan(columns, mapping)
    except json_map.MappingInvalid as exc:
        raise Invalid({"map": "; ".join(exc.problems)}) from None
    sources = {w.column.name: w.source for w in plan.columns}
    result = Preview([{"name": c.name, "type": c.pg_type, "source": sources.get(c.name),
                       "required": c.required} for c in columns], mapping, proposed)
    upsert_key = tuple(spec.upsert_key or ())
    transform = plan.transform(upsert_key)
    rows = []
    for record in records:
        shown = PreviewRecord(record.partition, record.offset, _key_text(record.key))
        result.records.append(shown)
        try:
            if record.value is None and upsert_key and spec.delete_on_tombstone and transform.tombstone_key:
                shown.deletes = dict(zip(upsert_key, map(_text, transform.tombstone_key(record)), strict=True))
                continue
            rows.append((shown, (*transform.rows(record)[0], "preview", record.partition, record.offset)))
        except Exception as exc:  # as the commit protocol: any failure is the record's
            shown.dead_letter = f"{type(exc).__name__}: {exc}"
    _through_postgresql(spec.sink_table, plan.column_names, rows)
    result.notes = _seconds_notes(plan, records)
    return result


def _seconds_notes(plan: json_map.JsonPlan, records: list[SourceRecord]) -> list[str]:
    """Per time column read in the default unit: a note when some records hold a number that lands in 1970."""
    notes = []
    docs = [_object(r) for r in records]
    for written in plan.columns:
        column = written.column
        if (column.element or column.base) not in json_time.TIME_TYPES or written.unit is not None:
            continue
        get = json_map.raw_getter(written)
        suspects = []
        for doc, record in zip(docs, records, strict=True):
            try:
                raw = get(doc, record)
            except Exception:  # noqa: BLE001 -- a value that is no object, a key that is not JSON: the row says why
                continue
            suspects += [v for v in (raw if type(raw) is list else [raw])
                         if type(v) in (int, float, Decimal) and 0 < abs(v) < LIKELY_SECONDS_MS]
        if suspects:
            source = column.name if written.field else written.source
            day = (json_time.EPOCH + timedelta(milliseconds=float(suspects[0]))).date().isoformat()
            notes.append(f"column {column.name} (from {source}): {len(suspects)} of {len(records)} records hold a "
                         f"number that, read as epoch milliseconds (the default), is in 1970 ({suspects[0]} is "
                         f"{day}): if it counts seconds, map it as {column.name}={source}::seconds")
    return notes


def first_records(topic: str, limit: int, cluster=None) -> list[SourceRecord]:
    """The topic's first `limit` records (read_committed), partition by partition from each log start: what a
    new pipeline reads first."""
    marks = kafka_admin.watermarks(topic, cluster=cluster)
    found: dict[int, list] = {}
    ranges.read_ranges(topic, {p: (m.log_start, min(m.high, m.log_start + limit)) for p, m in marks.items()},
                       lambda p, batch: found.setdefault(p, []).extend(batch), cluster=cluster)
    records = [r for p in sorted(found) for r in found[p]][:limit]
    return [SourceRecord(r.partition, r.offset, r.key, r.value, r.timestamp, r.headers) for r in records]


def _through_postgresql(table: str, columns: list[str], rows: list[tuple]) -> None:
    """Each row COPYed into a temporary copy of the table, read back as text; a refused row becomes the dead
    letter the run would store. Rolled back: nothing stays."""
    if not rows:
        return
    insert = columns + list(sinks.PROVENANCE)
    staging = sql.Identifier("tally_preview")
    with transaction.atomic(), connection.cursor() as wrapper:
        cur = wrapper.cursor
        cur.execute(sql.SQL("CREATE TEMP TABLE {} (LIKE {} {} INCLUDING CONSTRAINTS) ON COMMIT DROP")
                    .format(staging, sql.Identifier(table), sinks.LIKE_SINK))
        for shown, row in rows:
            cur.execute("SAVEPOINT tally_preview_row")
            try:
                sinks.copy_rows(cur, "tally_preview", insert, [row])
            except Exception as exc:
                if not poison.is_data_error(exc):
                    raise
                cur.execute("ROLLBACK TO SAVEPOINT tally_preview_row")
                # As the run would say it: the error names the sink table, not the temporary copy.
                reason = poison.describe(exc).replace('relation "tally_preview"', f'relation "{table}"')
                shown.dead_letter = f"database refused: {reason}"
        # format('%s') is the type's output function, as the table's readers see the value (inet 10.0.0.1, where
        # inet::text says 10.0.0.1/32); it turns NULL into '', so NULL is kept apart.
        cur.execute(sql.SQL("SELECT source_partition, source_offset, {} FROM {}").format(
            sql.SQL(", ").join(sql.SQL("CASE WHEN {0} IS NULL THEN NULL ELSE format('%s', {0}) END").format(
                sql.Identifier(c)) for c in columns), staging))
        written = {(p, o): values for p, o, *values in cur.fetchall()}
        transaction.set_rollback(True)
    for shown, _ in rows:
        values = written.get((shown.partition, shown.offset))
        if values is not None:
            shown.row = dict(zip(columns, values, strict=True))


def propose(columns: list[json_map.Column], samples: list, mapping: dict[str, str]) -> dict[str, str]:
    """Sources for the columns the mapping leaves to their defaults, read from sample records' objects."""
    samples = [s for s in samples if isinstance(s, dict)]
    if not samples:
        return {}
    top, everywhere = set().union(*samples), set.intersection(*(set(s) for s in samples))
    paths = sorted({p for s in samples for p in _paths(s, ())}, key=lambda p: (p.count("."), p))
    proposed = {}
    for column in columns:
        name = column.name
        if name in mapping or name in json_map.PROVENANCE_COLUMNS or column.generated:
            continue
        if name in top:
            if column.has_default and name in everywhere:
                proposed[name] = name  # without a mapping the default would be written, not the field
            continue
        match = next((p for p in paths if "." in p and p.replace(".", "_") == name), None) or \
            next((p for p in paths if "." in p and p.rsplit(".", 1)[1] == name), None)
        if match is not None:
            proposed[name] = match
    return proposed


def _paths(node, prefix: tuple):
    if len(prefix) >= PATH_DEPTH:
        return
    items = node.items() if isinstance(node, dict) else enumerate(node[:3]) if isinstance(node, list) else ()
    for key, value in items:
        path = (*prefix, str(key))
        yield ".".join(path)
        yield from _paths(value, path)


def _object(record: SourceRecord):
    try:
        return json_map.json.loads(record.value) if record.value is not None else None
    except (ValueError, RecursionError):   # RecursionError: nested thousands deep (the run dead-letters it)
        return None


def _key_text(key: bytes | None) -> str | None:
    if key is None:
        return None
    text = key.decode("utf-8", "replace")
    return text if len(text) <= SHOWN_KEY_CHARS else text[:SHOWN_KEY_CHARS] + "..."


def _text(value) -> str | None:
    return None if value is None else str(value)
