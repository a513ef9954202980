"""Executor-side commits: each Kafka partition's slice of a micro-batch is transformed and committed by the
Spark task that read it. The driver plans offset ranges and gathers one small outcome row per slice; no
record passes through it, so adding executors adds throughput.

Steps of one task (`commit_slices`, run by `mapInArrow` over the micro-batch, one task per Kafka partition
range as the source plans them), for each Kafka partition in the task's rows:
  1. Rebuild SourceRecords from the Arrow batches the source produced (in offset order).
  2. At-most-once only: commit the slice's end to Kafka first (the classic mode's position).
  3. `consumers.engine.commit.commit_batch` for this partition alone: ONE PostgreSQL transaction with the epoch
     check, replay skip / gap refusal, rows, dead letters, ledger row and `next_offset`.
  4. Return an outcome row (or the refusal: fenced, bad record, gap, sink error) for the driver to gather.
Faults `mid-write` and `after-write` fire inside that transaction, so they kill the executor's Python
worker mid-commit (and `after-kafka-commit` between an at-most-once slice's two commits); `after-poll` and
`after-db-commit` stay on the driver (consumers/engine/spark.py). They fire on a
task's first attempt only: Spark fails the whole micro-batch after TASK_ATTEMPTS failed attempts of one
task, and what a fault is there to show is that the retry lands the slice exactly once.

With `--crash-in-worker` (the demo) every fault point is the executor's, and a seeded `POINT@N` schedule
numbers batch attempts over the run, task retries included: the driver gives each micro-batch the crash
point of each attempt of its first task (Spark partition 0, `crash_points`); attempt k of that task dies
(SIGKILL) at point k, Spark retries it in a new Python worker, the driver stays up and logs WORKER_DIED
once per death, which the demo counts. The JVM, SparkSession and query stay warm: a crash costs a Python
worker start, not a driver start.

Why retries and speculative copies are harmless: a second attempt of a committed slice finds `next_offset`
at or past its records (they are skipped; the offset row is locked FOR UPDATE, so two attempts run one
after the other); an attempt of an older epoch is fenced; a slice that would leave a gap is refused.

This module runs on executors, where Django is not set up: it imports only the Django-free commit
protocol, psycopg2, pyarrow and kafka-python, and everything a task needs travels in `SliceJob`.
"""
import os
import time
from dataclasses import dataclass, field, fields

import psycopg2

from consumers.engine import commit, json_map
from consumers.engine.faults import NO_FAULTS, FaultInjector
from consumers.engine.transforms import SourceRecord, resolve

# The outcome rows the driver collects: a few numbers per Kafka partition and micro-batch (`task` is the
# Spark partition that committed it, `attempt` that task's attempt number: the earlier ones died).
OUTCOME_SCHEMA = ("partition int, first_offset long, end_offset long, records long, rows_written long, "
                  "dead_letters long, skipped long, task int, attempt int, refusal string, detail string")
OUTCOME_FIELDS = [part.split()[0] for part in OUTCOME_SCHEMA.split(", ")]
APPLICATION_NAME = "tally-spark-task"
# What the driver logs once per Python worker that died committing; the demo counts these lines.
WORKER_DIED = "tally-fault: a Python worker died committing"
# The task of a micro-batch that carries out its scheduled crashes.
SCHEDULED_TASK = 0
# The `task` of an outcome committed by the driver (a fetch that crossed only a hole: no record, no task).
DRIVER_TASK = -1


@dataclass(frozen=True)
class SliceJob:
    """Everything an executor task needs, as plain picklable values (no Django, no connections)."""

    dsn: dict                 # psycopg2.connect keyword arguments
    pipeline_id: int
    topic: str
    sink_table: str
    transform: str            # a registered transform name or a dotted path, resolved on the executor
    exactly_once: bool
    stop_on_bad_record: bool
    epoch: int
    at_most_once: bool = False
    group_id: str = ""
    bootstrap: str = ""
    cluster: str = ""         # the cluster's spec as JSON, secrets as references (consumers/kafka/clusters.py)
    known_partitions: frozenset = frozenset()   # partitions with a stored position when the run started
    delay_per_record_s: float = 0.0             # simulated work per record, as the Python engine's delay_ms
    faults: dict = field(default_factory=dict)  # executor fault points: {point: probability}
    # Per micro-batch, from the driver's offset log: {partition: (start or None, end)}, the consumer's
    # positions before and after the batch (docs/architecture.md: positions, not offset arithmetic).
    fetches: dict = field(default_factory=dict)
    # --crash-in-worker: the crash point of each attempt of this micro-batch's first task (see crash_points)
    crash_points: tuple = ()
    # `transform = "json"`: the mapping as the driver planned it from the sink table's catalog (plain values),
    # compiled on the executor; and an upsert pipeline's key (consumers/engine/upsert.py).
    json_plan: json_map.JsonPlan | None = None
    upsert_key: tuple = ()
    delete_on_tombstone: bool = False

    def target(self) -> commit.Target:
        transform = (json_map.compiled(self.json_plan, self.upsert_key) if self.json_plan is not None
                     else resolve(self.transform))
        return commit.Target(pipeline_id=self.pipeline_id, topic=self.topic, sink_table=self.sink_table,
                             transform=transform, exactly_once=self.exactly_once,
                             stop_on_bad_record=self.stop_on_bad_record, upsert_key=self.upsert_key,
                             delete_on_tombstone=self.delete_on_tombstone)


# The fault points between a slice's Kafka commit (at-most-once) and its database commit: the executor's.
EXECUTOR_FAULTS = ("after-kafka-commit", "mid-write", "after-write")


def executor_faults(faults: FaultInjector) -> dict:
    """The probabilistic faults the executors carry out: all of them with --crash-in-worker."""
    return {p: prob for p, prob in faults.points.items() if faults.in_worker or p in EXECUTOR_FAULTS}


def crash_points(faults: FaultInjector, next_attempt: int, attempts: int) -> list[str]:
    """The scheduled crash point of each attempt of a micro-batch's first task, whose first attempt is batch
    attempt `next_attempt` (1-based, counted over the run): consecutive scheduled attempts die until one is
    not scheduled, which commits. At most `attempts - 1` die (Spark's task attempts), so the batch commits. A point
    scheduled with `/stop` (`mid-write@1/stop`) stops the worker there instead (SIGSTOP: a hung process)."""
    points = []
    while len(points) < attempts - 1 and (point := faults.point_at(next_attempt + len(points))) is not None:
        points.append(point + ("/stop" if (point, next_attempt + len(points)) in faults.stop_at else ""))
    return points


def task_faults(job: SliceJob, task: int, attempt: int) -> FaultInjector:
    """The faults of one task attempt: its scheduled crash, or the probabilistic ones on a first attempt."""
    if job.crash_points:
        if task == SCHEDULED_TASK and attempt < len(job.crash_points):
            point, _, stop = job.crash_points[attempt].partition("/")
            return FaultInjector.parse(f"{point}@1" + (f"/{stop}" if stop else ""))
        return NO_FAULTS
    return FaultInjector(job.faults) if job.faults and attempt == 0 else NO_FAULTS


def to_source_records(table) -> dict[int, list[SourceRecord]]:
    """Arrow rows (partition, offset, key, value, timestamp_ms) -> SourceRecords per partition in offset order,
    as the commit protocol wants them."""
    columns = [table.column(name).to_pylist() for name in ("partition", "offset", "key", "value", "timestamp_ms")]
    batches: dict[int, list[SourceRecord]] = {}
    for partition, offset, key, value, ts in zip(*columns, strict=True):
        batches.setdefault(partition, []).append(SourceRecord(partition, offset, key, value, ts))
    for records in batches.values():
        if any(a.offset >= b.offset for a, b in zip(records, records[1:], strict=False)):
            records.sort(key=lambda r: r.offset)
    return batches


def commit_slices(job: SliceJob):
    """The function for `DataFrame.mapInArrow`: Arrow batches of one task in, outcome batches out."""

    def run(batches):
        import pyarrow as pa

        table = pa.Table.from_batches(list(batches))
        if table.num_rows == 0:
            return
        outcomes = commit_task(job, to_source_records(table), *_task_and_attempt())
        yield pa.RecordBatch.from_pylist(outcomes, schema=_outcome_arrow_schema())

    return run


def commit_task(job: SliceJob, slices: dict[int, list[SourceRecord]], task: int = 0, attempt: int = 0) -> list[dict]:
    """Commit each partition's slice in its own transaction; return one outcome dict per partition."""
    target = job.target()
    faults = task_faults(job, task, attempt)
    # Driver points reach a task only with --crash-in-worker (executor_faults and crash_points leave them out).
    faults.maybe_crash("after-poll")
    conn = psycopg2.connect(**job.dsn, application_name=f"{APPLICATION_NAME}-{os.getpid()}")
    conn.autocommit = False
    try:
        outcomes = [_commit_one(conn, job, target, faults, p, slices[p], task, attempt) for p in sorted(slices)]
    finally:
        conn.close()
    if not any(o["refusal"] for o in outcomes):
        faults.maybe_crash("after-db-commit")
    return outcomes


def slice_fetch(job: SliceJob, partition: int, records: list[SourceRecord]) -> commit.Fetch:
    """Where this slice was fetched from and to: the driver's offset-log positions, the records' own
    offsets where the driver has none (a partition added during the run starts at its first record)."""
    start, end = job.fetches.get(partition, (None, None))
    start = records[0].offset if start is None else start
    end = max(end if end is not None else 0, records[-1].offset + 1)
    return commit.Fetch(start, end)


def _commit_one(conn, job: SliceJob, target, faults, partition: int, records: list[SourceRecord], task: int,
                attempt: int):
    fetch = slice_fetch(job, partition, records)
    ran = {"task": task, "attempt": attempt}
    base = {**outcome_row(commit.PartitionOutcome(partition, fetch.start, fetch.end, 0, 0, 0, len(records))), **ran}
    if job.exactly_once and partition not in job.known_partitions:
        # A partition added to the topic during the run: the source reads it from its log start, so that is
        # where its stored position begins (a no-op when the row exists).
        commit.ensure_positions(conn, job.pipeline_id, {partition: fetch.start})
    if job.at_most_once:
        commit_kafka_offsets(job, {partition: fetch.end})
        faults.maybe_crash("after-kafka-commit")
    if job.delay_per_record_s:
        time.sleep(job.delay_per_record_s * len(records))
    try:
        outcomes = commit.commit_batch(conn, target, job.epoch, {partition: records}, faults, {partition: fetch})
    except commit.CommitRefused as exc:
        return {**refusal_outcome(partition, exc), **ran}
    # No outcome: every record was a replay of what is already committed (the position stays).
    return {**outcome_row(outcomes[0]), **ran} if outcomes else base


def outcome_row(outcome: commit.PartitionOutcome) -> dict:
    """A commit outcome as the driver's outcome row."""
    return {"partition": outcome.partition, "first_offset": outcome.first_offset,
            "end_offset": outcome.end_offset, "records": outcome.records, "rows_written": outcome.rows_written,
            "dead_letters": outcome.dead_letters, "skipped": outcome.skipped,
            "task": DRIVER_TASK, "attempt": 0, "refusal": None, "detail": None}


def partition_outcome(row: dict) -> commit.PartitionOutcome:
    """A committed outcome row back as the commit protocol's outcome, for the run's counts."""
    return commit.PartitionOutcome(**{f.name: row[f.name] for f in fields(commit.PartitionOutcome)})


def refusal_outcome(partition: int, exc: commit.CommitRefused) -> dict:
    return {"partition": partition, "first_offset": 0, "end_offset": 0, "records": 0, "rows_written": 0,
            "dead_letters": 0, "skipped": 0, "task": DRIVER_TASK, "attempt": 0,
            "refusal": exc.reason, "detail": str(exc)}


def commit_kafka_offsets(job: SliceJob, ends: dict[int, int]) -> None:
    """At-most-once: Kafka's committed offset is the position, written before the rows (the classic mode)."""
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    from consumers.engine.spark_source import cluster_of
    from consumers.kafka import clusters

    consumer = clusters.consumer(cluster_of(job.cluster, job.bootstrap), group_id=job.group_id,
                                 enable_auto_commit=False, client_id="tally-spark-task",
                                 allow_auto_create_topics=False)
    try:
        consumer.commit({TopicPartition(job.topic, p): OffsetAndMetadata(o, "", -1) for p, o in ends.items()})
    finally:
        consumer.close()


def _task_and_attempt() -> tuple[int, int]:
    from pyspark import TaskContext

    context = TaskContext.get()
    return (context.partitionId(), context.attemptNumber()) if context is not None else (0, 0)


def _outcome_arrow_schema():
    import pyarrow as pa

    types = {"int": pa.int32(), "long": pa.int64(), "string": pa.string()}
    return pa.schema([(name, types[kind]) for name, kind in
                      (part.split() for part in OUTCOME_SCHEMA.split(", "))])


def dsn_from_settings(database: dict, idle_in_transaction_seconds: int | None = None) -> dict:
    """psycopg2 keyword arguments for the executors, from Django's DATABASES["default"]. With
    `idle_in_transaction_seconds`, PostgreSQL ends a slice's transaction that waits that long for its executor (a
    frozen one holds the pipeline row FOR SHARE: a stop, restart or rewind would wait on it for ever), as it ends
    the Python engine's (consumers/engine/db.py)."""
    params = {"dbname": database["NAME"], "user": database.get("USER") or None,
              "password": database.get("PASSWORD") or None, "host": database.get("HOST") or None,
              "port": database.get("PORT") or None}
    if idle_in_transaction_seconds:
        params["options"] = f"-c idle_in_transaction_session_timeout={idle_in_transaction_seconds * 1000}"
    return {k: v for k, v in params.items() if v is not None}
