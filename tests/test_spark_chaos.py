"""Chaos for the Spark engine: the driver process (`manage.py run_spark_pipeline`) is killed with SIGKILL at
random moments, at least five times, and restarted; after catching up, every record is in the sink exactly
once, row by row, and the ledger tiles every partition without gap or overlap."""
import os
import random
import signal
import time

import pytest
from django.db import connection

from consumers.engine import sinks
from consumers.engine.spark_session import stop_spark
from consumers.models import BatchLedger, DeliveryMode, Engine, PartitionOffset, Pipeline
from tests.conftest import ROOT, stop_process_group
from tests.spark_drivers import log_size, read_log, start_driver, wait_for_a_commit
from tests.spark_helpers import expected_rows, produce_values, sink_rows
from tests.waiting import patience

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.chaos]

KILLS = 5
RECORDS = 1500


def committed_batches(pipeline) -> int:
    return BatchLedger.objects.filter(pipeline=pipeline).count()


@pytest.fixture
def chaos_pipeline(transactional_db, kafka_bootstrap, make_topic):
    # Each engine process starts its own JVM: end this process's, so only one Spark JVM runs at a time.
    stop_spark(shutdown_jvm=True)
    topic = make_topic("chaos", partitions=3)
    pipeline = Pipeline.objects.create(name="spark-chaos", topic=topic, sink_table="spark_chaos_sink",
                                       delivery_mode=DeliveryMode.EXACTLY_ONCE, engine=Engine.SPARK, epoch=1)
    yield pipeline
    with connection.cursor() as cur:
        sinks.drop_sink_table(cur, pipeline.sink_table)


@pytest.mark.spark_processes
@pytest.mark.timeout(2400)  # six engine processes, each starting its own JVM
def test_killing_the_driver_at_random_moments_loses_and_duplicates_nothing(chaos_pipeline, kafka_bootstrap,
                                                                           subprocess_env):
    pipeline = chaos_pipeline
    log = produce_values(kafka_bootstrap, pipeline.topic, RECORDS, partitions=3)
    log_path = ROOT / "var" / f"spark-chaos-{pipeline.name}.log"
    rng = random.Random()
    kills = 0
    for _ in range(KILLS):
        before = committed_batches(pipeline)
        since = log_size(log_path)
        # Small micro-batches with a little work per record: many transactions to be killed in.
        engine = start_driver(subprocess_env, log_path, pipeline.name, "--batch-size", "90", "--delay-ms", "2")
        try:
            # Wait until this run commits something, then kill it a random moment later: before, inside or
            # after a batch's transaction.
            wait_for_a_commit(engine, log_path, since, pipeline, before)
            time.sleep(rng.uniform(0.0, 1.5))
            os.kill(engine.pid, signal.SIGKILL)  # the driver: no cleanup, no finally, no commit
            kills += 1
        finally:
            stop_process_group(engine, timeout=10)  # and its JVM, before the next run starts another
    assert kills >= 5
    assert PartitionOffset.objects.filter(pipeline=pipeline).exists()
    assert sum(PartitionOffset.objects.filter(pipeline=pipeline).values_list("next_offset", flat=True)) < RECORDS

    # The run's own time limit counts its JVM's start too: it scales with patience, as every hang guard.
    final = start_driver(subprocess_env, log_path, pipeline.name, "--stop-when-caught-up",
                         "--max-seconds", f"{patience(100):.0f}")
    try:
        assert final.wait(timeout=patience(240)) == 0, read_log(log_path)[-3000:]
    finally:
        stop_process_group(final)

    assert sink_rows(pipeline.sink_table) == expected_rows(log)
    for partition, values in log.items():
        ranges = list(BatchLedger.objects.filter(pipeline=pipeline, partition=partition)
                      .order_by("first_offset").values_list("first_offset", "end_offset"))
        assert ranges[0][0] == 0 and ranges[-1][1] == len(values)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))


@pytest.fixture
def demo_sinks(transactional_db, kafka_bootstrap):
    from consumers.demo.classic import DEMO_PIPELINES

    yield   # the demo runs its Spark pipeline on this process's session (consumers/demo/runner.py)
    with connection.cursor() as cur:
        for demo in DEMO_PIPELINES:
            sinks.drop_sink_table(cur, demo.sink_table)


@pytest.mark.timeout(900)
def test_the_demos_spark_pipeline_crashes_restarts_and_ends_with_every_value_once(demo_sinks, settings):
    from consumers.demo.classic import run_classic_demo

    settings.KAFKA_SESSION_TIMEOUT_MS = 6000
    # Seed 6: its one crash kills the worker committing the last batch, after that commit: the topic is
    # caught up in PostgreSQL while Spark retries the task, and the run still waits for the retry's outcome.
    result = run_classic_demo(records=30, crash_probability=1.0, max_restarts=1, timeout_s=patience(200), seed=6,
                              pipelines=["nums-spark-exactly-once"])
    spark = result["nums-spark-exactly-once"]
    assert spark["crashes"] == [{"attempt": 3, "point": "after-db-commit", "classic": True}]
    assert (spark["state"], spark["restarts"]) == ("done", 1), spark
    assert (spark["rows"], spark["distinct"], spark["missing"], spark["duplicated"]) == (30, 30, [], {})
    assert Pipeline.objects.get(name="nums-spark-exactly-once").engine == Engine.SPARK
