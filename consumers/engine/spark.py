"""The Spark engine: a Structured Streaming query per pipeline run, committing through consumers.engine.commit.

    Kafka ──(tally_kafka, or Spark's `kafka` format when its connector is on the classpath)──> micro-batch
      └─ foreachBatch (driver): plans nothing itself; runs mapInArrow over the micro-batch, so each task
           commits the Kafka partition slices it read (consumers/engine/spark_commit.py):
           commit.commit_batch per partition: ONE PostgreSQL transaction for rows, dead letters, ledger,
           next_offset, epoch-fenced, replays skipped (the pipeline's record-level transform runs there)
         driver gathers one outcome row per slice -> counts, positions, Kafka offsets (advisory, after the
           DB commits; at-most-once tasks commit Kafka before writing)

Positions, not offset arithmetic (docs/architecture.md): a micro-batch's end offset per partition -- what
the source planned to read up to, the high watermark it saw -- is the consumer's position after the batch,
read from the query's offset log (Spark writes it before running the batch). So a batch that ends on a
transaction marker stores the position past it, and a batch that crossed only markers (an empty frame)
still moves the stored position.

With `--crash-in-worker` (the demo) the seeded `POINT@N` crashes kill the committing task's Python worker,
not the driver: Spark retries the task, and the driver logs spark_commit.WORKER_DIED per death.

The query starts from PostgreSQL's positions (`startingOffsets`) with a scratch checkpoint that is thrown
away when the run ends, so the database alone says where a pipeline stands: a restart, a rewind or a
switch between the Python and the Spark engine all resume from `PartitionOffset.next_offset`.

Same entry point, result and run life cycle as the Python engine: the ConsumerRun row, heartbeat and fencing,
counts, outcome and Kafka's copy of the positions are consumers/engine/lifecycle.py. The driver joins no
consumer group, so Kafka's copy is committed by a group-less consumer there.
"""
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import threading
import time

from django.conf import settings

from consumers.engine import caught_up, commit, db, json_map, log_bounds, sinks, spark_commit
from consumers.engine.faults import NO_FAULTS
from consumers.engine.lifecycle import (
    KafkaPositions,
    Run,
    RunEnded,
    RunResult,
    cluster_unusable,
    target_of,
)
from consumers.engine.options import RunOptions, run_engine, why_stopped, with_keywords
from consumers.engine.spark_session import TASK_ATTEMPTS, get_spark
from consumers.engine.spark_source import cluster_options, kafka_format, offsets_json
from consumers.engine.transforms import JSON
from consumers.kafka import admin as kafka_admin
from consumers.kafka import clusters
from consumers.kafka.errors import KafkaUnreachable
from consumers.models import DeliveryMode, Engine, Pipeline, RunState

log = logging.getLogger("tally.spark.engine")

# Each micro-batch has a fixed cost of about 0.6 s here (planning, a latest-offsets fetch, task launch and a
# Kafka connection per partition, the foreachBatch callback), so a trigger must carry many records to be
# worth it (bench/bench_spark.py: 8k records/s at 5,000 per trigger, 62k at 100,000). The pipeline's
# batch_size (sized for the Python engine's polls) is raised to at least this unless the caller asks for a
# size. Records stay on the executors: a task holds its slice (records / partitions) in memory.
MIN_RECORDS_PER_TRIGGER = 100_000
# With no new data Spark would ask the source for the latest offsets every 10 ms; each ask is a fetch.
TRIGGER_INTERVAL = "250 milliseconds"


def run(name: str, options: RunOptions) -> RunResult:
    """PipelineEngine, on Spark. `options.on_worker_death()` is called once per Python worker that died committing
    (see --crash-in-worker); `options.peers` does not apply (Spark spreads the partitions itself)."""
    return run_engine(SparkRun, Engine.SPARK, name, options)


run_pipeline = with_keywords(run)


class SparkRun:
    def __init__(self, pipeline: Pipeline, options: RunOptions):
        self.pipeline = pipeline
        self.stop = options.stop
        self.records_per_trigger = options.batch_size or max(pipeline.batch_size, MIN_RECORDS_PER_TRIGGER)
        self.delay_per_record_s = options.delay_ms / 1000  # as the Python engine: simulated work per record
        self.options = options   # its limits, faults, task and worker-death callback, read where they apply
        self.epoch = pipeline.epoch
        self.target = target_of(pipeline)
        # The executors compile the mapping from this plan, read here once from the sink table's catalog.
        self.json_plan = json_map.plan_for_pipeline(pipeline) if pipeline.transform == JSON else None
        self.mode = pipeline.delivery_mode
        self.positions: dict[int, int] = {}
        self.ending: RunEnded | None = None   # set by the batch callback: fenced / bad_record / error
        self._lock = threading.Lock()
        # Held while a micro-batch commits: shutdown waits for the batch in flight before closing the
        # connection (query.stop() does not wait for a Python foreachBatch callback to return).
        self._batch_lock = threading.Lock()
        self.batch_since: float | None = None   # when the micro-batch in flight began (monotonic), if one is
        self._closing = False
        self.kafka = KafkaPositions(pipeline, client_id=f"tally-spark-{pipeline.name}")
        self._job = None           # the executors' SliceJob, built at the first micro-batch
        self.retried_slices = 0    # outcomes from a task's second or later attempt (an earlier one died)
        self.checkpoint = ""
        self.next_attempt = 1      # --crash-in-worker: batch attempts so far + 1 (spark_commit.crash_points)

    # --- lifecycle -------------------------------------------------------------------------------------
    def _driver_connection(self):
        """The driver's own connection (positions, moves without records). A driver frozen inside one of its
        transactions would hold the partition rows, and a stop or a rewind would wait on them for ever: as on the
        Python engine's connections (db.ConnectionPool), PostgreSQL ends such a session after a while."""
        return db.connect(f"tally-spark-{self.pipeline.name}", settings.TALLY_ENGINE_IDLE_TRANSACTION_SECONDS)

    def run(self) -> RunResult:
        self.lifecycle = Run(self.pipeline, Engine.SPARK, task_id=self.options.task_id, state=RunState.STARTING)
        self.conn = self._driver_connection()
        checkpoint = self.checkpoint = tempfile.mkdtemp(prefix=f"tally-spark-{self.pipeline.name}-")
        query = None
        reason, detail = "error", ""
        try:
            self.positions = self._starting_positions()
            self.lifecycle.heartbeat(self.positions, force=True)
            query = self._start_query(checkpoint)
            reason, detail = self._supervise(query)
        except RunEnded as ended:
            reason, detail = ended.reason, ended.detail
        except KafkaUnreachable as exc:
            reason, detail = cluster_unusable(self.pipeline, exc)
        except Exception as exc:
            log.exception("Spark run of %s failed", self.pipeline.name)
            reason, detail = "error", f"{type(exc).__name__}: {exc}"
        finally:
            self._closing = True
            if query is not None:
                failure = self._stop_query(query)
                if failure and not detail:
                    reason, detail = "error", failure
            with self._batch_lock:
                self.conn.close()
                self.kafka.close()
            shutil.rmtree(checkpoint, ignore_errors=True)
        if reason == "stopped":   # why: a worker shutting down, or gone (the Python engine's end reasons)
            detail = why_stopped(self.stop, detail)
        return self.lifecycle.finish(reason, detail)

    def _starting_positions(self) -> dict[int, int]:
        """Exactly-once: PostgreSQL's next_offset (rows created at the reset policy's end if missing).
        The classic modes resume from Kafka's committed offsets, as the classic consumers do."""
        topic = self.pipeline.topic
        marks = kafka_admin.watermarks(topic, cluster=self.pipeline.cluster)
        if self.pipeline.transform != JSON:  # a JSON mapping writes into the user's own table, as it is
            with self.conn.cursor() as cur:
                sinks.ensure_sink_table(cur, self.pipeline.sink_table, self.target.transform, self.target.exactly_once)
            self.conn.commit()
        fallback = {p: self.pipeline.initial_position(m) for p, m in marks.items()}
        if self.target.exactly_once:
            positions = commit.ensure_positions(self.conn, self.pipeline.pk, fallback)
            for skip in log_bounds.check(self.conn, self.pipeline, self.target, self.epoch, positions, marks):
                log.warning("%s: %s (the pipeline's policy is to skip)", self.pipeline.name, skip.note)
            return positions
        committed = kafka_admin.committed_offsets(self.pipeline.group_id, topic, sorted(marks),
                                                cluster=self.pipeline.cluster)
        return {p: committed[p] if committed.get(p) is not None else fallback[p] for p in marks}

    def _start_query(self, checkpoint: str):
        from pyspark.sql import functions as F

        spark = get_spark()
        cluster = clusters.get(self.pipeline.cluster)
        fmt = kafka_format(spark, cluster)
        stream = (spark.readStream.format(fmt).options(**cluster_options(cluster))
                  .option("subscribe", self.pipeline.topic)
                  .option("startingOffsets", offsets_json(self.pipeline.topic, self.positions))
                  .option("maxOffsetsPerTrigger", str(self.records_per_trigger)))
        if fmt == "kafka":
            stream = stream.option("failOnDataLoss", "true")
        frame = stream.load().select("partition", "offset", "key", "value",
                                     F.unix_millis("timestamp").alias("timestamp_ms"))
        query = (frame.writeStream.queryName(f"tally-{self.pipeline.name}-{self.lifecycle.row.pk}")
                 .foreachBatch(self._on_batch).trigger(processingTime=TRIGGER_INTERVAL)
                 .option("checkpointLocation", checkpoint).start())
        self.lifecycle.mark_running()
        log.info("Spark query for %s started (%s) at %s", self.pipeline.name, fmt, self.positions)
        return query

    def _supervise(self, query) -> tuple[str, str]:
        """Watch the query until the run ends; returns (reason, detail). The lifecycle's heartbeat raises
        RunEnded("fenced") when the pipeline moved to a newer epoch (stop/restart/rewind)."""
        while True:
            if query.exception() is not None or not query.isActive:
                failure = query.exception()
                return "error", str(failure) if failure else "the Spark query ended"
            if self.ending:
                return self.ending.reason, self.ending.detail
            if stuck := self._stuck_batch():
                return "error", stuck
            if self._stop_requested():
                return "stopped", ""
            limit = self.options.max_seconds
            if limit is not None and time.monotonic() - self.lifecycle.started >= limit:
                return "max_seconds", ""
            with self._lock:
                partitions = list(self.positions)
            if self.lifecycle.heartbeat(partitions) and self.options.stop_when_caught_up and self._caught_up():
                return "caught_up", ""
            query.awaitTermination(0.2)

    def _stuck_batch(self) -> str:
        """Why the micro-batch in flight counts as stuck, or "". A batch whose executors stopped answering (a Python
        worker hung mid-commit, an executor frozen) would hold the run for ever while the driver heartbeats on, and
        the supervisor would never restart it. Past TALLY_RUN_STALL_SECONDS, as a Python engine's stuck run, the
        run ends; stopping the query cancels the batch's tasks, and the restart's epoch fences any that return."""
        limit, since = settings.TALLY_RUN_STALL_SECONDS, self.batch_since
        if not limit or since is None or time.monotonic() - since <= limit:
            return ""
        return (f"no progress for {limit} s: a micro-batch has not finished on the executors (stuck, say in a worker "
                f"that hung while committing); the run ends so that the supervisor restarts the pipeline "
                f"(TALLY_RUN_STALL_SECONDS)")

    def _stop_requested(self) -> bool:
        if self.stop is None:
            return False
        is_set = getattr(self.stop, "is_set", None)
        return bool(is_set() if is_set is not None else self.stop())

    def _caught_up(self) -> bool:
        """Every partition of the topic has its stored position at the log end (consumers/engine/caught_up.py),
        and no micro-batch is in flight: its executors may have committed the last records while a task
        retry (a worker that died after its commit) is still to report; the run waits for its outcome."""
        if self._batch_lock.locked():
            return False
        return caught_up.topic_caught_up(self.pipeline).done

    def _stop_query(self, query) -> str:
        """Stop the query; returns its failure, if it failed."""
        try:
            query.stop()
        except Exception as exc:  # the query may already be dead; its failure is reported via exception()
            log.warning("Stopping the Spark query of %s: %s", self.pipeline.name, exc)
        failure = query.exception()
        return str(failure) if failure is not None else ""

    # --- one micro-batch: planned on the driver, committed on the executors ------------------------------
    def _on_batch(self, frame, batch_id: int) -> None:
        if self.ending or self._closing:
            return  # fenced, failed or stopping: the supervisor is stopping the query; write nothing more
        with self._batch_lock:
            if not self._closing:
                self.batch_since = time.monotonic()
                try:
                    self._commit_on_executors(frame, self._batch_fetches(batch_id))
                except RunEnded as ended:
                    self.ending = ended
                finally:
                    self.batch_since = None

    def _batch_fetches(self, batch_id: int) -> dict[int, tuple]:
        """Each partition's fetch of micro-batch `batch_id` as (start, end): from where the previous batch
        ended (or the starting position) to this batch's end offset in the offset log. The start is None for
        a partition added to the topic during the run: its task knows it (the source read it from its log
        start)."""
        end = read_offset_log(self.checkpoint, batch_id, self.pipeline.topic)
        before = read_offset_log(self.checkpoint, batch_id - 1, self.pipeline.topic) if batch_id > 0 else {}
        with self._lock:
            return {p: (before.get(p, self.positions.get(p)), stop) for p, stop in end.items()}

    def _commit_on_executors(self, frame, fetches: dict[int, tuple]) -> None:
        """Each task commits the partition slices it read (consumers/engine/spark_commit.py); the driver
        gets one outcome row per slice, never a record. A partition whose fetch crossed only a hole (no
        record, so no task row) has its position moved here, with no record to write."""
        if not self.options.faults.in_worker:
            self.options.faults.maybe_crash("after-poll")
        self.lifecycle.records_arrived()
        job = dataclasses.replace(self._slice_job(), fetches=fetches)
        if self.options.faults.in_worker:
            job = dataclasses.replace(job, crash_points=tuple(
                spark_commit.crash_points(self.options.faults, self.next_attempt, TASK_ATTEMPTS)))
        rows = frame.mapInArrow(spark_commit.commit_slices(job), spark_commit.OUTCOME_SCHEMA).collect()
        outcomes = [row.asDict() for row in rows]
        self._note_attempts(outcomes)
        outcomes += self._move_past_holes(fetches, {o["partition"] for o in outcomes})
        if not outcomes:
            return
        refused = [o for o in outcomes if o["refusal"]]
        ends = self._count([o for o in outcomes if not o["refusal"]])
        if refused:
            raise RunEnded.refused(refused[0]["refusal"], refused[0]["detail"] or "")
        if not self.options.faults.in_worker:
            self.options.faults.maybe_crash("after-db-commit")
        self.kafka.after_db_commit(ends)

    def _move_past_holes(self, fetches: dict[int, tuple], committed: set[int]) -> list[dict]:
        """Commit the positions of partitions whose fetch moved without a record (transaction markers,
        aborted records): a ledger row and `next_offset`, through the same protocol, no row written."""
        moved = {p: commit.Fetch(start, end) for p, (start, end) in fetches.items()
                 if p not in committed and start is not None and end > start}
        if not moved:
            return []
        if self.mode == DeliveryMode.AT_MOST_ONCE:
            self.kafka.before_write({p: fetch.end for p, fetch in moved.items()})
        try:
            outcomes = commit.commit_batch(self.conn, self.target, self.epoch, {}, NO_FAULTS, moved)
        except commit.CommitRefused as exc:
            return [spark_commit.refusal_outcome(min(moved), exc)]
        return [spark_commit.outcome_row(o) for o in outcomes]

    def _note_attempts(self, outcomes: list[dict]) -> None:
        """Log each Python worker that died committing (an earlier attempt of a task that came back), and
        move the crash schedule on by the attempts the scheduled task made (none if it had no records)."""
        attempts = {o["task"]: o["attempt"] for o in outcomes}
        self.retried_slices += sum(1 for o in outcomes if o["attempt"] > 0)
        for task, attempt in sorted(attempts.items()):
            for _ in range(attempt):
                log.warning("%s (task %s of %s retried by Spark)", spark_commit.WORKER_DIED, task,
                            self.pipeline.name)
                if self.options.on_worker_death is not None:
                    self.options.on_worker_death()
        if spark_commit.SCHEDULED_TASK in attempts:
            self.next_attempt += attempts[spark_commit.SCHEDULED_TASK] + 1

    def _slice_job(self) -> spark_commit.SliceJob:
        if self._job is None:
            self._job = spark_commit.SliceJob(
                dsn=spark_commit.dsn_from_settings(settings.DATABASES["default"],
                                                 settings.TALLY_ENGINE_IDLE_TRANSACTION_SECONDS),
                pipeline_id=self.pipeline.pk, topic=self.pipeline.topic, sink_table=self.pipeline.sink_table,
                transform=self.pipeline.transform, exactly_once=self.target.exactly_once,
                stop_on_bad_record=self.target.stop_on_bad_record, epoch=self.epoch,
                at_most_once=self.mode == DeliveryMode.AT_MOST_ONCE, group_id=self.pipeline.group_id,
                bootstrap=clusters.get(self.pipeline.cluster).bootstrap_servers,
                cluster=json.dumps(clusters.get(self.pipeline.cluster).spec()),
                known_partitions=frozenset(self.positions),
                delay_per_record_s=self.delay_per_record_s,
                faults=spark_commit.executor_faults(self.options.faults),
                json_plan=self.json_plan,
                upsert_key=self.target.upsert_key, delete_on_tombstone=self.target.delete_on_tombstone)
        return self._job

    def _count(self, outcomes: list[dict]) -> dict[int, int]:
        """Committed outcome rows into the run's counts and the driver's positions; returns the new positions."""
        if not outcomes:
            return {}
        with self._lock:
            ends = self.lifecycle.count(spark_commit.partition_outcome(o) for o in outcomes)
            for p, end in ends.items():
                self.positions[p] = max(self.positions.get(p, 0), end)
        return ends


def read_offset_log(checkpoint: str, batch_id: int, topic: str) -> dict[int, int]:
    """The end offsets {partition: offset} of micro-batch `batch_id` from the query's offset log: a version
    line, a metadata line, then one JSON line per source (`{"topic": {"0": 12}}` for both Kafka sources)."""
    try:
        with open(os.path.join(checkpoint, "offsets", str(batch_id))) as log_file:
            lines = log_file.read().splitlines()
    except FileNotFoundError:
        return {}
    for line in lines[2:]:
        offsets = json.loads(line)
        if isinstance(offsets, dict) and topic in offsets:
            return {int(p): int(o) for p, o in offsets[topic].items()}
    return {}

