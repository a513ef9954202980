"""The Spark engine on a real standalone cluster (a master and two workers from the pyspark wheel): executor
tasks commit the partition slices, exactly once, while their Python workers are killed mid-commit and while
the driver is killed."""
import os
import random
import signal
import time

import pytest

from consumers.engine import commit
from consumers.engine.faults import FaultInjector
from consumers.engine.options import RunOptions
from consumers.engine.spark import SparkRun, run_pipeline
from consumers.engine.spark_session import get_spark, stop_spark
from consumers.models import BatchLedger, DeliveryMode, PartitionOffset, Pipeline
from tests.conftest import ROOT, stop_process_group
from tests.spark_cluster import alive_workers
from tests.spark_drivers import log_size, read_log, start_driver, wait_for_a_commit
from tests.spark_helpers import expected_rows, produce_values, sink_rows, spark_pipelines
from tests.waiting import patience

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture
def cluster_pipeline(transactional_db, kafka_bootstrap, make_topic):
    with spark_pipelines() as spark_pipeline_on:
        def make(name, partitions=3):
            return spark_pipeline_on(name, make_topic(name, partitions=partitions), DeliveryMode.EXACTLY_ONCE)

        yield make


def assert_ledger_tiles(pipeline, log):
    for partition, values in log.items():
        ranges = list(BatchLedger.objects.filter(pipeline=pipeline, partition=partition)
                      .order_by("first_offset").values_list("first_offset", "end_offset"))
        assert ranges[0][0] == 0 and ranges[-1][1] == len(values)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False)), "gap or overlap"


def test_the_cluster_has_two_alive_workers_and_the_session_uses_it(on_spark_cluster):
    assert len(alive_workers(on_spark_cluster.state())) == 2
    spark = get_spark()
    assert spark.sparkContext.master == on_spark_cluster.master
    # Work lands on executors in other processes: each task reports its Python worker's PID.
    pids = set(spark.sparkContext.parallelize(range(8), 8).map(lambda _: os.getpid()).collect())
    assert os.getpid() not in pids and pids
    apps = on_spark_cluster.state()["activeapps"]
    assert len(apps) == 1 and apps[0]["cores"] == 2  # one executor on each 1-core worker


def test_executors_commit_every_slice_and_the_driver_never_commits(on_spark_cluster, cluster_pipeline,
                                                                   kafka_bootstrap, monkeypatch):
    pipeline = cluster_pipeline("cluster-once", partitions=3)
    log = produce_values(kafka_bootstrap, pipeline.topic, 900, partitions=3)

    def driver_commit(*args, **kwargs):
        raise AssertionError("a batch was committed on the driver")

    # The commit protocol is refused in this (the driver's) process only; executors import their own.
    monkeypatch.setattr(commit, "commit_batch", driver_commit)
    result = run_pipeline(pipeline.name, batch_size=200, stop_when_caught_up=True, max_seconds=patience(120))

    assert result.reason == "caught_up", result.detail
    assert (result.records, result.skipped) == (900, 0)
    assert sink_rows(pipeline.sink_table) == expected_rows(log)
    assert_ledger_tiles(pipeline, log)
    assert dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset")) == {
        0: 300, 1: 300, 2: 300}


def test_python_workers_killed_mid_commit_on_executors_lose_and_duplicate_nothing(on_spark_cluster,
                                                                                 cluster_pipeline, kafka_bootstrap):
    pipeline = cluster_pipeline("cluster-exec-chaos", partitions=3)
    log = produce_values(kafka_bootstrap, pipeline.topic, 600, partitions=3)
    # Every slice's first attempt dies inside its open transaction: its executor Python worker SIGKILLs
    # itself after writing part (mid-write) or all (after-write) of the rows. Spark retries the task.
    run = SparkRun(Pipeline.objects.get(pk=pipeline.pk), RunOptions(
        batch_size=150, stop_when_caught_up=True, max_seconds=patience(200),
        faults=FaultInjector({"mid-write": 0.5, "after-write": 1.0})))

    result = run.run()

    assert result.reason == "caught_up", result.detail
    slices = BatchLedger.objects.filter(pipeline=pipeline).count()
    assert slices >= 6 and run.retried_slices == slices  # each committed by a second attempt
    assert (result.records, result.skipped) == (600, 0)  # the killed attempts left nothing to skip
    assert sink_rows(pipeline.sink_table) == expected_rows(log)
    assert_ledger_tiles(pipeline, log)


@pytest.mark.chaos
@pytest.mark.timeout(1800)  # four drivers, each starting a JVM and an application on the cluster
def test_killing_the_driver_on_the_cluster_loses_and_duplicates_nothing(spark_cluster, cluster_pipeline,
                                                                        kafka_bootstrap, subprocess_env):
    stop_spark(shutdown_jvm=True)  # the engine processes are the drivers; this process needs no JVM
    pipeline = cluster_pipeline("cluster-driver-chaos", partitions=3)
    log = produce_values(kafka_bootstrap, pipeline.topic, 1500, partitions=3)
    env = dict(subprocess_env, SPARK_MASTER=spark_cluster.master)
    log_path = ROOT / "var" / f"spark-cluster-chaos-{pipeline.name}.log"
    rng = random.Random()
    kills = 0
    for _ in range(3):
        before = BatchLedger.objects.filter(pipeline=pipeline).count()
        since = log_size(log_path)
        # Small micro-batches with simulated work, and executors killed mid-commit now and then as well.
        driver = start_driver(env, log_path, pipeline.name, "--batch-size", "90",
                              "--delay-ms", "2", "--crash-at", "after-write:0.1")
        try:
            wait_for_a_commit(driver, log_path, since, pipeline, before,
                              context=lambda: f"; the cluster's applications: {cluster_apps(spark_cluster)}")
            time.sleep(rng.uniform(0.0, 1.5))
            os.kill(driver.pid, signal.SIGKILL)  # the driver's Python process: no cleanup, no finally, no commit
            kills += 1
        finally:
            stop_process_group(driver, timeout=10)  # and its JVM, which holds the cluster's cores until it exits
    assert kills == 3
    assert sum(PartitionOffset.objects.filter(pipeline=pipeline).values_list("next_offset", flat=True)) < 1500

    final = start_driver(env, log_path, pipeline.name, "--stop-when-caught-up",
                         "--max-seconds", f"{patience(100):.0f}")
    try:
        assert final.wait(timeout=patience(140)) == 0, read_log(log_path)[-3000:]
    finally:
        stop_process_group(final)
    assert sink_rows(pipeline.sink_table) == expected_rows(log)
    assert_ledger_tiles(pipeline, log)


def cluster_apps(cluster) -> list:
    state = cluster.state() or {}
    return [(app.get("id"), app.get("state"), app.get("cores")) for app in state.get("activeapps", [])]
