"""The Spark engine: a Structured Streaming query per pipeline run, committing through consumers.engine.commit.

    Kafka ──(tally_kafka, or Spark's `kafka` format when its connector is on the classpath)──> micro-batch
      └─ foreachBatch (driver): collect the batch as Arrow -> SourceRecords per partition
           -> commit.commit_batch: ONE PostgreSQL transaction for rows, dead letters, ledger, next_offset,
              epoch-fenced, replays skipped (the pipeline's record-level transform runs there)
           -> Kafka offsets (advisory, after the DB commit; before the write in at-most-once mode)

Positions, not offset arithmetic (docs/architecture.md): a micro-batch's end offset per partition -- what
the source planned to read up to, the high watermark it saw -- is the consumer's position after the batch,
read from the query's offset log (Spark writes it before running the batch). So a batch that ends on a
transaction marker stores the position past it, and a batch that crossed only markers (an empty frame)
still moves the stored position.

The query starts from PostgreSQL's positions (`startingOffsets`) with a scratch checkpoint that is thrown
away when the run ends, so the database alone says where a pipeline stands: a restart, a rewind or a
switch between the Python and the Spark engine all resume from `PartitionOffset.next_offset`.

Same entry point and result as the Python engine (consumers/engine/python.py); epochs as in docs/architecture.md:
a run joins the pipeline's current epoch, notices a newer one at its next heartbeat or commit, and ends.
"""
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time

import pyarrow as pa
from django.conf import settings
from django.utils import timezone

from consumers.engine import caught_up, commit, db, log_bounds, sinks
from consumers.engine import spark_worker_commit as worker_commit
from consumers.engine.faults import NO_FAULTS, FaultInjector
from consumers.engine.python import _RUN_STATE, RunResult, UnknownPipeline, record_halt
from consumers.engine.spark_session import get_spark
from consumers.engine.spark_source import kafka_format, offsets_json
from consumers.engine.transforms import SourceRecord
from consumers.kafka import admin as kafka_admin
from consumers.models import ConsumerRun, DeliveryMode, Engine, Pipeline, ResetPolicy, RunState

log = logging.getLogger("tally.spark.engine")

# Each micro-batch has a fixed cost of about 0.6 s here (planning, a latest-offsets fetch, task launch and a
# Kafka connection per partition, the foreachBatch callback), so a trigger must carry many records to be
# worth it (bench/bench_spark.py: 8k records/s at 5,000 per trigger, 62k at 100,000). The pipeline's
# batch_size (sized for the Python engine's polls) is raised to at least this unless the caller asks for a
# size. 100,000 small records are a few tens of MB in the driver; lower it for large values.
MIN_RECORDS_PER_TRIGGER = 100_000
# With no new data Spark would ask the source for the latest offsets every 10 ms; each ask is a fetch.
TRIGGER_INTERVAL = "250 milliseconds"
HEARTBEAT_SECONDS = 1.0


def run_pipeline(name, *, stop=None, batch_size=None, delay_ms=0, stop_when_caught_up=False, max_seconds=None,
                 faults: FaultInjector = NO_FAULTS, task_id="") -> RunResult:
    """Run pipeline `name` on Spark until stopped, fenced, caught up (if asked) or out of time."""
    try:
        pipeline = Pipeline.objects.get(name=name)
    except Pipeline.DoesNotExist:
        raise UnknownPipeline(f"No pipeline named {name!r}.") from None
    return SparkRun(pipeline, stop=stop, batch_size=batch_size, delay_ms=delay_ms,
                    stop_when_caught_up=stop_when_caught_up, max_seconds=max_seconds, faults=faults,
                    task_id=task_id).run()


class SparkRun:
    def __init__(self, pipeline: Pipeline, *, stop, batch_size, delay_ms, stop_when_caught_up, max_seconds,
                 faults, task_id):
        self.pipeline = pipeline
        self.stop = stop
        self.records_per_trigger = batch_size or max(pipeline.batch_size, MIN_RECORDS_PER_TRIGGER)
        self.delay_per_record_s = (delay_ms or 0) / 1000  # as the Python engine: simulated work per record
        self.stop_when_caught_up = stop_when_caught_up
        self.max_seconds = max_seconds
        self.faults = faults
        self.task_id = task_id
        self.epoch = pipeline.epoch
        self.target = commit.Target.for_pipeline(pipeline)
        self.mode = pipeline.delivery_mode
        self.positions: dict[int, int] = {}
        self.ending: str | None = None      # set by the batch callback: fenced / bad_record / error
        self.error = ""
        self.result = None
        self._lock = threading.Lock()
        # Held while a micro-batch commits: shutdown waits for the batch in flight before closing the
        # connection (query.stop() does not wait for a Python foreachBatch callback to return).
        self._batch_lock = threading.Lock()
        self._closing = False
        self._kafka = None
        self.next_attempt = 1               # batch attempts, for faults in a Python worker (worker_commit.py)
        self.checkpoint = ""

    # --- lifecycle -------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        started = time.monotonic()
        self.run_row = ConsumerRun.objects.create(
            pipeline=self.pipeline, epoch=self.epoch, host=socket.gethostname(), pid=os.getpid(),
            task_id=self.task_id, engine=Engine.SPARK, state=RunState.STARTING)
        self.result = RunResult(self.pipeline.name, reason="stopped", epoch=self.epoch, run_id=self.run_row.pk)
        self.conn = db.connect(f"tally-spark-{self.pipeline.name}")
        checkpoint = self.checkpoint = tempfile.mkdtemp(prefix=f"tally-spark-{self.pipeline.name}-")
        query = None
        try:
            self.positions = self._starting_positions()
            self.run_row.assigned_partitions = sorted(self.positions)
            self.run_row.save(update_fields=["assigned_partitions"])
            query = self._start_query(checkpoint)
            self._supervise(query, started)
        except Exception as exc:
            log.exception("Spark run of %s failed", self.pipeline.name)
            self.result.reason, self.error = "error", f"{type(exc).__name__}: {exc}"
        finally:
            self._closing = True
            if query is not None:
                self._stop_query(query)
            with self._batch_lock:
                self.conn.close()
                if self._kafka is not None:
                    self._kafka.close()
            shutil.rmtree(checkpoint, ignore_errors=True)
        self.result.detail = self.error
        self._finish_run_row()
        log.info("%s: Spark run %s ended: %s %s (%s records in %s batches, %.1f s)", self.pipeline.name,
                 self.run_row.pk, self.result.reason, self.error, self.result.records, self.result.batches,
                 time.monotonic() - started)
        return self.result

    def _starting_positions(self) -> dict[int, int]:
        """Exactly-once: PostgreSQL's next_offset (rows created at the reset policy's end if missing).
        The classic modes resume from Kafka's committed offsets, as the classic consumers do."""
        topic = self.pipeline.topic
        marks = kafka_admin.watermarks(topic)
        with self.conn.cursor() as cur:
            sinks.ensure_sink_table(cur, self.pipeline.sink_table, self.target.transform, self.target.exactly_once)
        self.conn.commit()
        fallback = {p: (m.log_start if self.pipeline.reset_policy == ResetPolicy.EARLIEST else m.high)
                    for p, m in marks.items()}
        if self.target.exactly_once:
            positions = commit.ensure_positions(self.conn, self.pipeline.pk, fallback)
            for skip in log_bounds.check(self.conn, self.pipeline, self.target, self.epoch, positions, marks):
                log.warning("%s: %s (the pipeline's policy is to skip)", self.pipeline.name, skip.note)
            return positions
        committed = kafka_admin.committed_offsets(self.pipeline.group_id, topic, sorted(marks))
        return {p: committed[p] if committed.get(p) is not None else fallback[p] for p in marks}

    def _start_query(self, checkpoint: str):
        from pyspark.sql import functions as F

        spark = get_spark()
        fmt = kafka_format(spark)
        stream = (spark.readStream.format(fmt)
                  .option("kafka.bootstrap.servers", settings.KAFKA_BOOTSTRAP_SERVERS)
                  .option("subscribe", self.pipeline.topic)
                  .option("startingOffsets", offsets_json(self.pipeline.topic, self.positions))
                  .option("maxOffsetsPerTrigger", str(self.records_per_trigger)))
        if fmt == "kafka":
            stream = stream.option("failOnDataLoss", "true")
        frame = stream.load().select("partition", "offset", "key", "value",
                                     F.unix_millis("timestamp").alias("timestamp_ms"))
        query = (frame.writeStream.queryName(f"tally-{self.pipeline.name}-{self.run_row.pk}")
                 .foreachBatch(self._on_batch).trigger(processingTime=TRIGGER_INTERVAL)
                 .option("checkpointLocation", checkpoint).start())
        ConsumerRun.objects.filter(pk=self.run_row.pk).mark_running(timezone.now())
        log.info("Spark query for %s started (%s) at %s", self.pipeline.name, fmt, self.positions)
        return query

    def _supervise(self, query, started: float) -> None:
        next_heartbeat = 0.0
        while True:
            if query.exception() is not None or not query.isActive:
                failure = query.exception()
                self.result.reason = "error"
                self.error = self.error or (str(failure) if failure else "the Spark query ended")
                return
            if self.ending:
                self.result.reason = self.ending
                return
            if self._stop_requested():
                self.result.reason = "stopped"
                return
            if self.max_seconds is not None and time.monotonic() - started >= self.max_seconds:
                self.result.reason = "max_seconds"
                return
            now = time.monotonic()
            if now >= next_heartbeat:
                next_heartbeat = now + HEARTBEAT_SECONDS
                if not self._heartbeat():
                    self.result.reason = "fenced"
                    return
                if self.stop_when_caught_up and self._caught_up():
                    self.result.reason = "caught_up"
                    return
            query.awaitTermination(0.2)

    def _stop_requested(self) -> bool:
        if self.stop is None:
            return False
        is_set = getattr(self.stop, "is_set", None)
        return bool(is_set() if is_set is not None else self.stop())

    def _heartbeat(self) -> bool:
        """Record liveness and progress; False when the pipeline moved to a newer epoch (stop/restart/rewind)."""
        ConsumerRun.objects.filter(pk=self.run_row.pk).heartbeat(timezone.now(), records_processed=self.result.records)
        current = Pipeline.objects.filter(pk=self.pipeline.pk).values_list("epoch", flat=True).first()
        return current == self.epoch

    def _caught_up(self) -> bool:
        """Every partition of the topic has its stored position at the log end (consumers/engine/caught_up.py)."""
        return caught_up.topic_caught_up(self.pipeline).done

    def _stop_query(self, query) -> None:
        try:
            query.stop()
        except Exception as exc:  # the query may already be dead; its failure is reported via exception()
            log.warning("Stopping the Spark query of %s: %s", self.pipeline.name, exc)
        failure = query.exception()
        if failure is not None and not self.error:
            self.result.reason, self.error = "error", str(failure)

    def _finish_run_row(self) -> None:
        state = _RUN_STATE.get(self.result.reason, RunState.CRASHED)
        ConsumerRun.objects.filter(pk=self.run_row.pk).end(
            state, self.result.reason + (f": {self.error}" if self.error else ""), timezone.now(),
            records_processed=self.result.records)
        record_halt(self.pipeline.pk, self.epoch, self.result.reason, self.error or "")

    # --- one micro-batch (runs on the driver, in Spark's callback thread) -------------------------------
    def _on_batch(self, frame, batch_id: int) -> None:
        if self.ending or self._closing:
            return  # fenced, failed or stopping: the supervisor is stopping the query; write nothing more
        batches = to_source_records(frame.toArrow())
        with self._batch_lock:
            if not self._closing:
                self._commit(batches, self._batch_fetches(batch_id, batches))

    def _batch_fetches(self, batch_id: int, batches) -> dict[int, commit.Fetch]:
        """Each partition's Fetch of micro-batch `batch_id`: from where the previous batch ended (or the
        starting positions) to this batch's end offset in the offset log."""
        end = read_offset_log(self.checkpoint, batch_id, self.pipeline.topic)
        before = read_offset_log(self.checkpoint, batch_id - 1, self.pipeline.topic) if batch_id > 0 else {}
        fetches = {}
        with self._lock:
            for p in set(end) | set(batches):
                records = batches.get(p) or []
                start = before.get(p, self.positions.get(p))
                if start is None:
                    # A partition added to the topic during the run: the source read it from its log start.
                    start = records[0].offset if records else end[p]
                stop = end.get(p, records[-1].offset + 1 if records else start)
                if records and stop <= records[-1].offset:
                    stop = records[-1].offset + 1
                if records or stop > start:
                    fetches[p] = commit.Fetch(start, stop)
        return fetches

    def _commit(self, batches: dict[int, list[SourceRecord]], fetches: dict[int, commit.Fetch]) -> None:
        if not fetches:
            return
        if any(batches.values()) and not self.faults.in_worker:
            self.faults.maybe_crash("after-poll")
        ends = {p: fetch.end for p, fetch in fetches.items()}
        added = {p: fetch.start for p, fetch in fetches.items() if p not in self.positions}
        if added and self.target.exactly_once:
            # Partitions added to the topic during the run: the source reads them from their log start (as
            # Spark's Kafka source does), so that is where their stored position begins.
            commit.ensure_positions(self.conn, self.pipeline.pk, added)
        try:
            if self.mode == DeliveryMode.AT_MOST_ONCE:
                self._commit_kafka(ends)
                self.faults.maybe_crash("after-kafka-commit")
            outcomes = self._commit_batch(batches, fetches)
        except commit.Fenced as exc:
            self.ending, self.error = "fenced", str(exc)
            return
        except commit.StopOnBadRecord as exc:
            self.ending, self.error = "bad_record", str(exc)
            return
        except commit.SinkError as exc:
            self.ending, self.error = "sink_error", str(exc)
            return
        except commit.Gap as exc:  # e.g. records gone from the log (retention): never skip them silently
            self.ending, self.error = "error", f"Gap: {exc}"
            return
        if not self.faults.in_worker:
            self.faults.maybe_crash("after-db-commit")
        if self.mode != DeliveryMode.AT_MOST_ONCE:
            self._commit_kafka({o.partition: o.end_offset for o in outcomes})
        self._count(outcomes, ends)
        if self.delay_per_record_s:
            time.sleep(self.delay_per_record_s * sum(len(r) for r in batches.values()))

    def _commit_batch(self, batches, fetches):
        if not self.faults.in_worker:
            return commit.commit_batch(self.conn, self.target, self.epoch, batches, self.faults, fetches)
        points, self.next_attempt = worker_commit.crash_points(self.faults, self.next_attempt)
        return worker_commit.commit_on_worker(get_spark(), self.target, self.epoch, batches, points, fetches)

    def _count(self, outcomes, ends) -> None:
        with self._lock:
            for o in outcomes:
                self.result.records += o.records
                self.result.rows_written += o.rows_written
                self.result.dead_letters += o.dead_letters
                self.result.skipped += o.skipped
            for p, end in ends.items():
                self.positions[p] = max(self.positions.get(p, 0), end)
            if any(o.records for o in outcomes):
                self.result.batches += 1

    def _commit_kafka(self, ends: dict[int, int]) -> None:
        """Kafka's copy of the offsets: advisory in exactly-once mode (lag tools read it), the position
        itself in the classic modes. The engine never joins the group, so a simple-consumer commit works."""
        from kafka import KafkaConsumer, TopicPartition
        from kafka.structs import OffsetAndMetadata

        if not ends:
            return
        if self._kafka is None:
            self._kafka = KafkaConsumer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS,
                                        group_id=self.pipeline.group_id, enable_auto_commit=False,
                                        client_id=f"tally-spark-{self.pipeline.name}",
                                        request_timeout_ms=settings.KAFKA_REQUEST_TIMEOUT_MS)
        offsets = {TopicPartition(self.pipeline.topic, p): OffsetAndMetadata(o, "", -1) for p, o in ends.items()}
        try:
            self._kafka.commit(offsets)
        except Exception as exc:
            if self.mode == DeliveryMode.AT_MOST_ONCE:
                raise  # here the Kafka commit is the position: never write without it
            log.warning("Kafka offset commit %s for %s failed: %s", ends, self.pipeline.name, exc)


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


def to_source_records(table: pa.Table) -> dict[int, list[SourceRecord]]:
    """A collected micro-batch (partition, offset, key, value, timestamp_ms) -> SourceRecords per
    partition in offset order, as the commit protocol wants them."""
    columns = [table.column(name).to_pylist() for name in ("partition", "offset", "key", "value", "timestamp_ms")]
    batches: dict[int, list[SourceRecord]] = {}
    for partition, offset, key, value, ts in zip(*columns, strict=True):
        batches.setdefault(partition, []).append(SourceRecord(partition, offset, key, value, ts))
    for records in batches.values():
        if any(a.offset >= b.offset for a, b in zip(records, records[1:], strict=False)):
            records.sort(key=lambda r: r.offset)
    return batches
