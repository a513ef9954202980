"""Spark crashes in the demo kill the executor task's Python worker that is committing its slice, not the
driver: Spark retries the task, the driver (and its JVM) stays up, and the exactly-once sink still holds every
value once."""
import logging
from concurrent.futures import ThreadPoolExecutor

import psycopg2
import pytest
from django.db import connection

from consumers.engine import commit, spark_commit
from consumers.engine.faults import NO_FAULTS, FaultInjector
from consumers.engine.options import RunOptions
from consumers.engine.spark import SparkRun
from consumers.engine.spark_commit import SliceJob, crash_points, task_faults
from consumers.engine.spark_session import TASK_ATTEMPTS
from consumers.models import Engine, Pipeline
from tests.waiting import patience


def test_crash_points_follow_the_attempts_of_one_batch_and_its_retries():
    faults = FaultInjector.parse("after-write@2,mid-write@3,after-db-commit@6", in_worker=True)
    assert crash_points(faults, 1, TASK_ATTEMPTS) == []                            # attempt 1 commits
    assert crash_points(faults, 2, TASK_ATTEMPTS) == ["after-write", "mid-write"]  # 2, 3 die, 4 commits
    assert crash_points(faults, 5, TASK_ATTEMPTS) == []
    assert crash_points(faults, 6, TASK_ATTEMPTS) == ["after-db-commit"]


def test_consecutive_crashes_stop_short_of_spark_giving_up():
    faults = FaultInjector.parse(",".join(f"after-write@{n}" for n in range(1, 30)), in_worker=True)
    assert len(crash_points(faults, 1, TASK_ATTEMPTS)) == TASK_ATTEMPTS - 1


def _job(**kwargs):
    return SliceJob(dsn={}, pipeline_id=1, topic="t", sink_table="s", transform="int_value", exactly_once=True,
                    stop_on_bad_record=False, epoch=1, **kwargs)


def test_the_scheduled_crash_is_the_first_tasks_and_each_attempt_dies_at_its_own_point():
    job = _job(crash_points=("after-write", "after-poll"))
    assert task_faults(job, task=0, attempt=0).at_pass == {"after-write": {1}}
    assert task_faults(job, task=0, attempt=1).at_pass == {"after-poll": {1}}
    assert task_faults(job, task=0, attempt=2) is NO_FAULTS    # the retry that commits
    assert task_faults(job, task=1, attempt=0) is NO_FAULTS    # other slices of the batch commit undisturbed


def test_a_scheduled_stop_reaches_its_task_as_a_stop_not_a_crash():
    faults = FaultInjector.parse("mid-write@1/stop", in_worker=True)
    assert crash_points(faults, 1, TASK_ATTEMPTS) == ["mid-write/stop"]
    task = task_faults(_job(crash_points=("mid-write/stop",)), task=0, attempt=0)
    assert (task.at_pass, task.stop_at) == ({"mid-write": {1}}, {("mid-write", 1)})


def test_probabilistic_executor_faults_fire_on_a_first_attempt_only():
    job = _job(faults={"mid-write": 1.0})
    assert task_faults(job, task=3, attempt=0).points == {"mid-write": 1.0}
    assert task_faults(job, task=3, attempt=1) is NO_FAULTS


def test_only_crash_in_worker_hands_the_drivers_points_to_the_executors():
    specs = "after-poll:0.5,mid-write:0.5,after-db-commit:0.5"
    assert spark_commit.executor_faults(FaultInjector.parse(specs)) == {"mid-write": 0.5}
    assert spark_commit.executor_faults(FaultInjector.parse(specs, in_worker=True)) == {
        "after-poll": 0.5, "mid-write": 0.5, "after-db-commit": 0.5}


def _outcome(task, attempt, partition):
    return {"task": task, "attempt": attempt, "partition": partition}


def test_the_driver_logs_each_dead_worker_and_moves_the_schedule_by_the_attempts_made(caplog):
    run = SparkRun.__new__(SparkRun)   # only the bookkeeping of outcomes, no Spark
    run.pipeline = type("P", (), {"name": "nums"})()
    run.retried_slices, run.next_attempt = 0, 1
    deaths = []
    # the demo counts them (consumers/demo/runner.py)
    run.options = RunOptions(on_worker_death=lambda: deaths.append("died"))
    with caplog.at_level(logging.WARNING, logger="tally.spark.engine"):
        run._note_attempts([_outcome(0, 2, 0), _outcome(0, 2, 1), _outcome(1, 0, 2)])
    assert caplog.text.count(spark_commit.WORKER_DIED) == 2 == len(deaths)   # task 0's attempts 0 and 1 died
    assert (run.next_attempt, run.retried_slices) == (4, 2)
    run._note_attempts([_outcome(1, 0, 2)])                     # the scheduled task had no records
    run._note_attempts([])
    assert run.next_attempt == 4


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.timeout(1200)
def test_the_spark_demo_pipeline_loses_workers_not_its_driver_and_stays_exactly_once(demo):
    from consumers.demo.classic import run_classic_demo

    # Probability 0.3 with seed 3: several scheduled crashes, each a Python worker killed mid-commit.
    result = run_classic_demo(records=40, crash_probability=0.3, seed=3, timeout_s=patience(300),
                              pipelines=["nums-spark-exactly-once"])["nums-spark-exactly-once"]
    assert result["state"] == "done", result
    assert (result["rows"], result["distinct"], result["missing"], result["duplicated"]) == (40, 40, [], {})
    events = [event for _, event in result["timeline"]]
    assert events.count("started") == 1 and events[-1] == "done"      # one driver for the whole run
    assert events.count("worker died") == result["restarts"] >= 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("where", ["executor", "driver"])
def test_a_transaction_frozen_on_an_executor_or_the_driver_does_not_block_a_stop_for_ever(settings, where):
    # An executor frozen (stopped, swapped out, cut off) inside its slice's transaction holds the pipeline row FOR
    # SHARE: Spark's driver, still heartbeating, waits for the task, and an operator's stop (an epoch bump) would
    # wait on the row for ever. So would a driver frozen inside a move without records, on its own connection. As on
    # the Python engine's connections, PostgreSQL ends it after a while.
    settings.TALLY_ENGINE_IDLE_TRANSACTION_SECONDS = 2
    pipeline = Pipeline.objects.create(name="frozen", topic="frozen", sink_table="spark_frozen", engine=Engine.SPARK,
                                       epoch=1)
    run = SparkRun(pipeline, RunOptions())
    # as commit_task connects on the executor; as the run connects on the driver
    frozen = psycopg2.connect(**run._slice_job().dsn) if where == "executor" else run._driver_connection()
    pool = ThreadPoolExecutor(1)

    def stop():
        try:
            return pipeline.bump_epoch()
        finally:
            connection.close()

    try:
        with frozen.cursor() as cursor:
            cursor.execute(commit._SHARE_PIPELINE, [pipeline.pk])   # a commit's step 1, then nothing more
        assert pool.submit(stop).result(timeout=30) == 2
    finally:
        frozen.close()   # before the pool is waited for: a stop still waiting then ends
        pool.shutdown()
