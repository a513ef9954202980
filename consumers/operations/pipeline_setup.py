"""Adding, changing and deleting pipelines without code: one validation behind every door.

The command line (`manage.py pipeline create|apply|delete`), the dashboard's form, the JSON API, the Django
admin and the declarative file (pipelines.toml) all build a `PipelineSpec` and call `validate()` / `create()`
(and, for a change, `check_update()` / `update()`) here, so every door accepts and refuses the same things with
the same messages. Every message says what to do next.

What a spec must satisfy before anything is written:
  1. a free, slug-like name; a consumer group no other pipeline uses (defaults to the name);
  2. a known delivery mode and engine, and a transform that resolves (a registered name or a dotted path);
     a known isolation level (read_committed, the default, or read_uncommitted: python engine only) and
     policy for a log truncated past the stored position (stop, the default, or skip);
     a number of runs (processes sharing the partitions) from 1 to TALLY_MAX_RUNS_PER_PIPELINE, python engine
     only for more than one; a known Kafka client (empty: the worker's TALLY_KAFKA_CLIENT; kafka-python; or
     librdkafka: python engine only, and the extra tally[rdkafka] installed);
  3. a known Kafka cluster whose settings can be read, secrets too (a password file removed is the cluster's
     problem, not the topic's); the topic exists in Kafka (asked last, and only when nothing else is wrong:
     Kafka may be slow to answer);
  4. the sink table exists with the transform's columns and the provenance columns, the database user may
     insert into it, every NOT NULL column without a default is written, and (exactly-once) a unique key on
     the provenance — or `create_table` is set, or the problem comes with the exact SQL that fixes it;
  5. `transform = "json"`: the table exists and the mapping (`map`, {column: source}) fits its columns
     (consumers/engine/json_map.py); an upsert key (`upsert_key`) names NOT NULL columns the transform
     writes, with a unique constraint on exactly them (instead of the provenance key), and
     `delete_on_tombstone` needs that key to come from the record's key (`@key`), since a tombstone has no value.
"""
import re
from dataclasses import dataclass, field, fields

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from psycopg2 import sql

from consumers.engine import json_map, sink_checks, sink_names, sinks
from consumers.engine.transforms import JSON, Transform, resolve
from consumers.kafka import admin as kafka_admin
from consumers.kafka import clusters
from consumers.kafka.errors import ClusterConfigError
from consumers.models import (
    ActionLog,
    ActionResult,
    DeliveryMode,
    DesiredState,
    Engine,
    IsolationLevel,
    KafkaClient,
    LogTruncatedPolicy,
    Pipeline,
    runs_problem,
)
from consumers.operations.errors import DeleteRefused, Invalid

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}\Z")  # \Z: "$" would take a name ending in a newline
TOPIC_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,249}\Z")  # Kafka's own rule for topic names
RESERVED_NAMES = ("new",)  # /pipelines/new/ is the form that adds a pipeline
DELIVERY_MODES = {"exactly-once": DeliveryMode.EXACTLY_ONCE, "at-least-once": DeliveryMode.AT_LEAST_ONCE,
         "at-most-once": DeliveryMode.AT_MOST_ONCE}
# Fields of an existing pipeline that `apply` may change (while it is stopped); the others define its data and
# history. Isolation and the truncation policy say how the log is read from the stored positions on.
MUTABLE_FIELDS = ("transform", "engine", "isolation_level", "on_log_truncated", "runs", "map", "kafka_client")
# Every setting a spec compares, stores and describes (besides the name).
SETTINGS = ("cluster", "topic", "sink_table", "mode", "transform", "group_id", "engine", "isolation_level",
            "on_log_truncated", "runs", "map", "upsert_key", "delete_on_tombstone", "kafka_client")
# Spec settings stored under another name on Pipeline (`runs` there is the reverse relation to its ConsumerRuns).
COLUMNS = {"runs": "parallel_runs", "map": "json_map"}


@dataclass
class PipelineSpec:
    name: str
    topic: str
    sink_table: str
    mode: str = "exactly-once"
    transform: str = "int_value"
    group: str = ""
    engine: str = Engine.PYTHON
    isolation_level: str = IsolationLevel.READ_COMMITTED
    on_log_truncated: str = LogTruncatedPolicy.STOP
    runs: int = 1
    create_table: bool = False
    cluster: str = "default"   # a Kafka cluster's name (consumers/kafka/clusters.py)
    map: dict = field(default_factory=dict)       # --transform json: {column: source}
    upsert_key: list = field(default_factory=list)  # columns of the key: one row per key, kept current
    delete_on_tombstone: bool = False
    kafka_client: str = KafkaClient.WORKER_DEFAULT   # the python engine's client; empty: TALLY_KAFKA_CLIENT
    extra: dict = field(default_factory=dict)   # unknown keys (from a file): refused by validate()

    def __post_init__(self):
        if isinstance(self.upsert_key, str):  # "a,b" from the command line or a file
            self.upsert_key = [part.strip() for part in self.upsert_key.split(",") if part.strip()]

    @property
    def group_id(self) -> str:
        return self.group or self.name

    @property
    def delivery_mode(self) -> str:
        return DELIVERY_MODES.get(self.mode, self.mode if self.mode in DeliveryMode.values else "")

    @classmethod
    def from_mapping(cls, name: str, values: dict) -> "PipelineSpec":
        """A spec from a file's table (`[pipelines.NAME]`); unknown keys are kept for validate() to refuse."""
        known = {f.name for f in fields(cls)} - {"name", "extra"}
        return cls(name=name, topic=values.get("topic", ""), sink_table=values.get("sink_table", ""),
                   **{k: v for k, v in values.items() if k in known - {"topic", "sink_table"}},
                   extra={k: v for k, v in values.items() if k not in known})

    @classmethod
    def of(cls, pipeline: Pipeline) -> "PipelineSpec":
        return cls(name=pipeline.name, topic=pipeline.topic, sink_table=pipeline.sink_table,
                   mode=DeliveryMode(pipeline.delivery_mode).label, transform=pipeline.transform,
                   group=pipeline.group_id, engine=pipeline.engine, isolation_level=pipeline.isolation_level,
                   on_log_truncated=pipeline.on_log_truncated, cluster=pipeline.cluster, runs=pipeline.parallel_runs,
                   map=dict(pipeline.json_map or {}), upsert_key=list(pipeline.upsert_key or []),
                   delete_on_tombstone=pipeline.delete_on_tombstone, kafka_client=pipeline.kafka_client)


def validate(spec: PipelineSpec, *, existing: Pipeline | None = None) -> Transform:
    """Raise Invalid with every problem found; return the resolved transform when there is none.
    `existing` is the pipeline the spec would update (its own name and group are then not taken)."""
    problems: dict[str, str] = {}
    for key in spec.extra:
        problems[key] = (f"unknown setting {key!r}: use name, topic, sink_table, mode, transform, group, engine, "
                         f"isolation_level, on_log_truncated, cluster, runs, create_table, map, upsert_key, "
                         f"delete_on_tombstone or kafka_client")
    _check_scalars(spec, problems)
    if not NAME_PATTERN.fullmatch(spec.name or ""):
        problems["name"] = ("use 1 to 100 lower-case letters, digits, '-' or '_', starting with a letter or digit "
                            f"(got {spec.name!r})")
    elif spec.name in RESERVED_NAMES:
        problems["name"] = f"{spec.name!r} is reserved (it is a page of the dashboard): choose another name"
    elif existing is None and Pipeline.objects.filter(name=spec.name).exists():
        problems["name"] = (f"a pipeline named {spec.name!r} exists already: choose another name, or "
                            f"`pipeline delete {spec.name}` first")
    longest = Pipeline._meta.get_field("group_id").max_length
    owner = Pipeline.objects.filter(group_id=spec.group_id).exclude(pk=existing.pk if existing else None).first()
    if len(spec.group_id) > longest:
        problems["group"] = f"a consumer group id is at most {longest} characters"
    elif owner is not None:
        problems["group"] = (f"consumer group {spec.group_id!r} is used by pipeline {owner.name!r}: two pipelines in "
                             "one group would take each other's partitions; pass another --group")
    if not spec.delivery_mode:
        problems["mode"] = f"unknown delivery mode {spec.mode!r}: use one of {', '.join(DELIVERY_MODES)}"
    if spec.engine not in Engine.values:
        problems["engine"] = f"unknown engine {spec.engine!r}: use one of {', '.join(Engine.values)}"
    _check_reading(spec, problems)
    transform = None
    if spec.transform != JSON:
        try:
            transform = resolve(spec.transform)
        except LookupError as exc:
            problems["transform"] = (f"{exc}. A transform is a consumers.engine.transforms.Transform object, or "
                                     "json to map JSON fields onto the table's columns; see README 'Add your own "
                                     "pipeline'")
    _check_cluster(spec, problems)
    if "topic" not in problems and not TOPIC_PATTERN.match(spec.topic):
        problems["topic"] = ("a Kafka topic name has 1 to 249 letters, digits, '.', '_' or '-' "
                             f"(got {spec.topic[:300]!r})")
    if "sink_table" not in problems:
        check_table_name(spec.sink_table, problems)
    if "sink_table" not in problems:
        _check_table_is_not_shared(spec, existing, problems)
    if spec.transform == JSON and "sink_table" not in problems:
        transform = _compile_json(spec, problems)
    _check_keyed(spec, transform, problems)
    if transform is not None and "sink_table" not in problems and spec.delivery_mode:
        _check_sink_table(spec, transform, problems)
    if existing is None and "sink_table" not in problems and not spec.upsert_key:
        _check_table_holds_no_rows_of_topic(spec, problems)
    # Kafka last, and only for an otherwise valid spec: its metadata may take the client's whole timeout, and
    # a request already refused for a cheap reason must not wait for it.
    if not problems:
        _check_topic(spec.topic, problems, spec.cluster)
    if problems:
        raise Invalid(problems)
    return transform


def _check_table_is_not_shared(spec: PipelineSpec, existing, problems: dict) -> None:
    """One topic's records go into a table through one pipeline: a second would meet the first's rows (its
    provenance key refuses them), and its rewind with --rollback-sink would delete them."""
    sharer = (Pipeline.objects.filter(sink_table=spec.sink_table, topic=spec.topic,
                                      cluster=spec.cluster or clusters.DEFAULT)
              .exclude(pk=existing.pk if existing else None).first())
    if sharer is not None:
        problems["sink_table"] = (f"pipeline {sharer.name!r} already writes topic {spec.topic!r} into "
                                  f"{spec.sink_table!r}: choose another table (its rows are that pipeline's, and "
                                  "a rewind of this one could delete them)")


def _check_table_holds_no_rows_of_topic(spec: PipelineSpec, problems: dict) -> None:
    """A new exactly-once pipeline reads its topic from the log start. Rows of that topic already in its table --
    a deleted pipeline's, since `pipeline delete` leaves the table to its owner -- meet its provenance key: its
    first batch is refused (23505) and the pipeline halts with a sink error instead of running."""
    if spec.delivery_mode != DeliveryMode.EXACTLY_ONCE:
        return
    with connection.cursor() as cursor:
        if "source_topic" not in (sink_checks.table_columns(cursor.cursor, spec.sink_table) or {}):
            return   # no table yet (--create-table), or one without provenance, which another check refuses
        cursor.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE source_topic = %s)").format(
            sql.Identifier(spec.sink_table)), [spec.topic])
        if cursor.fetchone()[0]:
            problems["sink_table"] = (f"table {spec.sink_table!r} already holds rows of topic {spec.topic!r} (a "
                                      "deleted pipeline's?): a new pipeline reads the topic from its start, and "
                                      "those rows would refuse its first batch. Empty the table, or choose another")


def _check_scalars(spec: PipelineSpec, problems: dict) -> None:
    for name in ("name", "topic", "sink_table", "mode", "transform", "group", "engine", "isolation_level",
                 "on_log_truncated", "cluster", "kafka_client"):
        if not isinstance(getattr(spec, name), str):
            problems[name] = f"must be text, got {type(getattr(spec, name)).__name__}"
            setattr(spec, name, "")
    if isinstance(spec.runs, bool) or not isinstance(spec.runs, int):
        problems["runs"] = f"must be a whole number, got {type(spec.runs).__name__}"
        spec.runs = 1
    if not isinstance(spec.create_table, bool):
        problems["create_table"] = "must be true or false"
        spec.create_table = False
    # A value that was not text has just been blanked: its "must be text" stays the answer.
    if "topic" not in problems and not spec.topic:
        problems["topic"] = "required: the Kafka topic to consume (--topic)"
    if "sink_table" not in problems and not spec.sink_table:
        problems["sink_table"] = "required: the PostgreSQL table to write (--sink-table)"
    if not isinstance(spec.map, dict) or not all(isinstance(v, str) for v in spec.map.values()):
        problems["map"] = 'must map column names to sources as text, e.g. map = { order_id = "id" }'
        spec.map = {}
    if not isinstance(spec.upsert_key, list) or not all(isinstance(c, str) and c for c in spec.upsert_key):
        problems["upsert_key"] = 'must be column names, e.g. upsert_key = ["order_id"] (--upsert-key order_id)'
        spec.upsert_key = []
    if not isinstance(spec.delete_on_tombstone, bool):
        problems["delete_on_tombstone"] = "must be true or false"
        spec.delete_on_tombstone = False


def _check_reading(spec: PipelineSpec, problems: dict) -> None:
    """How the log is read: isolation level, and what to do when the log start passed the stored position.
    A value that is not text was refused already (_check_scalars)."""
    if "isolation_level" not in problems:
        if spec.isolation_level not in IsolationLevel.values:
            problems["isolation_level"] = (f"unknown isolation level {spec.isolation_level!r}: use read_committed "
                                           "(the default: records of aborted transactions never reach the sink) or "
                                           "read_uncommitted")
        elif spec.isolation_level != IsolationLevel.READ_COMMITTED and spec.engine == Engine.SPARK:
            problems["isolation_level"] = ("the spark engine reads read_committed only: use the python engine for "
                                           "read_uncommitted")
    if "runs" not in problems and (problem := runs_problem(spec.runs, spec.engine)):
        problems["runs"] = problem
    if "kafka_client" not in problems:
        problem = _kafka_client_problem(spec)
        if problem:
            problems["kafka_client"] = problem
    if "on_log_truncated" not in problems and spec.on_log_truncated not in LogTruncatedPolicy.values:
        problems["on_log_truncated"] = (f"unknown policy {spec.on_log_truncated!r} for a log truncated past the "
                                        "stored position: use stop (the default: the run stops and says why) or "
                                        "skip (skip the lost records, note them in the ledger, alert)")


def _kafka_client_problem(spec: PipelineSpec) -> str:
    if spec.kafka_client not in KafkaClient.values:
        return (f"unknown Kafka client {spec.kafka_client!r}: use kafka-python, librdkafka, or leave it empty for the "
                f"worker's default (TALLY_KAFKA_CLIENT, now {settings.TALLY_KAFKA_CLIENT})")
    if spec.kafka_client != KafkaClient.LIBRDKAFKA:
        return ""
    if spec.engine == Engine.SPARK:
        return "the spark engine reads Kafka with its own source: use the python engine for librdkafka"
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return "librdkafka needs the confluent-kafka package: pip install 'tally[rdkafka]' (or choose kafka-python)"
    return ""


def _compile_json(spec: PipelineSpec, problems: dict) -> Transform | None:
    """`--transform json`: compile the mapping against the table's columns (the same compile the run does)."""
    if spec.create_table:
        problems["create_table"] = ("--transform json maps onto the columns of an existing table: create the "
                                    "table with the types you want, then create the pipeline without --create-table")
        return None
    with connection.cursor() as wrapper:
        try:
            plan = json_map.plan_for_table(wrapper.cursor, spec.sink_table, spec.map)
        except json_map.MappingInvalid as exc:
            field_name = "sink_table" if "does not exist" in str(exc) else "map"
            problems[field_name] = "; ".join(exc.problems)
            return None
    if spec.engine == Engine.SPARK and any(w.source.startswith("@header:") for w in plan.columns):
        problems["map"] = "the spark engine does not read headers: use the python engine for @header:NAME sources"
    return plan.transform(tuple(spec.upsert_key))


def _check_keyed(spec: PipelineSpec, transform: Transform | None, problems: dict) -> None:
    """A mapping is for --transform json; an upsert key names written columns; tombstones need a keyed record."""
    if spec.map and spec.transform != JSON and "map" not in problems:
        problems["map"] = "a mapping applies to --transform json only"
    if spec.delete_on_tombstone and not spec.upsert_key and "delete_on_tombstone" not in problems:
        problems["delete_on_tombstone"] = "deletes on tombstones need an upsert key (--upsert-key COLUMN)"
    if not spec.upsert_key or transform is None:
        return
    if spec.delivery_mode and spec.delivery_mode != DeliveryMode.EXACTLY_ONCE:
        problems["upsert_key"] = "an upsert pipeline writes in place exactly once: use --mode exactly-once"
    elif transform.multi_row:
        problems["upsert_key"] = f"transform {transform.name!r} writes several rows per record: it cannot upsert"
    elif unknown := [c for c in spec.upsert_key if c not in dict(transform.columns)]:
        problems["upsert_key"] = (f"column(s) {', '.join(unknown)} are not written by transform {transform.name!r} "
                                  f"(it writes {', '.join(dict(transform.columns))})")
    elif spec.delete_on_tombstone and transform.tombstone_key is None:
        problems["delete_on_tombstone"] = ("a tombstone has no value, so each upsert key column must come from the "
                                           "record's key: map it with --map COLUMN=@key (or @key.PATH for a JSON key)")


def _check_upsert_table(cursor, spec: PipelineSpec, columns: dict) -> list[str]:
    """What an upsert sink needs: NOT NULL key columns and a unique constraint on exactly the key."""
    fixes = [sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET NOT NULL;").format(
        sql.Identifier(spec.sink_table), sql.Identifier(c)).as_string(cursor)
        for c in spec.upsert_key if c in columns and not columns[c]["not_null"]]
    if not sink_checks.has_unique_key(cursor, spec.sink_table, spec.upsert_key):
        fixes.append(sink_checks.unique_key_sql(cursor, spec.sink_table, None, spec.upsert_key, "upsert_key"))
    return fixes


def _check_cluster(spec: PipelineSpec, problems: dict) -> None:
    if "cluster" in problems:
        return
    try:   # its secrets too (a password file removed): else the topic's check fails, under "topic"
        clusters.check_settings(spec.cluster or clusters.DEFAULT)
    except ClusterConfigError as exc:
        problems["cluster"] = exc.problem if exc.cluster == spec.cluster else str(exc)


def _check_topic(topic: str, problems: dict, cluster=None) -> None:
    problem = kafka_admin.topic_partitions_or_problem(topic, cluster)[1]
    if problem:
        problems["topic"] = problem


def check_table_name(table: str, problems: dict) -> None:
    problem = sink_names.name_problem(table)
    if problem is None:
        with connection.cursor() as cursor:
            problem = sink_names.schema_problem(cursor, table)
    if problem:
        problems["sink_table"] = problem


def _check_sink_table(spec: PipelineSpec, transform: Transform, problems: dict) -> None:
    exactly_once = spec.delivery_mode == DeliveryMode.EXACTLY_ONCE
    with connection.cursor() as wrapper:
        cursor = wrapper.cursor  # psycopg2's own cursor: sql.Composed.as_string needs it
        columns = sink_checks.table_columns(cursor, spec.sink_table)
        if columns is None:
            if not spec.create_table:
                statement = sink_checks.create_table_sql(cursor, spec.sink_table, transform, exactly_once)
                problems["sink_table"] = (f"table {spec.sink_table!r} does not exist: pass --create-table (or "
                                          f"create_table = true) to create it, or create it with:\n{statement}")
            return
        fixes = sink_checks.missing_column_fixes(cursor, spec.sink_table, transform, columns)
        if spec.upsert_key and "upsert_key" not in problems:
            key_fixes = _check_upsert_table(cursor, spec, columns)
            if key_fixes:
                problems["upsert_key"] = (f"table {spec.sink_table!r} has no unique constraint on the upsert key "
                                          f"({', '.join(spec.upsert_key)}) with NOT NULL columns; run:\n"
                                          + "\n".join(key_fixes))
        elif exactly_once and not sink_checks.has_unique_provenance_key(cursor, spec.sink_table, transform):
            fixes.append(sink_checks.unique_key_sql(cursor, spec.sink_table, transform))
        if fixes:
            problems["sink_table"] = (f"table {spec.sink_table!r} lacks what a {spec.mode} pipeline with transform "
                                      f"{transform.name!r} needs; run:\n" + "\n".join(fixes))
            return
        unwritten = [name for name, info in columns.items() if info["required"]
                     and name not in sinks.insert_columns(transform)]
        if unwritten:
            problems["sink_table"] = (f"columns {', '.join(unwritten)} of {spec.sink_table!r} are NOT NULL without a "
                                      f"default and transform {transform.name!r} does not write them: give them a "
                                      "default or drop NOT NULL")
            return
        upsert = bool(spec.upsert_key)
        if not sink_checks.has_privileges(cursor, spec.sink_table, update=upsert):
            problems["sink_table"] = (f"the database user may not select, insert{', update' if upsert else ''} and "
                                      f"delete in {spec.sink_table!r}: "
                                      f"{sink_checks.grant_sql(cursor, spec.sink_table, update=upsert)}")


def create(spec: PipelineSpec, actor: str = "cli") -> Pipeline:
    """Validate and create the pipeline (stopped), creating its sink table when asked; audited."""
    transform = validate(spec)
    with transaction.atomic():
        pipeline = Pipeline.objects.create(
            name=spec.name, topic=spec.topic, sink_table=spec.sink_table, transform=spec.transform,
            delivery_mode=spec.delivery_mode, group_id=spec.group_id, engine=spec.engine,
            isolation_level=spec.isolation_level, on_log_truncated=spec.on_log_truncated,
            cluster=spec.cluster or clusters.DEFAULT, parallel_runs=spec.runs,
            json_map=spec.map, upsert_key=spec.upsert_key, delete_on_tombstone=spec.delete_on_tombstone,
            kafka_client=spec.kafka_client, desired_state=DesiredState.STOPPED)
        if spec.create_table:
            with connection.cursor() as cursor:
                sinks.ensure_sink_table(cursor, spec.sink_table, transform, pipeline.is_exactly_once)
        _log_action(pipeline, "create", actor, describe(spec), f"created pipeline {spec.name}")
    return pipeline


def changes(spec: PipelineSpec, pipeline: Pipeline) -> dict[str, tuple[str, str]]:
    """{field: (current, wanted)} between a pipeline and a spec of the same name."""
    current = PipelineSpec.of(pipeline)
    diff = {}
    for name in SETTINGS:
        before, after = getattr(current, name), getattr(spec, name)
        if name == "mode":
            before, after = pipeline.delivery_mode, spec.delivery_mode
        if before != after:
            diff[name] = (before, after)
    return diff


def check_update(spec: PipelineSpec, pipeline: Pipeline) -> dict[str, tuple[str, str]]:
    """The changes `apply` would make to `pipeline`, or Invalid when one is not allowed."""
    diff = changes(spec, pipeline)
    problems = {}
    fixed = [f for f in diff if f not in MUTABLE_FIELDS]
    if fixed:
        problems["name"] = (f"pipeline {pipeline.name!r}: {', '.join(fixed)} cannot change (its positions, ledger "
                            f"and sink rows belong to them): delete it and create it again, or use a new name")
    elif diff and pipeline.desired_state != DesiredState.STOPPED:
        problems["name"] = f"pipeline {pipeline.name!r} is {pipeline.desired_state}: stop it before changing it"
    if not problems and diff:
        try:
            validate(spec, existing=pipeline)
        except Invalid as exc:
            problems.update(exc.problems)
    if problems:
        raise Invalid(problems)
    return diff


def update(spec: PipelineSpec, pipeline: Pipeline, actor: str = "cli") -> dict:
    diff = check_update(spec, pipeline)
    if diff:
        with transaction.atomic():
            Pipeline.objects.filter(pk=pipeline.pk).update(
                **{COLUMNS.get(name, name): getattr(spec, name) for name in MUTABLE_FIELDS}, updated_at=timezone.now())
            _log_action(pipeline, "update", actor, {k: {"from": a, "to": b} for k, (a, b) in diff.items()},
                   "changed " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in diff.items()))
    return diff


def delete(name: str, actor: str = "cli") -> None:
    """Delete a stopped pipeline with its positions, ledger and dead letters. The action log keeps its
    entries (they name the pipeline in their parameters); the sink table is left to its owner."""
    with transaction.atomic():
        pipeline = Pipeline.objects.select_for_update().filter(name=name).first()
        if pipeline is None:
            raise DeleteRefused(f"No pipeline named {name!r}.")
        if pipeline.desired_state != DesiredState.STOPPED:
            raise DeleteRefused(f"Pipeline {name!r} is {pipeline.desired_state}: `pipeline stop {name}` first.")
        # Alive, not unended: a killed run never says it ended, and must not block the delete forever.
        if pipeline.runs.alive(timezone.now()).exists():
            raise DeleteRefused(f"Pipeline {name!r} is stopped but still has live runs: try again when they "
                                f"have ended (within {settings.TALLY_RUN_LEASE_SECONDS} s).")
        # The entries lose their link with the row: keep the name in their parameters.
        for entry in ActionLog.objects.filter(pipeline=pipeline).exclude(params__has_key="pipeline"):
            entry.params = {**entry.params, "pipeline": name}
            entry.save(update_fields=["params"])
        spec = describe(PipelineSpec.of(pipeline))
        pipeline.delete()
        ActionLog.objects.create(pipeline=None, action="delete", actor=actor, params={"pipeline": name, **spec},
                                 result=ActionResult.DONE, message=f"deleted pipeline {name} (sink table "
                                 f"{spec['sink_table']} kept)", finished_at=timezone.now())


def describe(spec: PipelineSpec) -> dict:
    return {"topic": spec.topic, "sink_table": spec.sink_table, "mode": spec.mode, "transform": spec.transform,
            "group": spec.group_id, "engine": spec.engine, "isolation_level": spec.isolation_level,
            "on_log_truncated": spec.on_log_truncated, "cluster": spec.cluster, "runs": spec.runs, "map": spec.map,
            "upsert_key": spec.upsert_key, "delete_on_tombstone": spec.delete_on_tombstone,
            "kafka_client": spec.kafka_client}


def _log_action(pipeline: Pipeline, action: str, actor: str, params: dict, message: str) -> None:
    ActionLog.objects.create(pipeline=pipeline, action=action, actor=actor,
                             params={"pipeline": pipeline.name, **params}, result=ActionResult.DONE,
                             message=message, finished_at=timezone.now())
