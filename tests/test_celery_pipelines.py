"""Pipelines in real Celery workers (threads pool) with real Celery beat, Redis, PostgreSQL and the broker:
a killed worker's pipeline comes back through the supervisor, a restart fences the old run, a rewind of a
running pipeline resumes it, and the sink holds every record exactly once, row by row."""
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import psutil
import pytest
from django.utils import timezone

from consumers.demo.classic import DEMO_TOPIC
from consumers.kafka import admin as kafka_admin
from consumers.models import ActionLog, BatchLedger, ConsumerRun, DesiredState, Pipeline, RunState
from consumers.operations import actions
from consumers.operations.rewind import rewind
from tests.conftest import ROOT, start_celery_worker, stop_process_group
from tests.ops_helpers import (
    AT_LEAST_ONCE,
    EXACTLY_ONCE,
    drop_demo_sinks,
    expected_rows,
    positions,
    produce,
    seed,
    sink_rows,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.celery, pytest.mark.django_db(transaction=True)]

# The run lease (15 s by default) made short so that a killed worker's pipeline comes back quickly, with room for
# a restarted run's first heartbeat on a loaded machine (the lease counts from when a process begins the run:
# Pipeline.objects.run_begun).
LEASE_SECONDS = 10


@pytest.fixture
def ops_env(subprocess_env, celery_app_for_tests, kafka_bootstrap, settings):
    settings.KAFKA_SESSION_TIMEOUT_MS = 6000
    settings.TALLY_RUN_LEASE_SECONDS = LEASE_SECONDS
    env = dict(subprocess_env, KAFKA_SESSION_TIMEOUT_MS="6000", TALLY_RUN_LEASE_SECONDS=str(LEASE_SECONDS),
               TALLY_SUPERVISOR_INTERVAL_SECONDS="1", TALLY_SUPERVISOR_BACKOFF_SECONDS="1")
    processes, schedules = [], []

    def worker(*extra_args, **extra_env):
        process = start_celery_worker({**env, **extra_env}, *extra_args, log_name="ops-worker")
        processes.append(process)
        wait_for(lambda: _answers(celery_app_for_tests, process), 60, "the worker to answer a ping", 0.5)
        return process

    def beat(**extra_env):
        schedule = ROOT / "var" / f"ops-beat-{uuid.uuid4().hex[:6]}"
        schedules.append(schedule)
        log = open(ROOT / "var" / f"{schedule.name}.log", "wb")
        process = subprocess.Popen([sys.executable, "-m", "celery", "-A", "tally", "beat", "-s", str(schedule),
                                    "--loglevel", "INFO"], cwd=ROOT, env={**env, **extra_env}, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        processes.append(process)
        return process

    seed(20)
    yield worker, beat
    Pipeline.objects.update(desired_state=DesiredState.STOPPED)
    for process in reversed(processes):
        stop_process_group(process)
    for schedule in schedules:
        for leftover in schedule.parent.glob(f"{schedule.name}*"):
            if not leftover.name.endswith(".log"):
                leftover.unlink()
    celery_app_for_tests.control.purge()
    drop_demo_sinks()


def _answers(app, process) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"worker exited: {open(process.log_path).read()[-2000:]}")
    return bool(app.control.ping(timeout=0.5))


def live_run(after_pk=0):
    """A run of the pipeline's current epoch that heartbeats, newer than run `after_pk`."""
    pipeline = Pipeline.objects.get(name=EXACTLY_ONCE)
    return (ConsumerRun.objects.filter(pipeline=pipeline, epoch=pipeline.epoch, state=RunState.RUNNING,
                                       pk__gt=after_pk, heartbeat_at__gte=timezone.now() - timezone.timedelta(
                                           seconds=LEASE_SECONDS)).order_by("-pk").first())


def caught_up():
    high = kafka_admin.high_watermarks(DEMO_TOPIC)
    return positions(EXACTLY_ONCE) == high


def caught_up_run(ops_env):
    """A worker started, then the pipeline: (the worker, its run once live and caught up)."""
    start_worker, _ = ops_env
    worker = start_worker()
    actions.start(EXACTLY_ONCE)
    run = wait_for(live_run, 30, "the first run")
    wait_for(caught_up, 30, "the first run to catch up")
    return worker, run


# A worker that took the run task from Redis and was killed before it started it: the task is left unacknowledged.
TAKE_THE_TASK_AND_DIE = """
import os, signal
from tally.celery import app
with app.connection_for_read() as connection:
    message = connection.SimpleQueue("celery", no_ack=False).get(timeout=30)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_run_task_taken_by_a_worker_killed_before_it_started_goes_to_another_worker_within_minutes(
        ops_env, subprocess_env):
    """Redis keeps such a task for the visibility timeout (its default an hour), and the supervisor waits for it:
    the pipeline stood still that long."""
    start_worker, _ = ops_env
    actions.start(EXACTLY_ONCE)
    died = subprocess.run([sys.executable, "-c", TAKE_THE_TASK_AND_DIE], cwd=ROOT, env=subprocess_env, timeout=60)
    assert died.returncode == -signal.SIGKILL
    start_worker(TALLY_TASK_REDELIVERY_SECONDS="5")
    wait_for(live_run, 60, "the task the killed worker took to run on the new worker")


def test_a_run_task_an_older_release_left_on_the_celery_queue_runs_on_the_pipeline_worker_not_the_tasks_one(
        ops_env, settings):
    """An older release sent run tasks to `celery`. One still queued at the upgrade is taken by the periodic-task
    worker (docker-compose.yml `tasks`: -Q celery), and the supervisor sends no other while it waits: it must move
    to the pipeline queue rather than hold that worker's thread as long as the pipeline runs."""
    start_worker, _ = ops_env
    settings.TALLY_PIPELINE_QUEUE = "celery"          # the older release enqueues
    actions.start(EXACTLY_ONCE)
    tasks_worker = start_worker("-Q", "celery", TALLY_PIPELINE_QUEUE="pipelines")
    pipeline_worker = start_worker("-Q", "pipelines", TALLY_PIPELINE_QUEUE="pipelines")

    run = wait_for(live_run, 60, "the run on the pipeline worker")

    assert run.pid in processes_of(pipeline_worker) and run.pid not in processes_of(tasks_worker)
    wait_for(caught_up, 30, "the run to catch up")
    assert sink_rows(EXACTLY_ONCE) == expected_rows(range(1, 21))
    assert Pipeline.objects.get(name=EXACTLY_ONCE).runs_waiting == 0


def processes_of(worker) -> set[int]:
    return {worker.pid} | {child.pid for child in psutil.Process(worker.pid).children(recursive=True)}


@pytest.mark.chaos
@pytest.mark.parametrize("same_host", [True, False], ids=["dead-pid-seen-on-this-host", "lease-expires"])
def test_a_pipeline_whose_worker_is_killed_comes_back_through_the_supervisor_and_misses_nothing(ops_env, same_host):
    """same_host: the supervisor sees the run's process is gone; otherwise (as when the worker's host died)
    it waits for the run's lease to expire."""
    start_worker, start_beat = ops_env
    worker_a = start_worker()
    actions.start(EXACTLY_ONCE, actor="alice")
    first = wait_for(live_run, 30, "the first run")
    worker_a_processes = {worker_a.pid} | {c.pid for c in psutil.Process(worker_a.pid).children(recursive=True)}
    assert first.pid in worker_a_processes            # one of its engine host processes
    wait_for(caught_up, 30, "the first run to catch up")
    supervision = {} if same_host else {"TALLY_SUPERVISOR_CHECK_LOCAL_PIDS": "false"}
    start_worker(**supervision)
    start_beat(**supervision)
    produce(21, 40)
    wait_for(caught_up, 30, "the first run to consume 21..40")

    killed_at = time.monotonic()
    os.killpg(worker_a.pid, signal.SIGKILL)
    worker_a.wait()
    produce(41, 60)                                   # records arrive while the pipeline is down
    second = wait_for(lambda: live_run(after_pk=first.pk), 60, "the supervisor to bring the pipeline back")
    back_after = time.monotonic() - killed_at
    wait_for(caught_up, 60, "the new run to catch up")
    caught_up_after = time.monotonic() - killed_at
    print(f"\nkilled worker ({'same host' if same_host else 'lease expiry'}): pipeline running again after "
          f"{back_after:.1f} s, caught up after {caught_up_after:.1f} s (lease {LEASE_SECONDS} s, supervisor "
          f"every 1 s, session 2 s)")

    assert second.pid not in worker_a_processes
    assert sink_rows(EXACTLY_ONCE) == expected_rows(range(1, 61))
    restart = ActionLog.objects.get(action="restart", actor="supervisor")
    assert f"run {first.pk}" in restart.message
    assert ("died" if same_host else "stopped heartbeating") in restart.message
    assert ConsumerRun.objects.get(pk=first.pk).state == RunState.CRASHED
    assert Pipeline.objects.get(name=EXACTLY_ONCE).restart_attempts == 1


def test_a_restart_while_records_flow_fences_the_old_run_and_loses_or_duplicates_nothing(ops_env):
    _, first = caught_up_run(ops_env)

    flowing = threading.Thread(target=_produce_slowly, args=(21, 220))
    flowing.start()
    time.sleep(1.0)
    entry = actions.restart(EXACTLY_ONCE, actor="alice")
    new_epoch = entry.params["epoch"]
    flowing.join()
    wait_for(lambda: live_run(after_pk=first.pk), 30, "the new run")
    wait_for(caught_up, 60, "the new run to catch up")

    assert sink_rows(EXACTLY_ONCE) == expected_rows(range(1, 221))
    old_rows = BatchLedger.objects.filter(pipeline__name=EXACTLY_ONCE, epoch__lt=new_epoch)
    assert old_rows.exists() and BatchLedger.objects.filter(epoch=new_epoch).exists()
    assert max(row.committed_at for row in old_rows) < entry.created_at   # no write of the old epoch after it
    first.refresh_from_db()
    assert first.state == RunState.FENCED and f"epoch {new_epoch}" in first.end_reason


def _produce_slowly(first_value, last_value):
    for start in range(first_value, last_value + 1, 10):
        produce(start, min(start + 9, last_value))
        time.sleep(0.05)


def test_pause_ends_the_run_within_seconds_and_a_rewind_of_a_running_pipeline_resumes_it(ops_env):
    _, first = caught_up_run(ops_env)

    paused_at = time.monotonic()
    actions.pause(EXACTLY_ONCE)
    wait_for(lambda: ConsumerRun.objects.get(pk=first.pk).ended_at, 10, "the run to end after pause", 0.1)
    assert time.monotonic() - paused_at < 5
    actions.resume(EXACTLY_ONCE)
    second = wait_for(lambda: live_run(after_pk=first.pk), 30, "the resumed run")

    produce(21, 30)
    wait_for(caught_up, 30, "the resumed run to catch up")
    result = rewind(EXACTLY_ONCE, "to-offset", "3", rollback_sink=True, actor="alice")
    assert result.resumed and Pipeline.objects.get(name=EXACTLY_ONCE).desired_state == DesiredState.RUNNING
    assert ConsumerRun.objects.get(pk=second.pk).state == RunState.FENCED
    wait_for(lambda: live_run(after_pk=second.pk), 30, "the run after the rewind")
    wait_for(caught_up, 30, "the rewound pipeline to catch up")
    assert sink_rows(EXACTLY_ONCE) == expected_rows(range(1, 31))


def test_a_warm_shutdown_of_the_worker_stops_its_runs_cleanly(ops_env):
    worker, run = caught_up_run(ops_env)
    os.killpg(worker.pid, signal.SIGTERM)               # Celery's warm shutdown
    worker.wait(timeout=30)
    run.refresh_from_db()
    # The group's signal reaches the worker and its hosts at once: whichever stops the run first gives the reason.
    assert run.state == RunState.STOPPED
    assert run.end_reason.startswith(("stopped: worker shutting down", "stopped: engine host got SIGTERM"))


def test_two_runs_share_the_partitions_and_write_each_record_once(ops_env):
    start_worker, _ = ops_env
    start_worker()
    start_worker()
    actions.start(EXACTLY_ONCE, runs=2)

    def split_between_two_runs():
        pipeline = Pipeline.objects.get(name=EXACTLY_ONCE)
        runs = ConsumerRun.objects.filter(pipeline=pipeline, epoch=pipeline.epoch, state=RunState.RUNNING)
        assigned = [sorted(run.assigned_partitions) for run in runs]
        return sorted(assigned) == [[0], [1]]

    wait_for(split_between_two_runs, 30, "two runs with one partition each")
    produce(21, 60)
    wait_for(caught_up, 30, "the two runs to catch up")
    assert sink_rows(EXACTLY_ONCE) == expected_rows(range(1, 61))


def test_a_run_a_full_worker_cannot_start_waits_in_redis_for_another_worker(ops_env):
    """A worker whose threads are all held by runs must not reserve the next run task: another worker takes it."""
    start_worker, _ = ops_env
    start_worker("--concurrency", "1")
    actions.start(EXACTLY_ONCE)
    wait_for(live_run, 30, "the first pipeline's run, holding the worker's only thread")
    actions.start(AT_LEAST_ONCE)

    def second_pipeline_runs():
        pipeline = Pipeline.objects.get(name=AT_LEAST_ONCE)
        return ConsumerRun.objects.filter(pipeline=pipeline, epoch=pipeline.epoch, state=RunState.RUNNING).exists()

    start_worker()
    wait_for(second_pipeline_runs, 30, "the second worker to take the run the full one has no room for")
