"""The classic example (a blog post's experiment): topic `nums` holds "1".."100", a consumer polls 10
records at a time and is killed now and then. Committing to Kafka before writing ends with fewer than 100
rows (the post: 91); writing before committing ends with duplicates; Tally's exactly-once pipeline ends
with every value exactly once.

`seed_demo` creates the topic and one pipeline per delivery mode; `run_classic_demo` runs them all at once
with their seeded crashes (consumers/demo/runner.py: kafka-python pipelines as processes that kill
themselves and are started again, the Spark pipeline on this process's warm driver, losing executor
workers), and reads the sinks row by row.

--reset: the embedded broker cannot delete records, so the topic is deleted and created again (its
offsets start at 0 again) and the demo's consumer groups are deleted (a group Kafka keeps gets its offsets
set to the new topic's start); the demo pipelines keep their rows and history (action log, alerts, past
runs) and lose their state (offsets, ledger, dead letters, health, sink rows); a running one is stopped
through the audited stop action. A reset the broker refuses changes nothing (`_reset`).
"""
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError
from psycopg2 import sql

from consumers import waiting
from consumers.demo.runner import DemoRunner
from consumers.demo.schedule import MAX_SEED, crash_schedule
from consumers.engine import db, sinks
from consumers.engine.transforms import resolve
from consumers.kafka import admin as kafka_admin
from consumers.kafka import clusters
from consumers.models import (
    BatchLedger,
    ConsumerRun,
    DeadLetter,
    DeliveryMode,
    DesiredState,
    Engine,
    LedgerSummary,
    PartitionHealth,
    PartitionOffset,
    Pipeline,
    PipelineHealth,
    RunState,
)
from consumers.operations import pipeline_setup

log = logging.getLogger("tally.demo")

DEMO_TOPIC = "nums"
DEMO_BATCH_SIZE = 10            # the blog post's max_poll_records
TOPIC_TIMEOUT_S = 15.0
# A topic delete is asked again this often until it shows, for at most TOPIC_DELETE_TIMEOUT_S: a broker short of
# CPU can drop it, and a client still reading the topic brings it back at once (auto-creation).
TOPIC_DELETE_RETRY_S = 5.0
TOPIC_DELETE_TIMEOUT_S = 60.0
RECREATED_TOPIC_ATTEMPTS = 3
RESET_ACTOR = "demo-reset"


# Where a consumer can be killed at random, like the blog post's consumer restarted by hand: the points
# a batch passes in its mode, in order (consumers/engine/faults.py). The classic modes lose or duplicate
# only where their lesson is (the schedule's classic crash is there); elsewhere a restart costs nothing.
# At-least-once leaves out after-poll: there the writer thread may still hold the previous batch between
# its database and Kafka commits, so what the crash did would depend on timing, not on the seed.
AT_MOST_ONCE_POINTS = ("after-poll", "after-kafka-commit", "mid-write", "after-write", "after-db-commit")
AT_LEAST_ONCE_POINTS = ("mid-write", "after-write", "after-db-commit")
# Every point an exactly-once batch passes (it never commits to Kafka before writing).
EXACTLY_ONCE_POINTS = ("after-poll", "mid-write", "after-write", "after-db-commit")


class DemoError(RuntimeError):
    pass


class TopicShapeError(DemoError):
    """The topic exists with another partition count than asked for."""


@dataclass(frozen=True)
class DemoPipeline:
    name: str                     # also the consumer group id
    delivery_mode: str
    sink_table: str
    crash_points: tuple[str, ...]  # where run_classic_demo kills this pipeline's process
    engine: str = Engine.PYTHON
    command: str = "run_pipeline"  # the management command that runs it (same options as run_pipeline)


# Add a pipeline here and seed_demo / run_classic_demo pick it up.
DEMO_PIPELINES: list[DemoPipeline] = [
    DemoPipeline("nums-at-most-once", DeliveryMode.AT_MOST_ONCE, "demo_nums_at_most_once", AT_MOST_ONCE_POINTS),
    DemoPipeline("nums-at-least-once", DeliveryMode.AT_LEAST_ONCE, "demo_nums_at_least_once", AT_LEAST_ONCE_POINTS),
    DemoPipeline("nums-exactly-once", DeliveryMode.EXACTLY_ONCE, "demo_nums_exactly_once", EXACTLY_ONCE_POINTS),
    DemoPipeline("nums-spark-exactly-once", DeliveryMode.EXACTLY_ONCE, "demo_nums_spark_exactly_once",
                 EXACTLY_ONCE_POINTS,
                 engine=Engine.SPARK, command="run_spark_pipeline"),
]


# --- seeding ---------------------------------------------------------------------------------------
# A demo's size: Kafka takes at most 2**31 - 1 partitions in a request, and the demo produces every record itself.
MAX_RECORDS = 10_000_000
MAX_PARTITIONS = 1000


def seed_demo(records: int = 100, partitions: int = 1, reset: bool = False) -> dict:
    """Create topic `nums` with "1".."records" (spread round-robin over the partitions) and the demo
    pipelines. Safe to re-run; `reset` starts over (see the module docstring)."""
    if not 1 <= records <= MAX_RECORDS or not 1 <= partitions <= MAX_PARTITIONS:
        raise DemoError(f"records must be from 1 to {MAX_RECORDS:,} and partitions from 1 to {MAX_PARTITIONS} "
                        f"(got {records} and {partitions}).")
    notes, kept_groups = _reset() if reset else ([], {})
    if reset:
        produced = _ensure_new_topic(records, partitions, notes)
    else:
        produced = _ensure_topic(records, partitions)
    notes += _rewind_kept_groups(kept_groups)
    pipelines = [_ensure_pipeline(demo) for demo in DEMO_PIPELINES]
    return {"topic": DEMO_TOPIC, "records": records, "partitions": partitions, "produced": produced,
            "pipelines": [p.name for p in pipelines], "notes": notes}


def _ensure_pipeline(demo: DemoPipeline) -> Pipeline:
    """The demo pipeline, created the way every pipeline is (validated, audited as the "demo" actor) the first
    time, at the blog post's batch size; later, its sink table made again if it was dropped."""
    pipeline = Pipeline.objects.filter(name=demo.name).first()
    if pipeline is None:
        spec = pipeline_setup.PipelineSpec(
            name=demo.name, topic=DEMO_TOPIC, sink_table=demo.sink_table, mode=DeliveryMode(demo.delivery_mode).label,
            transform="int_value", group=demo.name, engine=demo.engine, create_table=True)
        pipeline = pipeline_setup.create(spec, actor="demo")
        Pipeline.objects.filter(pk=pipeline.pk).update(batch_size=DEMO_BATCH_SIZE)
        pipeline.refresh_from_db()
        return pipeline
    with connection.cursor() as cursor:
        sinks.ensure_sink_table(cursor, pipeline.sink_table, resolve(pipeline.transform), pipeline.is_exactly_once)
    return pipeline


def _reset() -> tuple[list[str], dict[str, str]]:
    """Start the demo pipelines over, keeping their history. In this order, so that a failure leaves a state
    a re-run repairs and says so:
      1. the topic: if the broker refuses to delete it (or cannot be reached), nothing has changed and
         DemoError says why (the consumer groups too are untouched: the classic pipelines resume from them);
      2. the database, in one transaction: the pipeline rows stay (so do their action log and alerts, which
         point at them); a running one is stopped through the audited stop action, the others get a new
         epoch, which fences any writer still alive; positions, ledger, dead letters, health and the sink
         tables go; unfinished runs are marked ended. If it fails, DemoError asks for a re-run;
      3. the consumer groups: their committed offsets, and any membership a killed engine left behind (on
         the embedded broker such a group can stay stuck in a rebalance).
    Returns what it did, to tell the user, and {group: error} for the groups Kafka did not delete."""
    from consumers.operations import actions

    names = [demo.name for demo in DEMO_PIPELINES]
    try:
        with kafka_admin.admin_session() as admin:
            _delete_topic(admin)
    except Exception as exc:  # the broker refused or is unreachable: stop before touching anything else
        raise DemoError(f"Could not delete topic {DEMO_TOPIC!r} ({type(exc).__name__}: {exc}); "
                        f"nothing was reset.") from exc
    notes = []
    try:
        with transaction.atomic():
            for pipeline in Pipeline.objects.filter(name__in=names):
                if pipeline.desired_state != DesiredState.STOPPED:
                    entry = actions.stop(pipeline, actor=RESET_ACTOR)
                    notes.append(f"{pipeline.name} was {pipeline.desired_state}: stopped through the stop action "
                                 f"(action log entry {entry.pk}).")
                else:
                    pipeline.bump_epoch()
                PartitionOffset.objects.filter(pipeline=pipeline).delete()
                BatchLedger.objects.filter(pipeline=pipeline).delete()
                LedgerSummary.objects.filter(pipeline=pipeline).delete()
                DeadLetter.objects.filter(pipeline=pipeline).delete()
                PartitionHealth.objects.filter(pipeline=pipeline).delete()
                PipelineHealth.objects.filter(pipeline=pipeline).delete()
                ConsumerRun.objects.filter(pipeline=pipeline, ended_at__isnull=True).update(
                    state=RunState.STOPPED, ended_at=timezone.now(), end_reason="demo reset")
            with connection.cursor() as cursor:
                for demo in DEMO_PIPELINES:
                    sinks.drop_sink_table(cursor, demo.sink_table)
    except Exception as exc:
        raise DemoError(f"Topic {DEMO_TOPIC!r} was deleted but the database could not be reset "
                        f"({type(exc).__name__}: {exc}); nothing else changed: run seed_demo --reset again.") from exc
    kept = {g: e for g, e in kafka_admin.delete_groups(names).items() if e != "OK"}
    if kept:
        log.warning("Could not delete demo consumer groups: %s", kept)
    return notes, kept


def _ensure_new_topic(records: int, partitions: int, notes: list[str]) -> int:
    """After the reset deleted the topic: create it anew, also when a client brings the old one back
    (see _replace_recreated_topic) between that check and the creation."""
    for attempt in range(RECREATED_TOPIC_ATTEMPTS):
        notes += _replace_recreated_topic(partitions)
        try:
            return _ensure_topic(records, partitions)
        except TopicShapeError:
            if attempt + 1 == RECREATED_TOPIC_ATTEMPTS:
                raise
    raise AssertionError("RECREATED_TOPIC_ATTEMPTS must be at least 1")


def _replace_recreated_topic(partitions: int, attempts: int = RECREATED_TOPIC_ATTEMPTS) -> list[str]:
    """Right after the reset deleted the topic, a client still reading it (a consumer of an older run, a
    producer) can bring it back: brokers with topic auto-creation on (real Kafka's default; the embedded
    broker always) create it with their default partition count. Such a topic is not the demo's: delete it
    again, a few times, and say so. Returns the notes."""
    notes = []
    for _ in range(attempts):
        with kafka_admin.admin_session() as admin:
            if DEMO_TOPIC not in admin.list_topics():
                return notes
            existing = _try(kafka_admin.partitions_for, DEMO_TOPIC) or []
            if len(existing) == partitions:
                return notes   # created by a concurrent seed_demo with the same shape: _ensure_topic checks it
            notes.append(f"Topic {DEMO_TOPIC!r} came back with {len(existing)} partitions right after the reset "
                         "deleted it (a client still reading it, and broker auto-creation): deleted it again.")
            log.warning(notes[-1])
            _delete_topic(admin)
    return notes


def _rewind_kept_groups(kept: dict[str, str]) -> list[str]:
    """Groups Kafka did not delete may hold offsets of the old topic, which the classic pipelines would resume
    from: set them to the new topic's start. Returns a note per group."""
    notes = []
    for group, error in kept.items():
        try:
            starts = {p: mark.log_start for p, mark in kafka_admin.watermarks(DEMO_TOPIC).items()}
            kafka_admin.commit_offsets(group, DEMO_TOPIC, starts)
        except Exception as exc:  # told to the user: the reset itself is done
            notes.append(f"Consumer group {group} could not be deleted ({error}) nor moved to the new topic's "
                         f"start ({type(exc).__name__}: {exc}): its pipeline may resume from an old offset. Run "
                         "seed_demo --reset again once nothing runs.")
        else:
            notes.append(f"Consumer group {group} could not be deleted ({error}); its offsets were set to the "
                         "new topic's start.")
    return notes


def _ensure_topic(records: int, partitions: int) -> int:
    """Create and fill the topic if needed; returns the number of records produced now."""
    with kafka_admin.admin_session() as admin:
        if DEMO_TOPIC not in admin.list_topics():
            def create():
                try:
                    admin.create_topics([NewTopic(DEMO_TOPIC, partitions, 1)])
                except TopicAlreadyExistsError:
                    pass   # real Kafka deletes topics asynchronously; created by now or soon
                return True
            _wait_until(create, "the topic to be created")
    existing = _wait_until(lambda: _try(kafka_admin.partitions_for, DEMO_TOPIC), "the topic's metadata")
    if len(existing) != partitions:
        raise TopicShapeError(f"Topic {DEMO_TOPIC!r} has {len(existing)} partitions, not {partitions}: "
                        f"run seed_demo --reset to start over.")
    held = sum(w.high - w.log_start for w in kafka_admin.watermarks(DEMO_TOPIC).values())
    if held == records:
        return 0
    if held:
        raise DemoError(f"Topic {DEMO_TOPIC!r} holds {held} records, not {records}: run seed_demo --reset "
                        f"to start over.")
    _produce(records, partitions)
    _forget_old_group_offsets(partitions)
    return records


def _produce(records: int, partitions: int) -> None:
    producer = clusters.producer(None, acks="all", linger_ms=5)
    try:
        _wait_until(lambda: len(producer.partitions_for(DEMO_TOPIC) or ()) == partitions, "producer metadata")
        for value in range(1, records + 1):
            producer.send(DEMO_TOPIC, str(value).encode(), partition=(value - 1) % partitions)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)


def _forget_old_group_offsets(partitions: int) -> None:
    """A recreated topic starts at offset 0 again; Kafka offsets a demo group committed for the old one
    would make the classic modes skip records (the embedded broker drops them with the topic)."""
    for demo in DEMO_PIPELINES:
        committed = kafka_admin.committed_offsets(demo.name, DEMO_TOPIC, list(range(partitions)))
        if any(offset for offset in committed.values()):
            kafka_admin.commit_offsets(demo.name, DEMO_TOPIC, {p: 0 for p in range(partitions)})


def _try(function, *args):
    try:
        return function(*args)
    except (kafka_admin.KafkaAdminError, UnknownTopicOrPartitionError):
        return None


def _delete_topic(admin) -> None:
    """Delete the demo topic and wait until the broker no longer lists it, asking again every
    TOPIC_DELETE_RETRY_S while it is still (or again) there. DemoError after TOPIC_DELETE_TIMEOUT_S."""
    deadline = time.monotonic() + TOPIC_DELETE_TIMEOUT_S
    while DEMO_TOPIC in admin.list_topics():
        if time.monotonic() >= deadline:
            raise DemoError(f"Timed out after {TOPIC_DELETE_TIMEOUT_S:.0f} s waiting for the old topic to disappear.")
        try:
            admin.delete_topics([DEMO_TOPIC], timeout_ms=int(TOPIC_TIMEOUT_S * 1000))
        except UnknownTopicOrPartitionError:   # gone since the look above
            return
        remaining = max(deadline - time.monotonic(), 0.0)
        if waiting.wait_until(lambda: DEMO_TOPIC not in admin.list_topics(), min(TOPIC_DELETE_RETRY_S, remaining)):
            return


def _wait_until(check: Callable, what: str, timeout_s: float = TOPIC_TIMEOUT_S):
    result = waiting.wait_until(check, timeout_s)
    if not result:
        raise DemoError(f"Timed out after {timeout_s:.0f} s waiting for {what}.")
    return result


# --- the run with crashes --------------------------------------------------------------------------
def new_seed() -> int:
    return secrets.randbelow(MAX_SEED) + 1


def run_classic_demo(records: int = 100, crash_probability: float = 0.2, max_restarts: int = 30,
                     progress: Callable[[dict], None] | None = None, *, seed: int | None = None,
                     partitions: int = 1, timeout_s: float = 600.0,
                     pipelines: list[str] | None = None, spark_kills_workers: bool = True) -> dict:
    """Seed from scratch, then run every demo pipeline, killed (SIGKILL) where its crash schedule says
    (consumers/demo/schedule.py: one classic crash per pipeline, plus crashes with `crash_probability` per
    batch, at most `max_restarts`, all drawn from `seed`) and started again after each crash until it
    ends cleanly: kafka-python pipelines as processes that kill themselves, the Spark pipeline on this
    process's driver, whose committing executor workers are killed (consumers/demo/runner.py). All
    pipelines run at once; `timeout_s` bounds the whole run. `progress(status)` gets the per-pipeline
    status whenever it changes; a pipeline's counts are in it as soon as it is done. `pipelines` limits
    the run to these demo pipelines (default: all). `spark_kills_workers=False` runs the Spark pipeline
    as processes killed at the driver instead (to measure what a JVM start per crash costs).

    Returns {pipeline name: {delivery_mode, state, restarts, crashes (the schedule), rows, distinct,
    missing (sorted list), duplicated ({value: count}), timeline, error}}; state is done, interrupted (stopped
    before it caught up, e.g. by a SIGTERM: rows, distinct and duplicated, no missing), failed or timed_out."""
    if not 0.0 <= crash_probability <= 1.0:
        raise DemoError("crash_probability must be within [0, 1].")
    if max_restarts < 1:
        raise DemoError("max_restarts must be at least 1: the classic crash is the lesson.")
    seed = new_seed() if seed is None else seed
    if not 0 <= seed <= MAX_SEED:
        raise DemoError(f"seed must be within 0..{MAX_SEED}.")
    selected = [demo for demo in DEMO_PIPELINES if pipelines is None or demo.name in pipelines]
    unknown = set(pipelines or ()) - {demo.name for demo in selected}
    if unknown:
        raise DemoError(f"Not demo pipelines: {', '.join(sorted(unknown))}.")
    schedules = {demo.name: crash_schedule(seed, demo.name, demo.delivery_mode, demo.crash_points,
                                           crash_probability, records, DEMO_BATCH_SIZE, max_restarts)
                 for demo in selected}
    started = time.monotonic()
    seed_demo(records=records, partitions=partitions, reset=True)
    seeded_s = time.monotonic() - started
    runner = DemoRunner(selected, schedules, DEMO_BATCH_SIZE, lambda table: count_sink(table, records), progress,
                        spark_kills_workers)
    status = runner.run(timeout_s)
    for demo in selected:
        status[demo.name]["seed_s"] = round(seeded_s, 2)
    if progress:
        progress(status)
    return status


def sink_counts(table: str) -> dict[int, int]:
    """How many rows of a demo sink hold each value ({} while the table does not exist yet). `table` is
    one of DEMO_PIPELINES' sink tables, never a name from a request."""
    conn = db.connect("tally-demo")
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT to_regclass(%s)", [table])
            if cursor.fetchone()[0] is None:
                return {}
            cursor.execute(sql.SQL("SELECT id, count(*) FROM {} GROUP BY id").format(sql.Identifier(table)))
            return dict(cursor.fetchall())
    finally:
        conn.rollback()
        conn.close()


def count_sink(table: str, records: int) -> dict:
    """Row-by-row view of a demo sink: which of 1..records are missing, which are there more than once."""
    return summarize_counts(sink_counts(table), records)


def summarize_counts(counts: dict[int, int], records: int) -> dict:
    return {"rows": sum(counts.values()), "distinct": len(counts),
            "missing": [v for v in range(1, records + 1) if v not in counts],
            "duplicated": {v: c for v, c in sorted(counts.items()) if c > 1}}
