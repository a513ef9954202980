"""`tally_kafka`: a Kafka source for Spark written with PySpark's Python Data Source API.

Spark's own `kafka` format needs the spark-sql-kafka connector jar, which is often not downloadable
(firewalls, no Maven access). This source reads the same rows with kafka-python, batch and streaming:

    spark.read.format("tally_kafka").options(**cluster_options(cluster)).option("subscribe", "nums")
         .option("startingOffsets", '{"nums": {"0": 0}}').option("endingOffsets", "latest").load()

The cluster travels as option `tally.cluster`: its settings with secrets as references (an environment
variable's name, a file's path; consumers/kafka/clusters.py `Cluster.spec`), which the Python workers read
where they run, so no secret is in a query plan, a log or the Spark UI. Without it, a plain
`kafka.bootstrap.servers` is a PLAINTEXT cluster.

Schema, as the `kafka` format: key, value (binary), topic, partition, offset, timestamp, timestampType.
Offsets use Spark's JSON shape `{"topic": {"0": n}}`; -2 means earliest, -1 latest (as in Spark).
One Spark input partition per topic-partition offset range `[start, end)`.

Pitfalls this module handles: option keys arrive lower-cased; readers are pickled to Spark's Python
workers, so `__init__` keeps only plain values (connections are opened in `read`); end offsets come from
the fetch high watermark (consumers.kafka.admin.watermarks), never from ListOffsets; `poll` is asked for
`max_records=remaining`, or kafka-python decodes a whole fetch for a few records.
"""
import json
import time
from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

FORMAT = "tally_kafka"
# A StructType, not DDL text: parsing DDL needs a live SparkContext, which Spark's Python workers lack.
SCHEMA = StructType([
    StructField("key", BinaryType()), StructField("value", BinaryType()), StructField("topic", StringType()),
    StructField("partition", IntegerType()), StructField("offset", LongType()),
    StructField("timestamp", TimestampType()), StructField("timestampType", IntegerType()),
])
EARLIEST, LATEST = -2, -1
# One fetch per poll is at most this many records: big enough to amortise a round trip, small enough that
# an Arrow batch stays a few MB.
MAX_POLL_RECORDS = 20_000
# A range whose records do not arrive within this many seconds without progress fails the task (and Spark
# retries it) instead of hanging the query.
READ_STALL_TIMEOUT_S = 60.0


class KafkaSourceError(RuntimeError):
    pass


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """Offsets `[start, end)` of one topic-partition: one Spark input partition."""

    topic: str
    partition: int
    start: int
    end: int
    bootstrap: str
    cluster: str = ""   # the cluster's spec as JSON (no secret values), see the module docstring


def offsets_json(topic: str, offsets: dict[int, int]) -> str:
    """{0: 5} -> '{"topic": {"0": 5}}' (Spark's Kafka offset shape)."""
    return json.dumps({topic: {str(p): int(o) for p, o in sorted(offsets.items())}})


def parse_offsets(spec, topic: str) -> dict[int, int] | str:
    """An offsets option: "earliest", "latest", or Spark's JSON shape (a str or an already parsed dict)."""
    if isinstance(spec, str) and spec.strip().lower() in ("earliest", "latest"):
        return spec.strip().lower()
    parsed = json.loads(spec) if isinstance(spec, str) else spec
    if set(parsed) - {topic}:
        raise KafkaSourceError(f"Offsets name topics {sorted(set(parsed) - {topic})}; this source reads {topic!r}")
    return {int(p): int(o) for p, o in parsed.get(topic, {}).items()}


class _Options:
    """Plain values read from the options (keys arrive lower-cased; look them up that way)."""

    def __init__(self, options):
        lowered = {str(k).lower(): v for k, v in dict(options).items()}
        self.bootstrap = lowered.get("kafka.bootstrap.servers")
        self.topic = lowered.get("subscribe")
        if not self.bootstrap or not self.topic:
            raise KafkaSourceError("Options kafka.bootstrap.servers and subscribe are required.")
        if "," in self.topic:
            raise KafkaSourceError("Subscribe to one topic per query.")
        self.starting = lowered.get("startingoffsets", "earliest")
        self.ending = lowered.get("endingoffsets", "latest")
        self.max_per_trigger = int(lowered["maxoffsetspertrigger"]) if lowered.get("maxoffsetspertrigger") else None
        self.timeout_ms = int(lowered.get("kafka.request.timeout.ms", 30000))
        self.cluster_spec = lowered.get("tally.cluster", "")

    def cluster(self):
        return cluster_of(self.cluster_spec, self.bootstrap)


def cluster_options(cluster) -> dict[str, str]:
    """The options that tell this source (and Spark's own `kafka` format, for a PLAINTEXT cluster) which
    cluster to read: no secret values, only where the secrets are. Spark's own format reads uncommitted records
    by default (an aborted transaction's among them); this source always reads committed ones, as every Spark
    reader of Tally must."""
    return {"kafka.bootstrap.servers": cluster.bootstrap_servers, "tally.cluster": json.dumps(cluster.spec()),
            "kafka.isolation.level": "read_committed"}


def cluster_of(spec: str, bootstrap: str):
    from consumers.kafka.clusters import DEFAULT, Cluster

    return Cluster.from_spec(json.loads(spec)) if spec else Cluster(DEFAULT, bootstrap)


def _watermarks(options: _Options):
    """Spark's Python workers are separate processes without Django set up: configure just what the admin
    calls read (the request timeout); the cluster comes from the options."""
    from django.conf import settings

    if not settings.configured:
        settings.configure(KAFKA_REQUEST_TIMEOUT_MS=options.timeout_ms)
    from consumers.kafka import admin as kafka_admin

    return kafka_admin.watermarks(options.topic, cluster=options.cluster())


def resolve_offsets(spec, options: _Options, marks=None, default_to_start=True) -> dict[int, int]:
    """Turn an offsets option into {partition: offset} for every partition of the topic: "earliest" is the
    log start, "latest" the high watermark, -2/-1 in JSON the same; partitions the JSON leaves out start at
    the log start (default_to_start) or end at the high watermark."""
    marks = marks if marks is not None else _watermarks(options)
    parsed = parse_offsets(spec, options.topic)
    resolved = {}
    for p, mark in marks.items():
        if parsed == "earliest":
            wanted = EARLIEST
        elif parsed == "latest":
            wanted = LATEST
        else:
            wanted = parsed.get(p, EARLIEST if default_to_start else LATEST)
        if wanted == EARLIEST:
            resolved[p] = mark.log_start
        elif wanted == LATEST:
            resolved[p] = mark.end  # the last stable offset: read_committed stops there
        else:
            resolved[p] = wanted
    return resolved


def plan_ranges(options: _Options, start: dict[int, int], end: dict[int, int]) -> list[KafkaRange]:
    """One input partition per topic-partition with records to read; empty ranges are left out."""
    return [KafkaRange(options.topic, p, start.get(p, 0), end[p], options.bootstrap, options.cluster_spec)
            for p in sorted(end) if end[p] > start.get(p, 0)]


def _arrow_schema():
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(SCHEMA, timezone="UTC")


def read_range(part: KafkaRange):
    """Yield the records of `[start, end)` as Arrow record batches (no per-record Python→JVM conversion).

    Offsets can have holes (transaction markers, compaction): the range ends when the consumer's position
    reaches `end`, not after `end - start` records.
    """
    if part.end <= part.start:
        return
    import pyarrow as pa
    from kafka import TopicPartition

    from consumers.kafka import clusters

    schema = _arrow_schema()
    # read_committed: aborted records never reach a sink. auto_offset_reset "none": a range whose start
    # fell below the log start (retention) fails loudly instead of jumping to the end of the log.
    consumer = clusters.consumer(cluster_of(part.cluster, part.bootstrap), group_id=None, enable_auto_commit=False,
                                 isolation_level="read_committed", auto_offset_reset="none",
                                 client_id="tally-spark-source", request_timeout_ms=30000,
                                 max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20,
                                 allow_auto_create_topics=False)
    try:
        tp = TopicPartition(part.topic, part.partition)
        consumer.assign([tp])
        consumer.seek(tp, part.start)
        position = part.start
        last_progress = time.monotonic()
        while position < part.end:
            remaining = part.end - position
            polled = consumer.poll(timeout_ms=500, max_records=min(remaining, MAX_POLL_RECORDS)).get(tp, [])
            records = [r for r in polled if r.offset < part.end]
            if records:
                yield pa.RecordBatch.from_arrays([
                    pa.array([r.key for r in records], pa.binary()),
                    pa.array([r.value for r in records], pa.binary()),
                    pa.array([part.topic] * len(records), pa.string()),
                    pa.array([part.partition] * len(records), pa.int32()),
                    pa.array([r.offset for r in records], pa.int64()),
                    pa.array([r.timestamp * 1000 for r in records], pa.int64()).cast(schema.field(5).type),
                    pa.array([r.timestamp_type for r in records], pa.int32()),
                ], schema=schema)
            new_position = consumer.position(tp)
            if new_position > position:
                position, last_progress = new_position, time.monotonic()
            elif time.monotonic() - last_progress > READ_STALL_TIMEOUT_S:
                raise KafkaSourceError(f"{part.topic}[{part.partition}]: no record at offset {position} within "
                                       f"{READ_STALL_TIMEOUT_S:.0f} s (range ends at {part.end})")
    finally:
        consumer.close()


class KafkaBatchReader(DataSourceReader):
    def __init__(self, options: _Options):
        self.options = options

    def partitions(self):
        marks = _watermarks(self.options)
        start = resolve_offsets(self.options.starting, self.options, marks, default_to_start=True)
        end = resolve_offsets(self.options.ending, self.options, marks, default_to_start=False)
        ranges = plan_ranges(self.options, start, end)
        # Spark needs at least one partition; an empty range yields nothing.
        return ranges or [KafkaRange(self.options.topic, 0, 0, 0, self.options.bootstrap, self.options.cluster_spec)]

    def read(self, partition: KafkaRange):
        return read_range(partition)


class KafkaStreamReader(DataSourceStreamReader):
    """Micro-batches of offset ranges. Spark keeps its own offset log, but Tally starts every query with
    `startingOffsets` from PostgreSQL and a fresh checkpoint, so the database stays the source of truth."""

    def __init__(self, options: _Options):
        self.options = options

    def initialOffset(self) -> dict:
        start = resolve_offsets(self.options.starting, self.options, default_to_start=True)
        return {self.options.topic: {str(p): o for p, o in start.items()}}

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        if self.options.max_per_trigger:
            return ReadMaxRows(self.options.max_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit) -> dict:
        marks = _watermarks(self.options)
        begin = {int(p): o for p, o in start.get(self.options.topic, {}).items()}
        # Partitions added to the topic since the query started begin at their log start.
        begin.update({p: m.log_start for p, m in marks.items() if p not in begin})
        end = {p: max(begin[p], marks[p].end) if p in marks else begin[p] for p in begin}
        max_rows = getattr(limit, "max_rows", None)
        if max_rows:
            end = cap_ranges(begin, end, max_rows)
        return {self.options.topic: {str(p): o for p, o in sorted(end.items())}}

    def partitions(self, start: dict, end: dict):
        begin = {int(p): o for p, o in start.get(self.options.topic, {}).items()}
        finish = {int(p): o for p, o in end.get(self.options.topic, {}).items()}
        return plan_ranges(self.options, begin, finish)

    def read(self, partition: KafkaRange):
        return read_range(partition)

    def commit(self, end: dict) -> None:
        # Offsets become durable in PostgreSQL inside foreachBatch (consumers.engine.commit), not here.
        pass


def cap_ranges(begin: dict[int, int], end: dict[int, int], max_rows: int) -> dict[int, int]:
    """Limit a micro-batch to `max_rows` records, shared fairly: each partition with a backlog gets an equal
    share; what small partitions leave over goes to the others."""
    backlog = {p: end[p] - begin[p] for p in end if end[p] > begin[p]}
    granted = {p: 0 for p in backlog}
    budget = max_rows
    while budget > 0 and backlog:
        share = max(1, budget // len(backlog))
        for p in sorted(backlog):
            take = min(share, backlog[p] - granted[p], budget)
            granted[p] += take
            budget -= take
        backlog = {p: n for p, n in backlog.items() if granted[p] < n}
    return {p: begin[p] + granted.get(p, 0) for p in end}


class TallyKafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        return KafkaBatchReader(_Options(self.options))

    def streamReader(self, schema):
        return KafkaStreamReader(_Options(self.options))


def register(spark) -> None:
    spark.dataSource.register(TallyKafkaDataSource)


def builtin_kafka_available(spark) -> bool:
    """True when Spark's own `kafka` format (the spark-sql-kafka connector) is on the classpath."""
    try:
        spark._jvm.java.lang.Class.forName("org.apache.spark.sql.kafka010.KafkaSourceProvider")
        return True
    except Exception:  # Py4J wraps ClassNotFoundException; Spark Connect has no _jvm
        return False


def kafka_format(spark, cluster=None) -> str:
    """Spark's own `kafka` format when its connector is there and the cluster needs no TLS or SASL (their
    settings would be `kafka.*` options, secrets included, visible in the plan); else this source."""
    plain = cluster is None or cluster.security_protocol == "PLAINTEXT"
    return "kafka" if plain and builtin_kafka_available(spark) else FORMAT
