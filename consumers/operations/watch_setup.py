"""Adding and deleting watches: one validation behind every door (the command, the API, the form, the file).

Each door builds a `WatchSpec` and calls `create()` here, so all of them accept and refuse the same things
with the same messages, every message naming what is wrong and what to do. What a spec must satisfy:
  1. a free, slug-like name; a group and a topic (the topic exists in Kafka); a known cluster
     (consumers/kafka/clusters.py: "default" or one of TALLY_KAFKA_CLUSTERS) whose settings can be read, secrets
     too (a password file removed is refused under the cluster, not as the topic's check failing);
  2. for an audit, all three of a table (`table` on the search_path, or `schema.table`: the rule of
     consumers/engine/table_names.py), a record id SPEC and the row-id column(s): the schema and the table
     exist and the database user may use and read them, the columns exist and their types can hold the id
     (integers for `offset`: PART_COL,OFFSET_COL);
  3. `--from` earliest, latest or an ISO date and time; settle seconds a whole number >= 0; ignore specs
     SPEC=VALUE; `keyed` needs a table and an id that is not the offset.
A group that committed nothing on the topic yet is allowed, and said (`notes`): its lag is then measured
from the watch's start, and nothing is audited until it commits.
"""
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from django.db import connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from psycopg2 import sql

from consumers.engine import record_ids, sink_checks, sink_names, table_names
from consumers.kafka import admin as kafka_admin
from consumers.kafka import clusters
from consumers.kafka.errors import ClusterConfigError
from consumers.models import ActionLog, ActionResult, Watch, WatchPartition
from consumers.operations import offset_specs
from consumers.operations.errors import KAFKA_ERRORS, DeleteRefused, Invalid

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}\Z")  # \Z: "$" would take a name ending in a newline
RESERVED_NAMES = ("new",)  # /watches/new/ is the form
MAX_SETTLE_SECONDS = 7 * 24 * 3600
MAX_IGNORES = 20
# Column types a text id (value, key, json:PATH) can be compared with, and the integer types an offset needs.
TEXT_TYPES = ("text", "character varying", "character", "uuid", "citext")
INTEGER_TYPES = ("smallint", "integer", "bigint")
NUMERIC_TYPES = INTEGER_TYPES + ("numeric",)


@dataclass
class WatchSpec:
    name: str
    group: str
    topic: str
    cluster: str = "default"
    sink_table: str = ""
    record_id: str = ""
    row_id: str = ""
    start_from: str = "earliest"
    settle_seconds: int = 30
    ignore: list = field(default_factory=list)
    keyed: bool = False
    extra: dict = field(default_factory=dict)   # unknown keys (from a file or the API): refused

    FIELDS = ("group", "topic", "cluster", "sink_table", "record_id", "row_id", "start_from", "settle_seconds",
              "ignore", "keyed")

    @classmethod
    def from_mapping(cls, name: str, values: dict) -> "WatchSpec":
        known = {k: v for k, v in values.items() if k in cls.FIELDS}
        if isinstance(known.get("start_from"), datetime):
            # A TOML datetime written unquoted: the same text as quoted, and without an offset taken as UTC,
            # like a text date and time without one (offset_specs.parse_moment).
            moment = known["start_from"]
            known["start_from"] = (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).isoformat()
        return cls(name=name, **{"group": "", "topic": "", **known},
                   extra={k: v for k, v in values.items() if k not in cls.FIELDS})

    @property
    def audits(self) -> bool:
        return bool(self.sink_table or self.record_id or self.row_id)

    @property
    def columns(self) -> list[str]:
        return [c.strip() for c in self.row_id.split(",")] if self.row_id else []


@dataclass
class Validated:
    """What validation learnt on the way: the partitions and where the audit of each starts, and notes
    (allowed, but worth saying)."""

    start_offsets: dict[int, int]
    notes: list[str]
    topic_id: str = ""   # the topic's id (KIP-516) the start offsets were read from; "" when Kafka gives none


def validate(spec: WatchSpec) -> Validated:
    problems: dict[str, str] = {}
    for key in spec.extra:
        problems[key] = f"unknown setting {key!r}: use {', '.join(WatchSpec.FIELDS)}"
    _check_types(spec, problems)
    if "name" not in problems:
        if not NAME_PATTERN.fullmatch(spec.name):
            problems["name"] = ("use 1 to 100 lower-case letters, digits, '-' or '_', starting with a letter or "
                                f"digit (got {spec.name!r})")
        elif spec.name in RESERVED_NAMES:
            problems["name"] = f"{spec.name!r} is reserved (a page of the dashboard): choose another name"
        elif Watch.objects.filter(name=spec.name).exists():
            problems["name"] = f"a watch named {spec.name!r} exists already: choose another name or delete it first"
    if "group" not in problems and not spec.group:
        problems["group"] = "required: the consumer group to watch (--group)"
    if "cluster" not in problems:
        try:   # its secrets too (a password file removed): else the topic's check fails, under "topic"
            clusters.check_settings(spec.cluster or clusters.DEFAULT)
        except ClusterConfigError as exc:
            problems["cluster"] = exc.problem if exc.cluster == spec.cluster else str(exc)
    moment = _check_start(spec, problems)
    if "settle_seconds" not in problems and not 0 <= spec.settle_seconds <= MAX_SETTLE_SECONDS:
        problems["settle_seconds"] = f"a whole number of seconds from 0 to {MAX_SETTLE_SECONDS}"
    _check_ignores(spec, problems)
    id_spec = _check_audit(spec, problems)
    partitions = None
    if not problems:  # Kafka last: a spec refused for a cheap reason does not wait on its metadata
        partitions = _check_topic(spec.topic, problems, spec.cluster)
    if problems:
        raise Invalid(problems)
    try:
        starts, topic_id = _start_offsets(spec.topic, partitions, spec.start_from, moment, spec.cluster)
    except KAFKA_ERRORS as exc:  # Kafka went down (or refused) since the topic was checked: the same field problem
        raise Invalid({"topic": f"cannot read the offsets of topic {spec.topic!r} in Kafka: "
                                f"{type(exc).__name__}: {exc}"}) from None
    notes = _commit_notes(spec, partitions)
    if id_spec is not None and spec.keyed:
        notes.append("keyed: for each id, its latest committed record must have its row; a tombstone expects none")
    return Validated(starts, notes, topic_id)


# The longest text each field stores (the model's max_length), checked before anything is written.
MAX_LENGTHS = {"name": 100, "group": 255, "topic": 249, "cluster": 64, "sink_table": table_names.MAX_QUALIFIED,
               "record_id": 300, "row_id": 200, "start_from": 40}


def _check_types(spec: WatchSpec, problems: dict) -> None:
    for name, longest in MAX_LENGTHS.items():
        value = getattr(spec, name)
        if name == "start_from" and isinstance(value, date):  # a TOML date (datetimes are text by now)
            problems[name] = (f"a date alone is not a start: write a date and time, e.g. {value.isoformat()}"
                              "T00:00:00Z")
            setattr(spec, name, "")
        elif not isinstance(value, str):
            problems[name] = f"must be text, got {type(value).__name__}"
            setattr(spec, name, "")
        elif len(value) > longest or not value.isprintable():
            problems[name] = f"at most {longest} printable characters"
            setattr(spec, name, "")
        else:
            setattr(spec, name, value.strip())
    if isinstance(spec.settle_seconds, bool) or not isinstance(spec.settle_seconds, int):
        problems["settle_seconds"] = f"must be a whole number of seconds, got {spec.settle_seconds!r}"
        spec.settle_seconds = 0
    if not isinstance(spec.keyed, bool):
        problems["keyed"] = "must be true or false"
        spec.keyed = False
    if not isinstance(spec.ignore, list) or not all(isinstance(i, str) and len(i) <= 300 and i.isprintable()
                                                    for i in spec.ignore):
        problems["ignore"] = "must be a list of SPEC=VALUE texts (at most 300 printable characters each)"
        spec.ignore = []
    if "topic" not in problems and not spec.topic:
        problems["topic"] = "required: the topic the group reads (--topic)"


def _check_start(spec: WatchSpec, problems: dict):
    if "start_from" in problems or spec.start_from in ("earliest", "latest"):
        return None
    moment = None
    try:
        moment = parse_datetime(spec.start_from)
    except ValueError:
        pass
    if moment is None:
        problems["start_from"] = (f"use earliest (the log start: the default), latest (a group that began at the "
                                  f"log end, or a table emptied since) or an ISO date and time, got "
                                  f"{spec.start_from!r}")
        return None
    try:   # as a rewind's to-datetime: Kafka finds offsets by times from 1970 to now
        return offset_specs.parse_moment(spec.start_from, timezone.now(), "start_from")
    except offset_specs.Refused as exc:
        problems["start_from"] = str(exc)
        return None


def _check_ignores(spec: WatchSpec, problems: dict) -> None:
    if "ignore" in problems:
        return
    if len(spec.ignore) > MAX_IGNORES:
        problems["ignore"] = f"at most {MAX_IGNORES} ignore specs"
        return
    for text in spec.ignore:
        try:
            record_ids.parse_ignore(text)
        except record_ids.SpecError as exc:
            problems["ignore"] = str(exc)
            return


def _check_audit(spec: WatchSpec, problems: dict):
    """The table, the record id and the row-id columns: all or none. Returns the parsed id spec or None."""
    if not spec.audits:
        if spec.keyed and "keyed" not in problems:
            problems["keyed"] = "keyed needs a table to audit: pass --sink-table, --record-id and --row-id"
        return None
    for name, option in (("sink_table", "--sink-table"), ("record_id", "--record-id"), ("row_id", "--row-id")):
        if not getattr(spec, name) and name not in problems:
            problems[name] = (f"required with an audit ({option}): the table the group writes, how a record "
                              "names its row (value, key, json:PATH or offset) and the column(s) holding that id")
    if any(name in problems for name in ("sink_table", "record_id", "row_id")):
        return None
    try:
        id_spec = record_ids.parse_spec(spec.record_id)
    except record_ids.SpecError as exc:
        problems["record_id"] = str(exc)
        return None
    if len(spec.columns) != id_spec.columns or not all(spec.columns):
        problems["row_id"] = ("offset needs two columns: --row-id PART_COL,OFFSET_COL" if id_spec.columns == 2 else
                              f"{id_spec} needs one column: the table's column holding the id")
        return None
    if len(set(spec.columns)) != len(spec.columns):
        # One column cannot hold both the partition and the offset: every record would be matched wrongly.
        problems["row_id"] = f"offset needs two different columns, got {spec.row_id!r}: --row-id PART_COL,OFFSET_COL"
        return None
    if spec.keyed and id_spec.kind == record_ids.OFFSET:
        problems["keyed"] = "keyed needs an id that records share (value, key or json:PATH), not the offset"
    table = spec.sink_table
    parts = table_names.split(table)
    problem = table_names.problem(table)
    # Every installed app's tables (API tokens, login attempts among them), as for pipelines: the trace shows a
    # watched table's rows to every viewer.
    owner = sink_names.owner_of(parts[-1]) if problem is None else None
    if owner:
        problem = f"{table!r} is not a table a consumer of yours writes ({owner}): choose the group's own table"
    if problem:
        problems["sink_table"] = problem
        return None
    with connection.cursor() as wrapper:
        cursor = wrapper.cursor
        if len(parts) == 2 and not _check_schema(cursor, parts[0], problems):
            return None
        columns = sink_checks.table_columns(cursor, parts)
        if columns is None:
            where = f" in schema {parts[0]!r}" if len(parts) == 2 else " (as a plain name: on the search_path)"
            problems["sink_table"] = (f"table {parts[-1]!r} does not exist{where}: name the table the group "
                                      f"{spec.group!r} writes, as table or schema.table")
            return None
        missing = [c for c in spec.columns if c not in columns]
        if missing:
            problems["row_id"] = (f"table {table!r} has no column {', '.join(map(repr, missing))}; its columns: "
                                  f"{', '.join(columns)}")
            return None
        for column in spec.columns:
            kind = columns[column]["type"].split("(")[0]
            allowed = INTEGER_TYPES if id_spec.kind == record_ids.OFFSET else TEXT_TYPES + NUMERIC_TYPES
            if kind not in allowed:
                problems["row_id"] = (f"column {column!r} of {table!r} is {columns[column]['type']}, which cannot "
                                      f"hold {'a partition or an offset' if id_spec.columns == 2 else 'a record id'}"
                                      f": use a column of type {', '.join(allowed)}")
                return None
        if not sink_checks.may_read(cursor, parts):
            problems["sink_table"] = sink_checks.read_refused(table)
    return id_spec


def _check_schema(cursor, schema: str, problems: dict) -> bool:
    """The schema of a `schema.table` exists and the database user may use it (else a problem, and False)."""
    cursor.execute("SELECT has_schema_privilege(current_user, oid, 'USAGE') FROM pg_namespace WHERE nspname = %s",
                   [schema])
    found = cursor.fetchone()
    if found is None:
        problems["sink_table"] = f"schema {schema!r} does not exist: name the table the group writes as schema.table"
    elif not found[0]:
        problems["sink_table"] = (f"the database user may not use schema {schema!r}: GRANT USAGE ON SCHEMA "
                                  f"{sql.Identifier(schema).as_string(cursor)} to Tally's database user")
    return found is not None and found[0]


def _check_topic(topic: str, problems: dict, cluster: str):
    partitions, problem = kafka_admin.topic_partitions_or_problem(topic, cluster)
    if problem:
        problems["topic"] = problem
    return partitions


def _start_offsets(topic: str, partitions: list[int], start_from: str, moment, cluster: str
                   ) -> tuple[dict[int, int], str]:
    """Where the audit of each partition starts, and the id of the topic they are offsets of."""
    marks = kafka_admin.watermarks(topic, partitions, cluster=cluster)
    topic_id = kafka_admin.topic_id_of(marks)
    if start_from == "earliest":
        return {p: m.log_start for p, m in marks.items()}, topic_id
    if start_from == "latest":
        return {p: m.high for p, m in marks.items()}, topic_id
    found = kafka_admin.offsets_for_time(topic, partitions, int(moment.timestamp() * 1000), cluster=cluster)
    return {p: (found.get(p) if found.get(p) is not None else m.high) for p, m in marks.items()}, topic_id


def _commit_notes(spec: WatchSpec, partitions: list[int]) -> list[str]:
    try:
        committed = kafka_admin.committed_offsets(spec.group, spec.topic, partitions, cluster=spec.cluster)
    except Exception as exc:  # noqa: BLE001 - the note says Kafka could not tell; the watch is still valid
        return [f"could not read the commits of group {spec.group!r}: {type(exc).__name__}"]
    if not any(offset is not None for offset in committed.values()):
        return [f"group {spec.group!r} has no commits on topic {spec.topic!r} yet: lag is measured from the "
                "watch's start and nothing is audited until it commits"]
    return []


def create(spec: WatchSpec, actor: str = "cli") -> tuple[Watch, list[str]]:
    """Validate, then create the watch and its partitions' starting points; audited."""
    checked = validate(spec)
    with transaction.atomic():
        watch = Watch.objects.create(name=spec.name, group_id=spec.group, topic=spec.topic, cluster=spec.cluster,
                                     topic_id=checked.topic_id,
                                     sink_table=spec.sink_table, record_id=spec.record_id,
                                     row_id=",".join(spec.columns), start_from=spec.start_from,
                                     settle_seconds=spec.settle_seconds, ignore=list(spec.ignore), keyed=spec.keyed)
        WatchPartition.objects.bulk_create(
            WatchPartition(watch=watch, partition=p, start_offset=o, settled_offset=o)
            for p, o in sorted(checked.start_offsets.items()))
        _log(watch.name, "create_watch", actor, describe(watch), f"created watch {watch.name}")
    return watch, checked.notes


def delete(name: str, actor: str = "cli") -> None:
    """Delete a watch with its ranges and history (the team's table and group are not touched)."""
    with transaction.atomic():
        watch = Watch.objects.select_for_update().filter(name=name).first()
        if watch is None:
            raise DeleteRefused(f"No watch named {name!r}.")
        described = describe(watch)
        watch.delete()
        _log(name, "delete_watch", actor, described, f"deleted watch {name} (its table and group are untouched)")


def describe(watch: Watch) -> dict:
    return {"group": watch.group_id, "topic": watch.topic, "cluster": watch.cluster, "sink_table": watch.sink_table,
            "record_id": watch.record_id, "row_id": watch.row_id, "start_from": watch.start_from,
            "settle_seconds": watch.settle_seconds, "ignore": list(watch.ignore), "keyed": watch.keyed}


def _log(name: str, action: str, actor: str, params: dict, message: str) -> None:
    now = timezone.now()
    ActionLog.objects.create(pipeline=None, group_id=params.get("group", ""), action=action, actor=actor[:150],
                             params={"watch": name, **params}, result=ActionResult.DONE, message=message,
                             created_at=now, finished_at=now)
