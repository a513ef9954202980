"""The topic check: did every record a consumer group consumed reach its table, once? Key by key, with Spark.

extract   the topic from the log start up to the group's committed offsets (Kafka's, or Tally's own
          `next_offset` for its exactly-once pipelines), each record mapped to its key by a value parser;
          the table's keys with their write counts (the GROUP BY runs inside PostgreSQL, over JDBC)
transform `compare()`: a pure DataFrame-in, DataFrame-out function -> one row per key that is wrong
load      counts and samples into a JSON report (stored in consumers.models.TopicCheckJob by `run_topic_check_job`)

Findings: missing (consumed, never written), duplicated (written more often than consumed, at least
twice), unexpected (written, never consumed in the range: e.g. a record beyond the committed offset),
unparsable (records the value parser cannot map to a key: the pipeline's dead letters).

What is checked comes from a pipeline's own definition — its topic, group, sink table, and the key column
and value parser of its transform — never from a request: no table name is taken from a user, so no
other table (users, sessions, tokens) can be read through a topic check. A failed topic check stores a message that
names the pipeline and the kind of failure, never the values Spark or the database saw.
"""
import logging
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Min
from django.utils import timezone
from psycopg2 import sql

from consumers.engine import db
from consumers.kafka import admin as kafka_admin
from consumers.kafka import clusters
from consumers.kafka.errors import ClusterConfigError
from consumers.models import BatchLedger, PartitionOffset, Pipeline, TopicCheckJob, TopicCheckStatus
from consumers.models.topic_check import PROGRESS_MESSAGE_LENGTH, topic_check_lease
from consumers.operations.actions import queued_tasks

log = logging.getLogger("tally.spark.topic_check")

# Samples per finding kept in the report: enough to name every lost value of a demo-sized topic, small
# enough to store in one JSON column when a whole table is missing.
SAMPLE_LIMIT = 1000
# Enqueued by name: the tasks import this module, never the reverse (consumers/tasks/spark.py).
RUN_TOPIC_CHECK_TASK = "consumers.run_topic_check"
# Rows per JDBC round trip: PostgreSQL's driver otherwise loads the whole result into the JVM at once.
JDBC_FETCH_SIZE = 50_000


class TopicCheckError(RuntimeError):
    pass


# --- value parsers: record -> key, as Spark column expressions (no Python per record) ---------------------
# A record a parser cannot map gets a null key (try_cast: Spark's ANSI casts would fail the job) and is
# reported as unparsable, like the dead letter the transform makes of it.
def _as_int(text):
    """int(text) as the transforms read a plain integer: whitespace around it, a sign, underscores between digits
    ("1_000"); anything else null."""
    from pyspark.sql import functions as F

    stripped = F.regexp_replace(text, r"^\s+|\s+$", "")
    plain = stripped.rlike(r"^[+-]?[0-9]+(_[0-9]+)*$")
    return F.when(plain, F.regexp_replace(stripped, "_", "")).try_cast("bigint")


def _int_value(frame):
    from pyspark.sql import functions as F

    return frame.select(_as_int(F.col("value").cast("string")).alias("key"))


def _string_value(frame):
    from pyspark.sql import functions as F

    return frame.select(F.col("value").cast("string").alias("key"))


def _json_id(frame):
    from pyspark.sql import functions as F

    return frame.select(F.get_json_object(F.col("value").cast("string"), "$.id").try_cast("bigint").alias("key"))


def _csv_ints(frame):
    from pyspark.sql import functions as F

    # The transform makes one dead letter of a record with any part that is not an integer, and of a tombstone:
    # such a record is one null key (unparsable), never the parts that were integers (which no row holds).
    parts = F.transform(F.split(F.col("value").cast("string"), ","), _as_int)
    bad = F.col("value").isNull() | F.exists(parts, lambda key: key.isNull())
    keys = F.when(bad, F.array(F.lit(None).cast("bigint"))).otherwise(parts)
    return frame.select(F.explode(keys).alias("key"))


def _record_key(frame):
    from pyspark.sql import functions as F

    return frame.select(F.col("key").cast("string").alias("key"))


VALUE_PARSERS: dict[str, Callable] = {
    "int_value": _int_value,        # "42" -> 42 (the classic example; transform int_value)
    "json_id": _json_id,            # {"id": 42, ...} -> 42 (transform json_event)
    "csv_ints": _csv_ints,          # "1,2,3" -> 1, 2, 3 (transform csv_ints)
    "string_value": _string_value,  # the value as text
    "record_key": _record_key,      # the Kafka record key as text
}


# The topic check's value parser that reads a record the way each built-in transform does.
PARSER_FOR_TRANSFORM = {"int_value": "int_value", "json_event": "json_id", "csv_ints": "csv_ints"}


@dataclass(frozen=True)
class PipelineTopicCheck:
    """What a topic check of a pipeline reads: all of it from the pipeline's definition."""

    topic: str
    group_id: str
    table: str
    key_column: str
    value_parser: str


def topic_check_spec(pipeline: Pipeline) -> PipelineTopicCheck:
    """The pipeline's sink table, with its transform's first column as the key; refused (TopicCheckError) for
    a transform that has no topic check parser."""
    from consumers.engine.transforms import resolve

    parser = PARSER_FOR_TRANSFORM.get(pipeline.transform)
    if parser is None:
        raise TopicCheckError(f"Pipeline {pipeline.name!r} uses transform {pipeline.transform!r}, which has no Spark "
                         f"topic check parser: topic checks cover {', '.join(sorted(PARSER_FOR_TRANSFORM))}.")
    key_column = resolve(pipeline.transform).columns[0][0]
    return PipelineTopicCheck(pipeline.topic, pipeline.group_id, pipeline.sink_table, key_column, parser)


def parser_for(name: str) -> Callable:
    try:
        return VALUE_PARSERS[name]
    except KeyError:
        raise TopicCheckError(f"Unknown value parser {name!r}: use one of {sorted(VALUE_PARSERS)}") from None


# --- extract ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConsumedRange:
    topic: str
    start: dict[int, int]   # log start per partition
    end: dict[int, int]     # the group's committed offset (exclusive) per partition
    source: str             # "kafka" or "tally"
    cluster: str = "default"

    @property
    def records(self) -> int:
        return sum(self.end[p] - self.start[p] for p in self.end)


def consumed_range(topic: str, group_id: str, pipeline: Pipeline | None = None, cluster=None) -> ConsumedRange:
    """[start, committed) per partition. Exactly-once pipelines of Tally: from the first offset their ledger holds
    (a pipeline that started at the log end, by its reset policy, never consumed what lay before) to the DB's
    next_offset (the truth, Kafka's copy is advisory), as reconciliation reads them; otherwise from the log start
    to Kafka's committed offsets (what the group claims)."""
    cluster = pipeline.cluster if pipeline is not None else (cluster or clusters.DEFAULT)
    marks = kafka_admin.watermarks(topic, cluster=cluster)
    first: dict[int, int] = {}
    if pipeline is not None and pipeline.is_exactly_once:
        source = "tally"
        committed = dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))
        first = dict(BatchLedger.objects.filter(pipeline=pipeline).values("partition")
                     .annotate(first=Min("first_offset")).values_list("partition", "first"))
    else:
        source = "kafka"
        committed = kafka_admin.committed_offsets(group_id, topic, sorted(marks), cluster=cluster)
    end = {p: min(max(committed.get(p) or m.log_start, m.log_start), m.high) for p, m in marks.items()}
    if source == "tally":   # a partition with no ledger row consumed nothing: an empty range
        start = {p: min(max(first.get(p, end[p]), m.log_start), end[p]) for p, m in marks.items()}
    else:
        start = {p: m.log_start for p, m in marks.items()}
    return ConsumedRange(topic, start, end, source, cluster)


def extract_consumed(spark, consumed: ConsumedRange, parser: Callable):
    from consumers.engine.spark_source import cluster_options, kafka_format, offsets_json

    cluster = clusters.get(consumed.cluster)
    frame = (spark.read.format(kafka_format(spark, cluster)).options(**cluster_options(cluster))
             .option("subscribe", consumed.topic)
             .option("startingOffsets", offsets_json(consumed.topic, consumed.start))
             .option("endingOffsets", offsets_json(consumed.topic, consumed.end))
             .load())
    return parser(frame)


def jdbc_options() -> dict[str, str]:
    database = settings.DATABASES["default"]
    url = f"jdbc:postgresql://{database.get('HOST') or '127.0.0.1'}:{database.get('PORT') or 5432}/{database['NAME']}"
    options = {"url": url, "driver": "org.postgresql.Driver", "user": database.get("USER") or "postgres",
               "fetchsize": str(JDBC_FETCH_SIZE)}
    if database.get("PASSWORD"):
        options["password"] = database["PASSWORD"]
    return options


def written_keys_query(table: str, key_column: str) -> str:
    """Keys and how often each was written. The GROUP BY runs in PostgreSQL, next to the data: one
    sequential scan, and Spark receives one row per key instead of one per row."""
    return _written_keys(table, key_column)[0]


def _written_keys(table: str, key_column: str) -> tuple[str, tuple[int, int] | None]:
    """The query, and the smallest and largest key when the key column holds integers (else None)."""
    conn = db.connect("tally-topic-check")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", [sql.Identifier(table).as_string(conn)])
            if cur.fetchone()[0] is None:
                raise TopicCheckError(f"Table {table!r} does not exist.")
            cur.execute(sql.SQL("SELECT min({}), max({}) FROM {}").format(
                sql.Identifier(key_column), sql.Identifier(key_column), sql.Identifier(table)))
            low, high = cur.fetchone()
        query = sql.SQL("SELECT {} AS key, count(*) AS written FROM {} WHERE {} IS NOT NULL GROUP BY {}").format(
            sql.Identifier(key_column), sql.Identifier(table), sql.Identifier(key_column),
            sql.Identifier(key_column)).as_string(conn)
        bounds = (low, high) if isinstance(low, int) and isinstance(high, int) else None
        return query, bounds
    except Exception as exc:
        if isinstance(exc, TopicCheckError):
            raise
        # The database's message is left out: errors never echo what a table holds.
        raise TopicCheckError(f"Cannot read column {key_column!r} of table {table!r} ({type(exc).__name__}).") from exc
    finally:
        conn.rollback()
        conn.close()


def extract_written(spark, table: str, key_column: str, partitions: int | None = None):
    """The table's keys with their write counts, read by the executors in key ranges.

    An integer key column is read as `partitions` JDBC partitions (by default one per executor core): each
    task asks PostgreSQL for `key` in its range, and PostgreSQL pushes that range into the GROUP BY, so the
    counting is split too and nothing passes through the driver. Spark's bounds only set the stride: the
    first and last ranges are open-ended, so no key is left out. Other key types are read in one task."""
    query, bounds = _written_keys(table, key_column)
    reader = spark.read.format("jdbc")
    for key, value in jdbc_options().items():
        reader = reader.option(key, value)
    if bounds is None:
        return reader.option("query", query).load()
    partitions = partitions or max(2, spark.sparkContext.defaultParallelism)
    low, high = bounds
    # `query` cannot be combined with partitionColumn: the same SELECT as a derived table can. The upper bound is
    # the highest key itself (the last range is open-ended): one past it overflows a long at bigint's largest.
    return (reader.option("dbtable", f"({query}) AS written_keys").option("partitionColumn", "key")
            .option("lowerBound", str(low)).option("upperBound", str(high))
            .option("numPartitions", str(min(partitions, high - low + 1))).load())


# --- transform -------------------------------------------------------------------------------------------
def compare(consumed, written):
    """consumed: DataFrame(key), one row per consumed record; written: DataFrame(key, written), one row per
    key of the table with its row count. Returns DataFrame(key, consumed, written, finding) for every key,
    finding one of "missing", "duplicated", "unexpected", "unparsable" (the records without a key, on one
    row with a null key), or null when the key is right."""
    from pyspark.sql import functions as F

    per_key = consumed.groupBy("key").agg(F.count(F.lit(1)).alias("consumed"))
    written = written.select(F.col("key").try_cast(per_key.schema["key"].dataType).alias("key"),
                             F.col("written").cast("long").alias("written"))
    joined = per_key.join(written, "key", "full_outer").select(
        "key", F.coalesce("consumed", F.lit(0)).alias("consumed"), F.coalesce("written", F.lit(0)).alias("written"))
    finding = (F.when(F.col("key").isNull(), "unparsable")
               .when((F.col("consumed") > 0) & (F.col("written") == 0), "missing")
               .when((F.col("consumed") == 0) & (F.col("written") > 0), "unexpected")
               .when(F.col("written") > F.greatest(F.col("consumed"), F.lit(1)), "duplicated"))
    return joined.withColumn("finding", finding)


# --- load ------------------------------------------------------------------------------------------------
def summarize(compared, sample_limit: int = SAMPLE_LIMIT) -> dict:
    """Counts and samples of a compare() result (persisted by the caller: it is read several times)."""
    from pyspark.sql import functions as F

    def count_of(finding):
        return F.sum(F.when(F.col("finding") == finding, 1).otherwise(0))

    totals = compared.agg(
        F.coalesce(F.sum("consumed"), F.lit(0)).alias("records_read"),
        F.coalesce(F.sum("written"), F.lit(0)).alias("rows_read"),
        F.sum(F.when((F.col("consumed") > 0) & F.col("key").isNotNull(), 1).otherwise(0)).alias(
            "distinct_keys_consumed"),
        F.sum(F.when(F.col("finding") == "unparsable", F.col("consumed")).otherwise(0)).alias("unparsable_count"),
        count_of("missing").alias("missing_count"), count_of("duplicated").alias("duplicated_count"),
        count_of("unexpected").alias("unexpected_count"),
        F.coalesce(F.sum(F.when(F.col("finding") == "duplicated", F.col("written") - F.greatest(
            F.col("consumed"), F.lit(1))).otherwise(0)), F.lit(0)).alias("extra_rows"),
    ).first().asDict()
    report = {name: int(value or 0) for name, value in totals.items()}

    def sample(finding):
        if not report[f"{finding}_count"]:
            return []
        return compared.where(F.col("finding") == finding).orderBy("key").limit(sample_limit).collect()

    report["missing"] = [_json_key(r["key"]) for r in sample("missing")]
    report["duplicated"] = {str(_json_key(r["key"])): int(r["written"]) for r in sample("duplicated")}
    report["unexpected"] = [_json_key(r["key"]) for r in sample("unexpected")]
    report["sample_limit"] = sample_limit
    return report


def _json_key(key):
    return key if isinstance(key, int | str) or key is None else str(key)


def check_topic(topic: str, group_id: str, table: str, key_column: str, value_parser_name: str = "int_value", *,
                pipeline: Pipeline | None = None, sample_limit: int = SAMPLE_LIMIT,
                progress: Callable[[float, str], None] | None = None, cluster=None) -> dict:
    """Run the topic check and return its report (a JSON-ready dict)."""
    from pyspark import StorageLevel

    from consumers.engine.spark_session import get_spark

    progress = progress or (lambda fraction, message: None)
    parser = parser_for(value_parser_name)
    started = time.monotonic()
    progress(0.05, "reading the group's committed offsets")
    consumed = consumed_range(topic, group_id, pipeline, cluster)
    progress(0.1, f"starting Spark to read {consumed.records} records")
    spark = get_spark()
    written = extract_written(spark, table, key_column)
    compared = compare(extract_consumed(spark, consumed, parser), written)
    # Read Kafka and the table once: the totals and each sample are separate Spark actions.
    compared = compared.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        progress(0.2, f"reading {consumed.records} records and the keys of {table}")
        report = summarize(compared, sample_limit)
    finally:
        compared.unpersist()
    report.update({
        "topic": topic, "group_id": group_id, "table": table, "key_column": key_column,
        "value_parser": value_parser_name, "offsets_source": consumed.source,
        "offsets": {"start": {str(p): o for p, o in consumed.start.items()},
                    "end": {str(p): o for p, o in consumed.end.items()}},
        "records_in_range": consumed.records, "seconds": round(time.monotonic() - started, 3),
    })
    progress(1.0, "done")
    return report


# --- jobs (the dashboard's Celery task and the CLI store their results here) ------------------------------
def create_job(pipeline: Pipeline, requested_by: str = "") -> TopicCheckJob:
    """Store a queued topic check job of `pipeline` (refused with TopicCheckError when it cannot be checked)."""
    spec = topic_check_spec(pipeline)
    try:
        # A cluster gone from the clusters file (or with wrong settings, a secret file removed) is refused now, naming
        # it: queued, the job would only fail in the worker, and waiting would not help.
        clusters.check_settings(pipeline.cluster or clusters.DEFAULT)
    except ClusterConfigError as exc:
        raise TopicCheckError(f"Cannot check the topic of pipeline {pipeline.name!r}: {exc}.") from None
    return TopicCheckJob.objects.create(pipeline=pipeline, topic=spec.topic, group_id=spec.group_id, table=spec.table,
                                        key_column=spec.key_column, value_parser=spec.value_parser,
                                        requested_by=requested_by)


def request_topic_check(pipeline: Pipeline, requested_by: str = "") -> TopicCheckJob:
    """Queue a topic check job: stored now, run by a Celery worker (threads or solo pool: it starts Spark).
    When the broker cannot take the task, the job is marked failed with the reason at once, instead of
    staying "queued" forever."""
    job = create_job(pipeline, requested_by)
    transaction.on_commit(lambda: enqueue_job(job.pk))
    return job


def enqueue_job(job_id: int) -> bool:
    try:
        current_app.signature(RUN_TOPIC_CHECK_TASK, args=(job_id,)).delay()
    except Exception as exc:  # kombu raises OperationalError and others when Redis is down
        log.error("Topic check job %s could not be queued: %s", job_id, exc)
        TopicCheckJob.objects.filter(pk=job_id, status=TopicCheckStatus.QUEUED).fail(
            timezone.now(),
            f"not queued: the task broker is unreachable ({type(exc).__name__}); request it again later")
        return False
    return True


def fail_lost_checks(now) -> int:
    """End as failed the queued checks no worker will take: older than `topic_check_patience` while their queue holds
    no task (a worker killed after it took the task but before it claimed the check; a broker that lost its data).
    A queue that holds tasks may hold theirs, behind busy workers: they wait on, as does every check while the broker
    cannot be asked. Failed, not queued again: a worker that dies at every check (out of memory in Spark, say) would
    be fed it for ever; the person who asked sees why and asks again."""
    if not TopicCheckJob.objects.lost(now).exists():
        return 0   # the broker is asked only when it matters
    if queued_tasks(current_app.conf.task_default_queue) != 0:
        return 0
    return TopicCheckJob.objects.lost(now).fail_lost(now)


def run_topic_check_job(job_id: int) -> TopicCheckJob:
    """Run a stored job, recording progress, and its result or error. Idempotent on a finished job."""
    claimed = TopicCheckJob.objects.filter(pk=job_id).claim(timezone.now())
    job = TopicCheckJob.objects.get(pk=job_id)
    if not claimed:
        return job  # already running or finished (a retried or duplicated task)

    def progress(fraction: float, message: str) -> None:
        # Only while it runs: a check the beat declared failed (a worker silent too long) keeps saying why.
        TopicCheckJob.objects.filter(pk=job_id, status=TopicCheckStatus.RUNNING).update(
            progress=fraction, progress_message=message[:PROGRESS_MESSAGE_LENGTH])

    with _heartbeat(job_id):
        _run_claimed(job, progress)
    job.refresh_from_db()
    return job


@contextmanager
def _heartbeat(job_id: int):
    """Heartbeats of a running check, from a thread: Spark's actions report no progress for minutes. A worker
    killed stops them, and TopicCheckJobQuerySet.fail_stale ends the check as failed."""
    stop = threading.Event()

    def beat():
        try:
            while not stop.wait(topic_check_lease().total_seconds() / 5):
                try:
                    TopicCheckJob.objects.filter(pk=job_id).heartbeat(timezone.now())
                except Exception:  # noqa: BLE001 - one failed write (a connection lost) must not end the beats
                    log.warning("Topic check job %s: a heartbeat failed; the next one tries again", job_id,
                                exc_info=True)
                    connection.close()   # a broken connection is opened afresh by the next beat
        finally:
            connection.close()  # the thread's own connection

    thread = threading.Thread(target=beat, name=f"tally-topic-check-{job_id}-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _run_claimed(job: TopicCheckJob, progress: Callable[[float, str], None]) -> None:
    job_id = job.pk
    try:
        if job.pipeline is None:
            raise TopicCheckError("The topic check's pipeline no longer exists.")
        spec = topic_check_spec(job.pipeline)  # from the pipeline as it is now, never from the stored job
        report = check_topic(spec.topic, spec.group_id, spec.table, spec.key_column, spec.value_parser,
                             pipeline=job.pipeline, progress=progress)
    except Exception as exc:
        log.exception("Topic check job %s failed", job_id)
        TopicCheckJob.objects.filter(pk=job_id).fail(timezone.now(), failure_message(exc))
    else:
        # Only while it runs: a check the beat declared failed meanwhile (its worker silent too long) stays failed
        # with its reason, as progress() leaves it.
        TopicCheckJob.objects.filter(pk=job_id, status=TopicCheckStatus.RUNNING).update(
            status=TopicCheckStatus.DONE, result=report, progress=1.0, progress_message="done",
            finished_at=timezone.now())



def failure_message(exc: Exception) -> str:
    """What a failed topic check shows. TopicCheckError messages are ours (they name pipelines, tables and columns);
    anything else (Spark, JDBC, Kafka) may quote the values it choked on, so only its kind is shown and
    the details stay in the worker's log."""
    if isinstance(exc, TopicCheckError):
        return str(exc)
    return f"{type(exc).__name__}: the topic check failed; the details are in the worker's log."
