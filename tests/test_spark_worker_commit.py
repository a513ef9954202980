"""Spark crashes in the demo kill the Python worker that is committing, not the driver: Spark retries the
task, the driver (and its JVM) stays up, and the exactly-once sink still holds every value once."""
import pytest

from consumers.engine.faults import FaultInjector
from consumers.engine.spark_worker_commit import TASK_ATTEMPTS, crash_points, with_task_retries


@pytest.mark.parametrize(("master", "expected"), [
    ("local", "local[1,8]"), ("local[2]", "local[2,8]"), ("local[*]", "local[*,8]"),
    ("local[2,3]", "local[2,3]"), ("spark://127.0.0.1:7077", "spark://127.0.0.1:7077")])
def test_a_local_master_gets_task_retries(master, expected):
    assert with_task_retries(master) == expected


def test_crash_points_follow_the_attempts_of_one_batch_and_its_retries():
    faults = FaultInjector.parse("after-write@2,mid-write@3,after-db-commit@6", in_worker=True)
    assert crash_points(faults, 1) == ([], 2)                           # batch 1: attempt 1 commits
    assert crash_points(faults, 2) == (["after-write", "mid-write"], 5)  # batch 2: attempts 2, 3 die, 4 commits
    assert crash_points(faults, 5) == ([], 6)
    assert crash_points(faults, 6) == (["after-db-commit"], 8)


def test_consecutive_crashes_stop_short_of_spark_giving_up():
    faults = FaultInjector.parse(",".join(f"after-write@{n}" for n in range(1, 30)), in_worker=True)
    points, _ = crash_points(faults, 1)
    assert len(points) == TASK_ATTEMPTS - 1


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.timeout(1200)
def test_the_spark_demo_pipeline_loses_workers_not_its_driver_and_stays_exactly_once(demo):
    from consumers.demo.classic import run_classic_demo

    # Probability 0.3 with seed 3: several scheduled crashes, each a Python worker killed mid-commit.
    result = run_classic_demo(records=40, crash_probability=0.3, seed=3, timeout_s=900,
                              pipelines=["nums-spark-exactly-once"])["nums-spark-exactly-once"]
    assert result["state"] == "done", result
    assert (result["rows"], result["distinct"], result["missing"], result["duplicated"]) == (40, 40, [], {})
    events = [event for _, event in result["timeline"]]
    assert events.count("started") == 1 and events[-1] == "done"      # one driver process for the whole run
    assert events.count("worker died") == result["restarts"] >= 1
