"""The Spark engine in this process: it starts from PostgreSQL's positions, writes every record once
through the commit protocol, keeps Kafka's copy of the offsets, and ends when fenced by a newer epoch."""
import threading
import time

import pytest
from django.db import connection, connections

from consumers.engine import commit, db, runs, sinks
from consumers.engine.faults import FaultInjector
from consumers.engine.spark import run_pipeline
from consumers.engine.spark_session import get_spark
from consumers.engine.transforms import SourceRecord, resolve
from consumers.kafka import admin as kafka_admin
from consumers.models import (
    BatchLedger,
    ConsumerRun,
    DeliveryMode,
    DesiredState,
    Engine,
    PartitionOffset,
    Pipeline,
    RunState,
)
from tests.producing import send
from tests.spark_helpers import expected_rows, produce_values, sink_rows, spark_pipelines
from tests.waiting import patience, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture
def spark_pipeline(transactional_db, kafka_bootstrap, make_topic):
    get_spark()  # started before the timed part of each test
    with spark_pipelines() as spark_pipeline_on:
        def make(name, partitions=3, mode=DeliveryMode.EXACTLY_ONCE):
            return spark_pipeline_on(name, make_topic(name, partitions=partitions), mode)

        yield make


def test_it_writes_every_record_exactly_once_from_the_database_positions(spark_pipeline, kafka_bootstrap):
    pipeline = spark_pipeline("spark-once", partitions=3)
    log = produce_values(kafka_bootstrap, pipeline.topic, 700, partitions=2)  # partition 2 stays empty
    # A previous run already committed partition 0 up to offset 40: the engine must start there.
    conn = db.connect()
    with connection.cursor() as cur:
        sinks.ensure_sink_table(cur, pipeline.sink_table, resolve("int_value"), True)
    commit.ensure_positions(conn, pipeline.pk, {0: 0, 1: 0, 2: 0})
    commit.commit_batch(conn, commit.Target.for_pipeline(pipeline), 1,
                        {0: [SourceRecord(0, o, None, str(log[0][o]).encode()) for o in range(40)]})
    conn.close()

    result = run_pipeline(pipeline.name, batch_size=150, stop_when_caught_up=True, max_seconds=120)

    assert result.reason == "caught_up", result.detail
    assert (result.records, result.skipped) == (700 - 40, 0)
    assert sink_rows(pipeline.sink_table) == expected_rows(log)
    highs = {0: 350, 1: 350, 2: 0}
    assert dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset")) == highs
    assert kafka_admin.committed_offsets(pipeline.group_id, pipeline.topic, [0, 1]) == {0: 350, 1: 350}
    for partition in (0, 1):
        ranges = list(BatchLedger.objects.filter(pipeline=pipeline, partition=partition)
                      .order_by("first_offset").values_list("first_offset", "end_offset"))
        assert ranges[0][0] == 0 and ranges[-1][1] == 350
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # no gap, no overlap
    run = ConsumerRun.objects.get(pipeline=pipeline)
    assert (run.engine, run.state, run.records_processed) == (Engine.SPARK, RunState.STOPPED, 660)


def test_a_newer_epoch_fences_the_run_and_nothing_of_the_old_epoch_lands_after_it(spark_pipeline, kafka_bootstrap):
    pipeline = spark_pipeline("spark-fenced", partitions=1)
    produce_values(kafka_bootstrap, pipeline.topic, 3000, partitions=1)
    outcome = {}

    def run():
        try:
            outcome["result"] = run_pipeline(pipeline.name, batch_size=50, delay_ms=2, max_seconds=90)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + patience(60)
    while not BatchLedger.objects.filter(pipeline=pipeline).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    new_epoch = pipeline.bump_epoch()
    thread.join(timeout=patience(60))
    assert not thread.is_alive()
    result = outcome["result"]
    assert result.reason == "fenced"
    assert not BatchLedger.objects.filter(pipeline=pipeline, epoch=new_epoch).exists()
    assert BatchLedger.objects.filter(pipeline=pipeline).count() >= 1
    written = PartitionOffset.objects.get(pipeline=pipeline).next_offset
    assert 0 < written < 3000 and len(sink_rows(pipeline.sink_table)) == written
    run = ConsumerRun.objects.get(pipeline=pipeline)
    # Why, as a Python-engine run says it: the newer epoch it saw, or the commit it was refused.
    assert run.state == RunState.FENCED and run.end_reason.startswith("fenced: ") and "epoch" in run.end_reason


def test_at_least_once_resumes_from_kafkas_committed_offset(spark_pipeline, kafka_bootstrap):
    pipeline = spark_pipeline("spark-alo", partitions=2, mode=DeliveryMode.AT_LEAST_ONCE)
    log = produce_values(kafka_bootstrap, pipeline.topic, 200, partitions=2)
    kafka_admin.commit_offsets(pipeline.group_id, pipeline.topic, {0: 60, 1: 0})

    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=120)

    assert result.reason == "caught_up", result.detail
    assert sink_rows(pipeline.sink_table) == [r for r in expected_rows(log) if not (r[0] == 0 and r[1] < 60)]
    assert kafka_admin.committed_offsets(pipeline.group_id, pipeline.topic, [0, 1]) == {0: 100, 1: 100}


def test_poison_values_become_dead_letters_and_the_spark_run_goes_on_to_the_end(spark_pipeline, kafka_bootstrap):

    from consumers.models import DeadLetter

    pipeline = spark_pipeline("spark-poison", partitions=1)
    with connection.cursor() as cur:
        sinks.ensure_sink_table(cur, pipeline.sink_table, resolve("int_value"), True)
    values = [str(v).encode() if v % 4 else b"99999999999999999999" for v in range(1, 41)]
    send(pipeline.topic, [(0, None, value) for value in values])

    result = run_pipeline(pipeline.name, batch_size=15, stop_when_caught_up=True, max_seconds=120)

    assert result.reason == "caught_up", result.detail
    assert [row[2] for row in sink_rows(pipeline.sink_table)] == [v for v in range(1, 41) if v % 4]
    letters = list(DeadLetter.objects.filter(pipeline=pipeline).order_by("offset"))
    assert [d.offset for d in letters] == [v - 1 for v in range(4, 41, 4)]
    assert all(d.error.startswith("database refused: 22003") for d in letters)
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 40


def test_a_stopped_run_says_why_it_was_stopped_as_a_python_engine_run_does(spark_pipeline, kafka_bootstrap):
    pipeline = spark_pipeline("spark-stopped", partitions=1)
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.RUNNING)
    produce_values(kafka_bootstrap, pipeline.topic, 20, partitions=1)
    outcome = {}

    def run():
        try:
            outcome["result"] = runs.run_here(pipeline.pk, pipeline.epoch, key="spark-stopped")
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for(lambda: PartitionOffset.objects.filter(pipeline=pipeline, next_offset=20).exists(), 120,
                 "the run to commit the records")
    finally:
        # A warm shutdown stops a worker's Spark runs this way (runs.stop_all_runs).
        runs.stop_run("spark-stopped", "worker shutting down (SIGTERM)")
        thread.join(timeout=patience(60))
    assert not thread.is_alive()
    assert outcome["result"]["reason"] == "stopped"
    assert outcome["result"]["detail"] == "worker shutting down (SIGTERM)"
    run = ConsumerRun.objects.get(pipeline=pipeline)
    assert (run.state, run.end_reason) == (RunState.STOPPED, "stopped: worker shutting down (SIGTERM)")


def test_a_micro_batch_stuck_on_the_executors_ends_the_run_and_the_next_run_writes_every_record_once(
        spark_pipeline, kafka_bootstrap, settings):
    # The worker committing the first slice stops (SIGSTOP: a hung process) in the middle of its write. Its batch
    # then never finished, while the driver heartbeat on: the run stayed live, the pipeline stopped moving, and the
    # supervisor never restarted it. Past TALLY_RUN_STALL_SECONDS the run ends as stuck, its query stopped.
    settings.TALLY_ENGINE_IDLE_TRANSACTION_SECONDS = 2
    settings.TALLY_RUN_STALL_SECONDS = 5   # the stuck batch is the run's first: no slow batch comes before it
    pipeline = spark_pipeline("spark-stuck", partitions=1)
    log = produce_values(kafka_bootstrap, pipeline.topic, 200, partitions=1)

    stuck = run_pipeline(pipeline.name, batch_size=50, max_seconds=patience(180),
                         faults=FaultInjector.parse("mid-write@1/stop", in_worker=True))

    assert stuck.reason == "error" and "a micro-batch has not finished on the executors" in stuck.detail, stuck
    assert sink_rows(pipeline.sink_table) == []
    settings.TALLY_RUN_STALL_SECONDS = 0
    Pipeline.objects.filter(pk=pipeline.pk).update(epoch=pipeline.epoch + 1)   # the supervisor's restart
    again = run_pipeline(pipeline.name, batch_size=50, stop_when_caught_up=True, max_seconds=patience(120))
    assert again.reason == "caught_up", again.detail
    assert sink_rows(pipeline.sink_table) == expected_rows(log)
