"""Pipelines and their state. The database, not Kafka, is the source of truth for positions.

Invariants (docs/architecture.md): a batch's sink rows, dead letters, ledger row and `next_offset` commit in one
transaction (consumers/engine/commit.py); every start/restart/rewind bumps `Pipeline.epoch`; writes from an
older epoch are refused.
"""
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.postgres.indexes import GistIndex
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Case, Exists, ExpressionWrapper, F, OuterRef, Q, Subquery, When
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from consumers.pg_text import error_text

# A Kafka cluster's name, as consumers/kafka/clusters.py accepts it.
validate_cluster_name = RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z",
                                       "A cluster name is 1-64 letters, digits, '.', '_' or '-'.")


class DeliveryMode(models.TextChoices):
    EXACTLY_ONCE = "exactly_once", "exactly-once"
    AT_LEAST_ONCE = "at_least_once", "at-least-once"
    AT_MOST_ONCE = "at_most_once", "at-most-once"


class Engine(models.TextChoices):
    PYTHON = "python", "kafka-python"
    SPARK = "spark", "Spark Structured Streaming"


def runs_problem(runs: int, engine: str) -> str | None:
    """Why a pipeline of `engine` cannot run in `runs` processes, or None: one rule for create, apply and the
    actions that enqueue runs."""
    if not 1 <= runs <= settings.TALLY_MAX_RUNS_PER_PIPELINE:
        return (f"runs must be between 1 and {settings.TALLY_MAX_RUNS_PER_PIPELINE} (TALLY_MAX_RUNS_PER_PIPELINE), "
                f"got {runs}")
    if runs > 1 and engine == Engine.SPARK:
        return ("the spark engine runs one driver per pipeline and spreads the work over its executors: use "
                "runs = 1, or the python engine")
    return None


class DesiredState(models.TextChoices):
    RUNNING = "running", "running"
    PAUSED = "paused", "paused"
    STOPPED = "stopped", "stopped"


class ResetPolicy(models.TextChoices):
    EARLIEST = "earliest", "earliest"
    LATEST = "latest", "latest"


class BadRecordPolicy(models.TextChoices):
    DEAD_LETTER = "dead_letter", "dead-letter and go on"
    STOP = "stop", "stop the pipeline"


class IsolationLevel(models.TextChoices):
    READ_COMMITTED = "read_committed", "read committed"
    READ_UNCOMMITTED = "read_uncommitted", "read uncommitted"


class LogTruncatedPolicy(models.TextChoices):
    """What an exactly-once pipeline does when the log start has moved past its stored position
    (retention, DeleteRecords, a recreated topic): the unread records are gone."""
    STOP = "stop", "stop with the reason"
    SKIP = "skip", "skip them, record it in the ledger and alert"


class PipelineError(models.TextChoices):
    """Who wrote `Pipeline.last_error`. The stored text starts with the kind, so one writer clears its own
    error without wiping another's (reconciliation clears a sink error it no longer sees, never a run's)."""
    RUN_FAILED = "run failed", "a run failed"
    HALTED = "halted", "a run halted on a record or the sink"
    SINK = "sink", "reconciliation cannot read the sink"
    NOT_ENQUEUED = "run not enqueued", "the task broker did not take the run"
    RESTARTED = "restarted", "the supervisor restarted the pipeline"
    GAVE_UP = "gave up", "the supervisor stopped the pipeline"

    def text(self, detail: str, qualifier: str = "") -> str:
        """The stored text: "KIND (QUALIFIER): DETAIL", e.g. "halted (bad_record): offset 7: not a number"."""
        return error_text(f"{self.value}{f' ({qualifier})' if qualifier else ''}: {detail}")


class KafkaClient(models.TextChoices):
    """The Python engine's Kafka client (consumers/engine/consumer.py). Empty: the worker's TALLY_KAFKA_CLIENT."""
    WORKER_DEFAULT = "", "the worker's default (TALLY_KAFKA_CLIENT)"
    KAFKA_PYTHON = "kafka-python", "kafka-python"
    LIBRDKAFKA = "librdkafka", "librdkafka (confluent-kafka)"


class PipelineQuerySet(models.QuerySet):
    def set_error(self, kind: PipelineError, detail: str, qualifier: str = "", **changes) -> int:
        """Leave `kind`'s error on these pipelines (with `changes` to other fields in the same UPDATE)."""
        return self.update(last_error=kind.text(detail, qualifier), **changes)

    def clear_error(self, kind: PipelineError) -> int:
        """Clear the error of these pipelines if `kind` wrote it; another writer's error stays."""
        return self.filter(last_error__startswith=f"{kind.value}").update(last_error="")

    def bump_epoch(self, **changes) -> int:
        """Start a new epoch for these pipelines, fencing every writer of the old one, with `changes` to other
        fields in the same UPDATE. Filter on what you expect (epoch, desired state) to make it a compare-and-set;
        returns how many pipelines moved on. Never `save()` a stale object instead: it writes an old epoch back."""
        return self.update(epoch=F("epoch") + 1, **changes)

    def run_taken(self, now: datetime) -> int:
        """A worker took one of the run tasks enqueued for these pipelines (filter on the task's epoch): one
        fewer waits in the queue, and the wait is over once none does. The supervisor's next attempt waits at
        least a lease from now: the run starts (a host process, a consumer) before it heartbeats, and judged
        from its enqueueing, a start slower than the lease got a second restart on top of it."""
        return self.filter(runs_waiting__gt=0).update(
            runs_waiting=F("runs_waiting") - 1,
            waiting_since=Case(When(runs_waiting__lte=1, then=None), default=F("waiting_since")),
            restart_after=_a_lease_after(now))

    def run_begun(self, now: datetime) -> int:
        """A process began one of these pipelines' runs (filter on the run's epoch): the supervisor's next
        attempt waits at least a lease from now, the run's time to heartbeat. A worker can take a run before
        it can begin it (its engine host processes still loading, older runs still leaving), and a lease
        counted from the take alone ran out before the first heartbeat on a loaded machine."""
        return self.update(restart_after=_a_lease_after(now))


def _a_lease_after(now: datetime) -> Case:
    """`restart_after` moved to a lease from `now`, never earlier than it is."""
    started_by = now + run_lease()
    return Case(When(restart_after__gt=started_by, then=F("restart_after")), default=started_by)


class Pipeline(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    topic = models.CharField(max_length=249)
    group_id = models.CharField(max_length=255, help_text="Kafka consumer group id (defaults to the name).")
    # A name, not settings: a cluster's settings and secrets live in the environment and the clusters file
    # (consumers/kafka/clusters.py), never in the database.
    cluster = models.CharField(max_length=64, default="default", validators=[validate_cluster_name],
                               help_text="The Kafka cluster the topic is on (its name in TALLY_KAFKA_CLUSTERS, "
                                         "or default).")
    sink_table = models.CharField(max_length=63)
    transform = models.CharField(max_length=200, default="int_value",
                                 help_text="A registered transform name or a dotted path to a function.")
    delivery_mode = models.CharField(max_length=20, choices=DeliveryMode.choices,
                                     default=DeliveryMode.EXACTLY_ONCE)
    engine = models.CharField(max_length=10, choices=Engine.choices, default=Engine.PYTHON)
    batch_size = models.PositiveIntegerField(default=500)
    # Engine processes the pipeline runs in at once; they split its partitions (consumers/engine/shares.py).
    parallel_runs = models.PositiveSmallIntegerField(default=1)
    reset_policy = models.CharField(max_length=10, choices=ResetPolicy.choices, default=ResetPolicy.EARLIEST)
    on_bad_record = models.CharField(max_length=20, choices=BadRecordPolicy.choices,
                                     default=BadRecordPolicy.DEAD_LETTER)
    isolation_level = models.CharField(max_length=20, choices=IsolationLevel.choices,
                                       default=IsolationLevel.READ_COMMITTED)
    on_log_truncated = models.CharField(max_length=10, choices=LogTruncatedPolicy.choices,
                                        default=LogTruncatedPolicy.STOP)
    kafka_client = models.CharField(max_length=20, choices=KafkaClient.choices, default=KafkaClient.WORKER_DEFAULT,
                                    blank=True)
    # `--transform json`: {column: source} where a column does not take the top-level field of its name
    # (consumers/engine/json_map.py). Upsert pipelines keep one row per key: written in place, deleted on a
    # tombstone when asked.
    json_map = models.JSONField(default=dict, blank=True)
    upsert_key = models.JSONField(default=list, blank=True, help_text="Columns of the key: one row per key.")
    delete_on_tombstone = models.BooleanField(default=False)
    desired_state = models.CharField(max_length=10, choices=DesiredState.choices, default=DesiredState.STOPPED)
    epoch = models.PositiveBigIntegerField(default=0)
    # Supervision: consecutive automatic restarts, when the next one may happen, and why.
    restart_attempts = models.PositiveIntegerField(default=0)
    restart_after = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    # Run tasks enqueued for the current epoch that no worker has taken yet, and since when: a pipeline
    # waits for a worker while this stays above 0 (consumers/operations/capacity.py).
    runs_waiting = models.PositiveSmallIntegerField(default=0)
    waiting_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = PipelineQuerySet.as_manager()

    class Meta:
        permissions = [("operate_pipeline", "Can start, stop, pause, resume, restart and rewind pipelines")]

    def __str__(self):
        return self.name

    def save(self, *args, **kwargs):
        if not self.group_id:
            self.group_id = self.name
        super().save(*args, **kwargs)

    def initial_position(self, mark) -> int:
        """Where a partition this pipeline never consumed starts: its log start or its high watermark, by the
        reset policy. `mark` is a partition's watermarks (consumers.kafka.admin.Watermarks)."""
        return mark.log_start if self.reset_policy == ResetPolicy.EARLIEST else mark.high

    @property
    def is_exactly_once(self) -> bool:
        return self.delivery_mode == DeliveryMode.EXACTLY_ONCE

    def waiting_for_worker(self, now: datetime | None = None) -> bool:
        """Run tasks of this epoch have waited in the queue longer than TALLY_WORKER_WAIT_SECONDS: every
        worker is full (or none is running). The page says so and the no-consumer alert says why."""
        if not self.runs_waiting or self.waiting_since is None:
            return False
        now = now or timezone.now()
        return now - self.waiting_since >= timedelta(seconds=settings.TALLY_WORKER_WAIT_SECONDS)

    @property
    def is_upsert(self) -> bool:
        """One row per key, kept current (`--upsert-key`), instead of one row per record."""
        return bool(self.upsert_key)
    def halted_run(self) -> "ConsumerRun | None":
        """The run that halted this pipeline: its latest run, if that one halted in the current epoch. An
        operator's start or restart begins a new epoch, so an older halt no longer holds the pipeline."""
        last = self.runs.order_by("-started_at", "-pk").first()
        return last if last is not None and last.state == RunState.FAILED and last.epoch == self.epoch else None

    def bump_epoch(self, **changes) -> int:
        """Start a new epoch (fencing every writer of the old one), apply `changes` in the same UPDATE, reload
        those fields and return the new epoch."""
        Pipeline.objects.filter(pk=self.pk).bump_epoch(**changes)
        self.refresh_from_db(fields=["epoch", *changes])
        return self.epoch


class PartitionOffset(models.Model):
    """The DB's position for one topic-partition: the next offset to process. Written only by commit.py
    (and by operator rewinds in one audited transaction)."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="offsets")
    partition = models.PositiveIntegerField()
    next_offset = models.BigIntegerField()
    # Set by a rewind that keeps the sink: below this offset rows may already exist, so the commit
    # protocol inserts with ON CONFLICT DO NOTHING there (idempotent replay) instead of a plain COPY.
    replay_until = models.BigIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pipeline", "partition"], name="uniq_offset_partition")]
        ordering = ["pipeline", "partition"]

    def __str__(self):
        return f"{self.pipeline}[{self.partition}] next={self.next_offset}"


class BatchLedger(models.Model):
    """One row per committed batch: [first_offset, end_offset) of one partition. Compaction
    (consumers/reconciliation/compaction.py) merges old, verified, contiguous rows of one epoch into one row that
    keeps the first row's id and sums the counts; `batches` says how many committed batches a row stands for."""

    # No index of its own: ledger_commit_idx (and ledger_range_idx) lead with the pipeline.
    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="ledger", db_index=False)
    partition = models.PositiveIntegerField()
    first_offset = models.BigIntegerField()
    end_offset = models.BigIntegerField(help_text="Exclusive: the next offset after this batch.")
    records = models.PositiveIntegerField()
    rows_written = models.PositiveIntegerField()
    dead_letters = models.PositiveIntegerField(default=0)
    epoch = models.PositiveBigIntegerField()
    # The database's clock, as every writer stamps it (the commit protocol's `now()`): compaction judges a row's age
    # by that clock, so no writer may use its own.
    committed_at = models.DateTimeField(db_default=Now())
    # Set by a rewind to its new offset: this row now covers only [first_offset, superseded_from);
    # the rest will be covered again by the batches written after the rewind.
    superseded_from = models.BigIntegerField(null=True, blank=True)
    # Why a row with no records moved the position on purpose, e.g. "skipped by retention: offsets A..B"
    # (records deleted from the log before they were read; reconciliation reports them lost before read).
    note = models.CharField(max_length=200, blank=True, default="", db_default="")
    # Compaction: how many committed batches this row stands for (1 until merged), and when the first of them
    # was committed (committed_at is the last one's). Database defaults: the commit protocol names its columns.
    batches = models.PositiveIntegerField(default=1, db_default=1)
    first_committed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["pipeline", "partition", "first_offset"], name="ledger_range_idx"),
                   models.Index(fields=["pipeline", "committed_at"], name="ledger_time_idx"),
                   # "This pipeline's rows committed since row N" (the ledger summary's fold, reconciliation's new
                   # rows): without it the walk up the primary key reads every other pipeline's rows since N too.
                   models.Index(fields=["pipeline", "id"], name="ledger_commit_idx"),
                   # "Which rows reach into [start, end)" (trace, verification of a range) without reading every
                   # row below it: a range index. Closed ranges, so a zero-width row is found too; queries add the
                   # exact bounds (consumers/reconciliation/coverage.py SPAN_OVERLAPS).
                   GistIndex("pipeline", "partition", models.Func(models.F("first_offset"), models.F("end_offset"),
                                                                  models.Value("[]"), function="int8range"),
                             name="ledger_span_idx"),
                   # Rows with a note (skipped by retention) are few; reconciliation looks for them in every range.
                   models.Index(fields=["pipeline", "partition", "first_offset"], name="ledger_note_idx",
                                condition=~models.Q(note=""))]


class LedgerSummary(models.Model):
    """What the ledger of one partition covers, folded row by row in commit order up to `upto_id`
    (consumers/reconciliation/ledger_summary.py): bounds, gaps, overlaps, rewinds, holes and batches. Pages read
    it and fold only the rows committed since, so their cost does not grow with the ledger. Reconciliation
    refreshes it; a rewind (which trims old rows) deletes it, and the next refresh folds the ledger again."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="ledger_summaries")
    partition = models.PositiveIntegerField()
    upto_id = models.BigIntegerField(default=0)
    state = models.JSONField(default=dict)
    # Where ledger compaction goes on in this partition (consumers/reconciliation/compaction.py): offsets below
    # it were looked at; a rewind, which deletes the summary, makes it look again from the start.
    compacted_to = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pipeline", "partition"], name="uniq_ledger_summary")]


class DeadLetter(models.Model):
    """A record the transform rejected, stored with the reason, in the batch's transaction."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="dead_letters")
    partition = models.PositiveIntegerField()
    offset = models.BigIntegerField()
    key = models.BinaryField(null=True)
    value = models.BinaryField(null=True)
    error = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)
    # Replays that failed again (consumers/operations/dead_letters.py): the error above is then the newest one.
    # Database defaults: the commit protocol inserts dead letters with raw SQL that names only its columns.
    replay_attempts = models.PositiveIntegerField(db_default=0)
    last_replay_at = models.DateTimeField(null=True, blank=True)
    # A discarded dead letter stays (it still accounts for its offset in reconciliation) but is not replayed.
    discarded_at = models.DateTimeField(null=True, blank=True)
    discarded_by = models.CharField(max_length=150, blank=True, db_default="")
    discard_reason = models.TextField(blank=True, db_default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pipeline", "partition", "offset"],
                                               name="uniq_dead_letter_offset")]
        ordering = ["pipeline", "partition", "offset"]
        # A pipeline's newest dead letters (its page): read from the top instead of sorting all of them.
        indexes = [models.Index(fields=["pipeline", "-created_at", "-offset"], name="dead_letter_recent_idx")]

    def __str__(self):
        return f"{self.pipeline}[{self.partition}]@{self.offset}"

    @property
    def is_discarded(self) -> bool:
        return self.discarded_at is not None


class DeadLetterReplay(models.Model):
    """The replay ledger: one row per dead letter that became sink rows (the dead letter itself is removed
    in the same transaction, so every offset keeps exactly one outcome: rows or a dead letter)."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="dead_letter_replays")
    # The removed dead letter's id: a dead letter is replayed at most once (a second replay finds it gone).
    dead_letter_id = models.BigIntegerField(unique=True)
    partition = models.PositiveIntegerField()
    offset = models.BigIntegerField()
    source = models.CharField(max_length=10, help_text="Where the record was read from: stored or kafka.")
    rows_written = models.PositiveIntegerField(help_text="0 when the sink already held the record's rows.")
    original_error = models.TextField()
    actor = models.CharField(max_length=150)
    action_log = models.ForeignKey("consumers.ActionLog", null=True, on_delete=models.SET_NULL, related_name="+")
    replayed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["pipeline", "partition", "offset"]
        indexes = [models.Index(fields=["pipeline", "partition", "offset"], name="replay_offset_idx")]


class RunState(models.TextChoices):
    STARTING = "starting", "starting"
    RUNNING = "running", "running"
    STOPPED = "stopped", "stopped"
    FENCED = "fenced", "fenced"
    CRASHED = "crashed", "crashed"
    FAILED = "failed", "failed"


LIVE_RUN_STATES = (RunState.STARTING, RunState.RUNNING)


class EndReason(models.TextChoices):
    """Why a run ended (an engine's RunResult.reason); engine/lifecycle.RUN_STATE gives the run's final state."""
    CAUGHT_UP = "caught_up", "caught up with the log"
    STOPPED = "stopped", "stopped on request"
    MAX_SECONDS = "max_seconds", "reached its time limit"
    FENCED = "fenced", "fenced by a newer epoch"
    BAD_RECORD = "bad_record", "halted on a bad record"
    SINK_ERROR = "sink_error", "halted on a sink error"
    ERROR = "error", "crashed"


def run_lease() -> timedelta:
    """How long a run stays alive after its last heartbeat. Runs heartbeat about every second."""
    return timedelta(seconds=settings.TALLY_RUN_LEASE_SECONDS)


def replaced_by_a_restart():
    """Whether a run was restarted, the rule's one text: did another run of its pipeline start after its last
    heartbeat? Asked as "is its heartbeat before its pipeline's newest other start", one probe of run_newest_idx per
    run asked about: as "is its id among the restarted runs" PostgreSQL worked out every restarted run of every
    pipeline for a page of ten, and as "is there a later run" it could scan the table for one. Never null: a run
    with no other run was not restarted."""
    newest_other_start = Subquery(
        ConsumerRun.objects.filter(pipeline=OuterRef("pipeline")).exclude(pk=OuterRef("pk"))
        .order_by("-started_at", "-id").values("started_at")[:1])
    return Coalesce(ExpressionWrapper(Q(heartbeat_at__lt=newest_other_start), output_field=models.BooleanField()),
                    False)


class ConsumerRunQuerySet(models.QuerySet):
    """The runs' vocabulary, one definition each: unended, alive, restarted, serving, halted; and one method
    per run state transition."""

    def unended(self):
        """Runs that have not ended by their own account (a killed run never says so: see alive)."""
        return self.filter(state__in=LIVE_RUN_STATES)

    def alive(self, now: datetime):
        """Runs that have not ended and heartbeat within the lease."""
        return self.unended().filter(heartbeat_at__gte=now - run_lease())

    def serving(self, now: datetime):
        """Runs that consume for their pipeline now: alive and not replaced by a restart. What the pages, the
        API and reconciliation call live."""
        return self.alive(now).not_restarted()

    def halted(self):
        """Runs that stopped on something a restart cannot cure (lifecycle.HALT_REASONS end a run FAILED):
        the supervisor leaves their pipeline to an operator."""
        return self.filter(state=RunState.FAILED)

    def with_liveness(self, now: datetime):
        """Each run annotated for `ConsumerRun.liveness`: whether it is serving (the rule above, per row) and
        whether a restart replaced it (replaced_by_a_restart: one index probe per run shown). The serving runs are
        few, whatever the history."""
        return self.annotate(
            is_serving=Exists(ConsumerRun.objects.filter(pk=OuterRef("pk")).serving(now)),
            is_restarted=replaced_by_a_restart())

    def restarted(self):
        """Runs that a later run of their pipeline replaced (see not_restarted)."""
        return self.filter(replaced_by_a_restart())

    def not_restarted(self):
        """Drop runs that a later run of their pipeline replaced: a SIGKILLed run keeps "running" and a recent
        heartbeat until its lease expires, but a run started after that heartbeat (its restart) proves it gone.
        A run is never its own restart: hosts' clocks differ, so its start may read later than its heartbeat.
        Only for "does a consumer serve this pipeline": a waiter for older runs to leave must not use it."""
        return self.filter(~replaced_by_a_restart())

    def heartbeat(self, now: datetime, **progress) -> int:
        """A run is still here: its heartbeat and progress (records_processed, assigned_partitions)."""
        return self.update(heartbeat_at=now, **progress)

    def mark_running(self, now: datetime) -> int:
        return self.update(state=RunState.RUNNING, heartbeat_at=now)

    def end(self, state: str, reason: str, now: datetime, **progress) -> int:
        """A run ended on its own: stopped, fenced, crashed or failed, and why."""
        return self.update(state=state, end_reason=error_text(reason), ended_at=now, heartbeat_at=now, **progress)

    def declare_crashed(self, reason: str, now: datetime) -> int:
        """Someone else found the run dead (its lease expired or its process is gone)."""
        return self.unended().update(state=RunState.CRASHED, ended_at=now, end_reason=error_text(reason))


class ConsumerRun(models.Model):
    """Who runs a pipeline: one row per engine process (or Celery task) and epoch."""

    objects = ConsumerRunQuerySet.as_manager()

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="runs")
    epoch = models.PositiveBigIntegerField()
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    task_id = models.CharField(max_length=255, blank=True, default="")
    engine = models.CharField(max_length=10, choices=Engine.choices, default=Engine.PYTHON)
    state = models.CharField(max_length=10, choices=RunState.choices, default=RunState.STARTING)
    assigned_partitions = models.JSONField(default=list)   # what the run reads, positioned (its heartbeat)
    # What the run has claimed among its peers (consumers/engine/shares.py `claim`): written before it reads a
    # partition and after it gave one up, so two runs never read one partition at once.
    claimed_partitions = models.JSONField(default=list)
    records_processed = models.PositiveBigIntegerField(default=0)
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.TextField(blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["pipeline", "state"], name="run_state_idx"),
                   # A pipeline's runs newest first: its page's recent runs, and retention's "is this its pipeline's
                   # newest run?" per candidate, without sorting a long history of runs each time.
                   models.Index(fields=["pipeline", "-started_at", "-id"], name="run_newest_idx"),
                   # Every pipeline's runs newest first: the admin's runs list, a page of them.
                   models.Index(fields=["-started_at", "-id"], name="run_started_idx")]
        ordering = ["-started_at"]

    @property
    def liveness(self) -> "Liveness":
        """What the runs table and the API show (needs `with_liveness(now)`): live while serving; a run that
        never said it ended but is not serving is dead since its last heartbeat, killed or lost; else how it
        ended. A killed run never reads "running"."""
        if self.is_serving:
            return Liveness("live", self.state, None, "")
        if self.state in LIVE_RUN_STATES:
            reason = ("a later run replaced it (a restart)" if self.is_restarted
                      else f"no heartbeat within the {settings.TALLY_RUN_LEASE_SECONDS} s lease (killed or lost)")
            return Liveness("dead", "dead", self.heartbeat_at, reason)
        return Liveness("ended", self.state, self.ended_at, self.end_reason)


@dataclass(frozen=True)
class Liveness:
    kind: str                 # "live", "dead" (never said it ended) or "ended"
    label: str                # what a table shows: the live run's state, "dead", or how it ended
    since: datetime | None    # dead: its last heartbeat; ended: when
    reason: str

    def as_json(self) -> dict:
        return {"live": self.kind == "live", "liveness": self.label,
                "since": self.since.isoformat() if self.since else None, "reason": self.reason or None}
