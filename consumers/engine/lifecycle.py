"""One pipeline run's life cycle, the same for every engine (python.py, spark.py).

    pipeline = load_pipeline(name, epoch)           # UnknownPipeline if there is none
    run = Run(pipeline, Engine.PYTHON, task_id=...)  # joins the pipeline's current epoch: a ConsumerRun row
    kafka = KafkaPositions(pipeline, consumer)       # Kafka's copy of the positions
    loop:
        run.heartbeat(partitions)                    # at most HEARTBEAT_INTERVAL_S apart, then the fencing check
        kafka.before_write(ends)                     # at-most-once only: the position, before the write
        outcomes = commit.commit_batch(...)          # the engine's own place: ONE PostgreSQL transaction
        kafka.after_db_commit(run.count(outcomes))   # counts, then Kafka's copy (advisory)
    kafka.finish(reason); run.finish(reason, detail) -> RunResult

An engine differs only in how it fetches records and where it calls `commit.commit_batch`.

Epochs (docs/architecture.md "Epochs and runs"): a run joins the epoch its task was sent for, or (a foreground
run) the pipeline's current epoch when it starts. It ends when its heartbeat sees a newer epoch or a deleted
pipeline (`RunEnded("fenced")`), or when the commit protocol refuses a write of an older epoch inside its
transaction (commit.Fenced). A run ends with an EndReason (consumers/models); RUN_STATE says which ConsumerRun
state that is, and HALT_REASONS leave their reason on the pipeline.
"""
import logging
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass

from django.utils import timezone

from consumers.engine import beat, commit, db, json_map
from consumers.engine.consumer import EngineConsumer, KafkaPythonConsumer
from consumers.kafka import clusters
from consumers.models import (
    ClusterStatus,
    ConsumerRun,
    DeliveryMode,
    EndReason,
    Pipeline,
    PipelineError,
    RunState,
)

log = logging.getLogger("tally.engine")

HEARTBEAT_INTERVAL_S = beat.INTERVAL_S   # the epoch contract: a run notices a newer epoch within about a second

CLEAN_REASONS = (EndReason.CAUGHT_UP, EndReason.STOPPED, EndReason.MAX_SECONDS)
# FAILED runs halted on something a restart cannot cure (a bad record under the "stop" policy, a database
# error that is not about data): the supervisor leaves them for an operator and the alert says why.
# CRASHED runs (anything else, e.g. a lost connection) are restarted with backoff.
RUN_STATE = {EndReason.CAUGHT_UP: RunState.STOPPED, EndReason.STOPPED: RunState.STOPPED,
             EndReason.MAX_SECONDS: RunState.STOPPED, EndReason.FENCED: RunState.FENCED,
             EndReason.BAD_RECORD: RunState.FAILED, EndReason.SINK_ERROR: RunState.FAILED,
             EndReason.ERROR: RunState.CRASHED}
# The one reading of "halted": the reasons that end a run FAILED (ConsumerRun.objects.halted(), Pipeline.halted_run).
HALT_REASONS = tuple(reason for reason, state in RUN_STATE.items() if state == RunState.FAILED)


class UnknownPipeline(LookupError):
    pass


@dataclass
class RunResult:
    pipeline: str
    reason: EndReason
    records: int = 0            # records committed by this run (rows + dead letters, replays excluded)
    batches: int = 0            # committed batches that held records
    rows_written: int = 0
    dead_letters: int = 0
    skipped: int = 0            # replayed records the commit protocol skipped
    epoch: int = 0
    run_id: int | None = None
    detail: str = ""
    seconds: float = 0.0        # wall time of the run
    busy_seconds: float = 0.0   # from the first record fetched to the last committed batch (throughput)
    busy_from: float | None = None   # the same span in Unix time, to combine runs of several processes
    busy_until: float | None = None

    @property
    def ok(self) -> bool:
        return self.reason in CLEAN_REASONS


class RunEnded(Exception):
    """Ends a run with an EndReason (fenced by a newer epoch, a refused batch, a bad start)."""

    def __init__(self, reason: EndReason | str, detail: str = ""):
        super().__init__(detail)
        self.reason, self.detail = EndReason(reason), detail

    @classmethod
    def refused(cls, refusal: str, detail: str) -> "RunEnded":
        """A batch the commit protocol refused (`commit.CommitRefused.reason`): fenced, bad record and sink
        error end the run as such; a gap, or any other refusal, is an error."""
        if refusal in EndReason.values:
            return cls(refusal, detail)
        return cls(EndReason.ERROR, f"Gap: {detail}" if refusal == commit.Gap.reason else detail)


def cluster_unusable(pipeline: Pipeline, exc: Exception) -> tuple[str, str]:
    """A run that cannot use its Kafka cluster (TLS, authentication, unreachable, settings): the reason it ends
    with, logged once without a traceback (the message says what to fix) and kept as the cluster's last error
    for the Clusters page. The supervisor restarts the run with backoff."""
    log.error("%s: %s", pipeline.name, exc)
    ClusterStatus.objects.record_failure(pipeline.cluster, str(exc))
    return "error", f"{type(exc).__name__}: {exc}"


def load_pipeline(name: str, epoch: int | None = None) -> Pipeline:
    """The pipeline, as the run will join it: at `epoch` when the run was started for one (a run task checks the
    pipeline still runs at its epoch, then starts its engine; an action that lands in between made a newer
    epoch for itself, a stop's say, which the run must not join: it joins its own, and is fenced at once)."""
    try:
        pipeline = Pipeline.objects.get(name=name)
    except Pipeline.DoesNotExist:
        raise UnknownPipeline(f"No pipeline named {name!r}.") from None
    if epoch is not None:
        pipeline.epoch = epoch
    return pipeline


def target_of(pipeline: Pipeline) -> commit.Target:
    """Where the run writes. A json mapping that no longer fits its table (a mapped column dropped, or made
    GENERATED ALWAYS AS IDENTITY) is RunEnded as a sink error saying why: a restart would not cure it."""
    try:
        return commit.Target.for_pipeline(pipeline)
    except json_map.MappingInvalid as exc:
        raise RunEnded(EndReason.SINK_ERROR, f"the mapping no longer fits sink table {pipeline.sink_table!r}: "
                                             f"{exc}") from None


def ended_at_start(pipeline: Pipeline, engine: str, task_id: str, ended: RunEnded) -> RunResult:
    """A run refused before it began (`target_of`) ends as one that began would: its run row ended with the reason,
    and a halt left on the pipeline for the supervisor to leave alone, rather than an exception out of the task."""
    return Run(pipeline, engine, task_id=task_id).finish(ended.reason, ended.detail)


def record_halt(pipeline_id: int, epoch: int, reason: str, detail: str) -> None:
    """A run that halted (HALT_REASONS) leaves its reason on the pipeline, where the page shows it."""
    if reason in HALT_REASONS:
        Pipeline.objects.filter(pk=pipeline_id, epoch=epoch).set_error(PipelineError.HALTED, detail, reason,
                                                                       updated_at=timezone.now())


class Run:
    """One engine run of one pipeline: its ConsumerRun row, heartbeat and fencing, counts and outcome."""

    def __init__(self, pipeline: Pipeline, engine: str, *, task_id: str = "", state: str = RunState.RUNNING):
        self.pipeline, self.epoch, self.engine = pipeline, pipeline.epoch, engine
        self.row = ConsumerRun.objects.create(
            pipeline=pipeline, epoch=self.epoch, host=socket.gethostname(), pid=os.getpid(), task_id=task_id,
            engine=engine, state=state)
        self.result = RunResult(pipeline.name, reason=EndReason.ERROR, epoch=self.epoch, run_id=self.row.pk)
        self.started = time.monotonic()
        self.next_heartbeat = 0.0
        self.first_record_at: float | None = None
        self.last_commit_at: float | None = None
        # Heartbeat, fencing check, peers and the session lock: the process's beat, for all its runs at once.
        self.beat = beat.beat()
        try:
            self.member = self.beat.join(self.row.pk, pipeline.pk, self.epoch)
        except BaseException as exc:
            # No heartbeat reached the database in time (a lock, a stalled database): the row is ended here, so the
            # supervisor counts no live run and starts the pipeline again.
            ConsumerRun.objects.filter(pk=self.row.pk).end(
                RunState.CRASHED, f"{EndReason.ERROR}: could not begin: {type(exc).__name__}: {exc}", timezone.now())
            raise
        self.member.consuming = state == RunState.RUNNING

    def mark_running(self) -> None:
        """A run that registered as STARTING (its engine needed time to set up) now consumes."""
        ConsumerRun.objects.filter(pk=self.row.pk).mark_running(timezone.now())
        self.member.turned_at, self.member.consuming = time.monotonic(), True

    def heartbeat(self, partitions: Iterable[int] | None = None, *, force: bool = False) -> bool:
        """Hand the beat this run's progress (`partitions`: its assignment; None leaves the row's as it is), then
        the fencing check (raises RunEnded("fenced")) on what the last beat read. Forced, it waits for a beat
        that carries this progress. Returns whether a heartbeat interval has passed since it last returned True
        (an engine's cue for its once-a-second checks)."""
        self.member.records = self.result.records
        self.member.turned_at = time.monotonic()
        if partitions is not None:
            self.member.partitions = sorted(partitions)
        if force:
            try:
                self.beat.now()
            except TimeoutError as exc:
                raise RunEnded("error", str(exc)) from None
        if self.member.failure:
            raise RunEnded("error", f"heartbeat failed: {self.member.failure}")
        if self.member.stalled:   # it turned again after all: it ends, as its row says, and the pipeline restarts
            raise RunEnded("error", self.member.stalled)
        if self.member.fenced:
            raise RunEnded("fenced", self.member.fenced)
        now = time.monotonic()
        if not force and now < self.next_heartbeat:
            return False
        self.next_heartbeat = now + HEARTBEAT_INTERVAL_S
        return True

    def peers(self) -> dict[int, set[int]]:
        """The members of this run's epoch and the partitions each holds, as the last beat read them
        (consumers/engine/shares.py)."""
        return self.member.peers

    def records_arrived(self) -> None:
        """The first fetched record starts the busy time."""
        if self.first_record_at is None:
            self.first_record_at = time.monotonic()
            self.result.busy_from = time.time()

    def count(self, outcomes: Iterable[commit.PartitionOutcome]) -> dict[int, int]:
        """Add one DB commit's outcomes to the result; returns each partition's new position (for Kafka)."""
        ends, records = {}, False
        for outcome in outcomes:
            self.result.records += outcome.records
            self.result.rows_written += outcome.rows_written
            self.result.dead_letters += outcome.dead_letters
            self.result.skipped += outcome.skipped
            ends[outcome.partition] = outcome.end_offset
            records = records or outcome.records > 0
        if records:
            self.result.batches += 1
        self.last_commit_at = time.monotonic()
        self.result.busy_until = time.time()
        return ends

    def finish(self, reason: str, detail: str = "") -> RunResult:
        """The run's outcome: the result, the run row's end state (RUN_STATE) and, for a halt, the pipeline's
        last error."""
        result = self.result
        result.reason, result.detail = reason, detail
        result.seconds = time.monotonic() - self.started
        if self.first_record_at is not None and self.last_commit_at is not None:
            result.busy_seconds = max(0.0, self.last_commit_at - self.first_record_at)
        self.beat.leave(self.member)   # no beat may overwrite the end written next
        ConsumerRun.objects.filter(pk=self.row.pk).end(
            RUN_STATE.get(reason, RunState.CRASHED), f"{reason}: {detail}" if detail else reason, timezone.now(),
            records_processed=result.records)
        record_halt(self.pipeline.pk, self.epoch, reason, detail)
        log.info("%s: %s run %s ended: %s %s (%s records in %s batches, %.1f s)", self.pipeline.name,
                 self.engine, self.row.pk, reason, detail, result.records, result.batches, result.seconds)
        return result


class KafkaPositions:
    """Kafka's copy of a run's positions (docs/architecture.md "Positions", rule 4).

    Exactly-once and at-least-once: the positions after each DB commit, advisory (lag tools read it; a
    failure is logged). At-least-once resumes from it, so it is waited for; exactly-once commits
    asynchronously when the run's own consumer (polled by the run) commits. At-most-once: the position
    itself, committed before the write (the classic loss), so the batch is never written without it.

    A commit that is waited for is fenced like a batch: it is sent holding the pipeline row FOR SHARE at the
    run's epoch (`_commit_in_epoch`), so a restart's or rewind's epoch bump waits for it, and a run frozen past
    its lease (counted dead, so a rewind went ahead) that wakes up is fenced instead of putting its old
    positions back over the rewind's, which the classic modes would resume from.

    `consumer` is the run's own consumer (either client: consumers/engine/consumer.py `EngineConsumer`),
    polled by the run so asynchronous commits complete; it joins no group and commits as the group's simple
    consumer. An engine without one (Spark's driver) passes None and a kafka-python consumer is opened on
    first use.
    """

    def __init__(self, pipeline: Pipeline, consumer: EngineConsumer | None = None, *, client_id: str = ""):
        self.topic, self.group_id, self.cluster = pipeline.topic, pipeline.group_id, pipeline.cluster
        self.pipeline_id, self.epoch = pipeline.pk, pipeline.epoch
        self.client_id = client_id or f"tally-{pipeline.name}"
        self.mode = pipeline.delivery_mode
        self._consumer, self._own = consumer, consumer is None
        self.positions: dict[int, int] = {}  # every partition's position after the last DB commit
        self._unconfirmed = False             # commits sent asynchronously, or failed, since then

    def before_write(self, ends: dict[int, int]) -> None:
        """At-most-once: commit the batch's positions before writing it; raises RunEnded when Kafka refuses."""
        if not self._commit(ends, wait=True):
            raise RunEnded("error", f"at-most-once: Kafka refused the position {ends}; the batch was not written")

    def after_db_commit(self, ends: dict[int, int]) -> None:
        """After the batch's DB commit: Kafka's copy of the new positions (nothing in at-most-once mode)."""
        if self.mode == DeliveryMode.AT_MOST_ONCE or not ends:
            return
        self.positions.update(ends)
        wait = self._own or self.mode != DeliveryMode.EXACTLY_ONCE
        if not self._commit(ends, wait=wait) or not wait:
            self._unconfirmed = True

    def forget(self, partitions) -> None:
        """Partitions this run no longer holds: their next holder commits them to Kafka from now on (a
        last commit of ours at the end would move Kafka's copy back)."""
        for partition in partitions:
            self.positions.pop(partition, None)

    def finish(self, reason: str) -> None:
        """A clean end with commits unconfirmed: one last synchronous commit leaves Kafka's lag exact."""
        if reason in CLEAN_REASONS:
            try:
                self.settle()
            except RunEnded as fenced:   # a newer epoch's positions stand: the run ends as it was going to
                log.info("%s: last Kafka offset commit skipped: %s", self.group_id, fenced.detail)

    def settle(self) -> None:
        """Commits unconfirmed: one synchronous commit of every position (a run ending, or parking)."""
        if self._unconfirmed and self.positions:
            self._unconfirmed = not self._commit(self.positions, wait=True)

    def use(self, consumer: EngineConsumer | None) -> None:
        """The run's consumer changed (parked: None; woken: its new one). Never a consumer of its own then."""
        self._consumer, self._own = consumer, False

    def close(self) -> None:
        """Close the consumer this opened (a run's own consumer is the engine's to close)."""
        if self._own and self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _commit(self, ends: dict[int, int], *, wait: bool) -> bool:
        """True when the commit is known to have succeeded (or was sent); a failure is logged. Raises
        RunEnded("fenced") when a newer epoch exists (a commit waited for only)."""
        if not ends:
            return True
        try:
            consumer = self._group_less() if self._consumer is None else self._consumer
            if wait:
                self._commit_in_epoch(consumer, ends)
            else:
                consumer.commit(ends, wait=False)
        except commit.Fenced as exc:
            raise RunEnded("fenced", f"{exc}; Kafka's offsets {ends} were not committed") from None
        except Exception as exc:  # the caller decides whether a failed commit matters (before_write)
            log.warning("%s: Kafka offset commit %s failed: %s", self.group_id, ends, exc)
            return False
        return True

    def _commit_in_epoch(self, consumer: EngineConsumer, ends: dict[int, int]) -> None:
        """Commit to Kafka while holding the pipeline row FOR SHARE at this run's epoch (commit.check_epoch): an
        epoch bump (restart, stop, a rewind's pause) waits until the commit is done, and a commit after it is
        refused. A run frozen inside holds the row until PostgreSQL ends its transaction
        (TALLY_ENGINE_IDLE_TRANSACTION_SECONDS, db.ConnectionPool): the bump then goes ahead, and the COMMIT below
        fails, so the run ends."""
        with db.engine_connection() as conn:
            with conn.cursor() as cur:
                commit.check_epoch(cur, self.pipeline_id, self.epoch)
            consumer.commit(ends, wait=True)
            conn.commit()

    def _group_less(self) -> EngineConsumer:
        self._consumer = KafkaPythonConsumer(
            clusters.consumer(self.cluster, group_id=self.group_id, enable_auto_commit=False,
                              client_id=self.client_id, allow_auto_create_topics=False), self.topic)
        return self._consumer

