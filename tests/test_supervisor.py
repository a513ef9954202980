"""The supervisor's decisions against the real database: restart a pipeline that should run but has no
live run (with the reason, a new epoch and backoff), leave live ones alone, claim each restart once, and
give up after the bounded number of attempts. (The real beat + worker path is in test_celery_pipelines.py.)"""
import dataclasses
import os
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg2
import pytest
from django.db import connection
from django.utils import timezone

from consumers import waiting
from consumers.engine import commit, db, runs
from consumers.engine.lifecycle import RunResult
from consumers.models import ActionLog, ActionResult, ConsumerRun, DesiredState, EndReason, Pipeline, RunState
from consumers.operations import actions, frozen_copies, supervisor
from consumers.tasks.operations import end_frozen_copies_task
from tests.chaos import produce_values
from tests.commands import pipeline_command
from tests.pipelines import create_pipeline
from tests.sink_rows import sink_offsets

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def enqueued(monkeypatch):
    """Run tasks a worker takes at once (as a run task does first: Pipeline.objects.run_taken)."""
    calls = []

    def enqueue(pipeline_id, epoch, runs=1):
        calls.append((pipeline_id, epoch))
        for _ in range(runs):
            Pipeline.objects.filter(pk=pipeline_id, epoch=epoch).run_taken(timezone.now())

    monkeypatch.setattr(actions, "enqueue_run", enqueue)
    return calls


@pytest.fixture
def queued(monkeypatch):
    """Run tasks that stay in the queue: no worker has room for them."""
    calls = []
    monkeypatch.setattr(actions, "enqueue_run", lambda pipeline_id, epoch, runs=1: calls.append((pipeline_id, runs)))
    return calls


@pytest.fixture
def running(settings):
    settings.TALLY_RUN_LEASE_SECONDS = 15
    settings.TALLY_SUPERVISOR_BACKOFF_SECONDS = 2
    settings.TALLY_SUPERVISOR_MAX_ATTEMPTS = 3
    return Pipeline.objects.create(name="orders", topic="orders", sink_table="orders_sink",
                                   desired_state=DesiredState.RUNNING, epoch=5)


def run_row(pipeline, *, heartbeat_age=0.0, epoch=None, pid=None, host="worker-2", state=RunState.RUNNING):
    now = timezone.now()
    return ConsumerRun.objects.create(pipeline=pipeline, epoch=pipeline.epoch if epoch is None else epoch, host=host,
                                      pid=pid or 4242, state=state, started_at=now - timedelta(seconds=120),
                                      heartbeat_at=now - timedelta(seconds=heartbeat_age))


def decision(name="orders"):
    return next(d for d in supervisor.supervise() if d.pipeline == name)


def supervise_in_thread():
    """decision().action from a thread of the test's own, which closes its database connection when done."""
    try:
        return decision().action
    finally:
        connection.close()


def test_a_pipeline_with_a_live_heartbeat_is_left_alone(running, enqueued):
    run_row(running, heartbeat_age=2)
    assert decision().action == "ok"
    assert enqueued == [] and not ActionLog.objects.exists()


def test_a_pipeline_whose_run_stopped_heartbeating_gets_a_new_run_of_a_new_epoch_with_the_reason(running, enqueued):
    stale = run_row(running, heartbeat_age=20)
    assert decision().action == "restarted"
    running.refresh_from_db()
    assert enqueued == [(running.pk, 6)] and running.epoch == 6 and running.restart_attempts == 1
    assert f"run {stale.pk} on worker-2 (pid 4242) stopped heartbeating 20 s ago" in running.last_error
    entry = ActionLog.objects.get()
    assert (entry.action, entry.actor, entry.result) == ("restart", "supervisor", ActionResult.DONE)
    assert "attempt 1" in entry.message and "stopped heartbeating" in entry.message


@pytest.mark.django_db
def test_an_engine_transaction_waits_far_longer_than_a_lease_before_postgresql_ends_it(settings):
    # A batch's transform runs inside its transaction: ended after a lease, a transform slower than that would fail
    # its batch at every retry. The limit only has to end a frozen process's transaction some time.
    settings.TALLY_RUN_LEASE_SECONDS = 2
    db.close_pool()
    try:
        with db.engine_connection() as conn, conn.cursor() as cur:
            cur.execute("SHOW idle_in_transaction_session_timeout")
            assert cur.fetchone()[0] == "2min"
    finally:
        db.close_pool()


def test_a_run_frozen_inside_its_batch_transaction_does_not_block_its_restart(running, enqueued, settings):
    # A hung engine host (stopped, swapped out, cut off from the worker) froze a run's writer inside the commit
    # protocol's transaction, after step 1 locked the pipeline row FOR SHARE. Its heartbeat stopped with it, so the
    # supervisor restarts the pipeline: the epoch bump must not wait on the frozen transaction for ever (nor
    # would an operator's stop). PostgreSQL ends a transaction left idle that long.
    settings.TALLY_RUN_LEASE_SECONDS = 2
    settings.TALLY_ENGINE_IDLE_TRANSACTION_SECONDS = 2
    db.close_pool()   # engine connections opened from now on, under this lease
    run_row(running, heartbeat_age=20)

    # The frozen transaction is given back (rolled back) before the supervisor's thread is waited for.
    with ThreadPoolExecutor(1) as pool, db.engine_connection() as frozen:
        with frozen.cursor() as cursor:
            cursor.execute(commit._SHARE_PIPELINE, [running.pk])
        assert pool.submit(supervise_in_thread).result(timeout=30) == "restarted"
    running.refresh_from_db()
    assert running.epoch == 6


class StalledRows:
    """A writer's COPY data: a few rows, then nothing until released (its process froze mid-write)."""

    def __init__(self):
        self.release, self.sent = threading.Event(), False

    def read(self, size=-1):
        if not self.sent:
            self.sent = True
            return "1\n2\n"
        self.release.wait(60)
        return ""

    readline = read


def test_a_run_frozen_inside_its_batch_copy_does_not_block_its_restart(running, enqueued, settings):
    # As above, but the writer froze in the middle of its COPY: PostgreSQL's session is then active (reading the
    # client's data), so neither the idle-transaction limit nor a statement timeout ends it, and the pipeline row
    # stayed locked FOR SHARE for good. The periodic sweep ends an engine COPY older than that limit.
    settings.TALLY_RUN_LEASE_SECONDS = 2
    settings.TALLY_ENGINE_IDLE_TRANSACTION_SECONDS = 2
    db.close_pool()
    run_row(running, heartbeat_age=20)
    rows = StalledRows()

    def write_frozen(conn):
        with conn.cursor() as cursor:
            cursor.execute("CREATE TEMP TABLE frozen_sink (value int)")
            cursor.execute(commit._SHARE_PIPELINE, [running.pk])
            cursor.copy_expert("COPY frozen_sink FROM STDIN", rows)

    with ThreadPoolExecutor(2) as pool, db.engine_connection() as frozen:
        writing = pool.submit(write_frozen, frozen)
        assert waiting.wait_until(lambda: rows.sent, 30)
        assert frozen_copies.end_frozen_copies(older_than_seconds=3600) == []   # a COPY under the limit is left
        restart = pool.submit(supervise_in_thread)
        ended = []
        assert waiting.wait_until(lambda: ended.extend(end_frozen_copies_task()) or ended, 30)   # beat's task
        assert ended == [frozen.get_backend_pid()]
        assert restart.result(timeout=30) == "restarted"
        rows.release.set()
        with pytest.raises(psycopg2.OperationalError):
            writing.result(timeout=30)
    running.refresh_from_db()
    assert running.epoch == 6


def test_beat_ends_frozen_copies_as_often_as_it_supervises(settings):
    from tally.celery import app

    app.loader.import_default_modules()
    entry = settings.CELERY_BEAT_SCHEDULE["engine-frozen-copies"]
    assert entry["task"] == end_frozen_copies_task.name and entry["task"] in app.tasks
    assert entry["schedule"] == settings.CELERY_BEAT_SCHEDULE["pipelines-supervise"]["schedule"]


def test_a_run_whose_process_died_on_this_host_is_dead_before_its_lease_runs_out(running, enqueued):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()   # a pid that existed and is gone
    run_row(running, heartbeat_age=1, host=socket.gethostname(), pid=child.pid)
    assert decision().action == "restarted"
    assert "died" in Pipeline.objects.get(pk=running.pk).last_error
    run_row(Pipeline.objects.get(pk=running.pk), heartbeat_age=1, host=socket.gethostname(), pid=os.getpid())
    Pipeline.objects.filter(pk=running.pk).update(restart_after=None)
    assert decision().action == "ok"


def test_the_next_attempt_waits_for_its_backoff(running, enqueued):
    assert decision().action == "restarted"
    assert decision().action == "waiting"
    assert len(enqueued) == 1


def test_backoff_doubles_up_to_its_maximum(settings):
    settings.TALLY_SUPERVISOR_BACKOFF_SECONDS = 2
    settings.TALLY_SUPERVISOR_BACKOFF_MAX_SECONDS = 10
    assert [supervisor.backoff_seconds(n) for n in range(5)] == [2, 4, 8, 10, 10]


def test_two_supervisors_claim_one_restart_once(running, enqueued):
    stale_view = Pipeline.objects.get(pk=running.pk)
    assert supervisor._restart(stale_view, "first", timezone.now()).action == "restarted"
    assert supervisor._restart(stale_view, "second", timezone.now()).action == "skipped"
    assert len(enqueued) == 1 and ActionLog.objects.count() == 1


def test_it_gives_up_after_the_bounded_number_of_attempts_and_stops_the_pipeline(running, enqueued):
    Pipeline.objects.filter(pk=running.pk).update(restart_attempts=3, last_error="run 9 died")
    assert decision().action == "gave_up"
    running.refresh_from_db()
    assert running.desired_state == DesiredState.STOPPED and running.epoch == 6
    assert "gave up: after 3 restart attempts" in running.last_error
    assert ActionLog.objects.get().result == ActionResult.FAILED and enqueued == []


def test_a_run_of_an_older_epoch_does_not_count_as_live(running, enqueued):
    run_row(running, heartbeat_age=1, epoch=4)
    assert decision().action == "restarted"
    assert "no run joined epoch 5" in Pipeline.objects.get(pk=running.pk).last_error


def test_a_steady_run_clears_the_restart_series(running, enqueued, settings):
    settings.TALLY_SUPERVISOR_STABLE_SECONDS = 60
    Pipeline.objects.filter(pk=running.pk).update(restart_attempts=2)
    run_row(running, heartbeat_age=1)           # started two minutes ago
    assert decision().action == "ok"
    assert Pipeline.objects.get(pk=running.pk).restart_attempts == 0


def test_paused_and_stopped_pipelines_are_not_supervised(running, enqueued):
    Pipeline.objects.filter(pk=running.pk).update(desired_state=DesiredState.PAUSED)
    assert supervisor.supervise() == []
    assert enqueued == []


def test_the_runs_it_declares_dead_are_marked_crashed_with_the_reason(running, enqueued):
    stale = run_row(running, heartbeat_age=30)
    alive = run_row(running, heartbeat_age=1, epoch=4)
    supervisor.supervise()
    stale.refresh_from_db()
    alive.refresh_from_db()
    assert stale.state == RunState.CRASHED and "declared dead by the supervisor" in stale.end_reason
    assert alive.state == RunState.RUNNING


def test_a_pipeline_whose_run_task_waits_in_the_queue_gets_no_second_task(running, queued, settings):
    settings.TALLY_WORKER_WAIT_SECONDS = 10
    assert decision().action == "restarted"
    Pipeline.objects.filter(pk=running.pk).update(restart_after=None)   # long past its backoff
    later = timezone.now() + timedelta(minutes=5)
    for _ in range(3):
        assert supervisor.supervise(now=later)[0].action == "waiting_for_worker"
    assert queued == [(running.pk, 1)]
    pipeline = Pipeline.objects.get(pk=running.pk)
    assert pipeline.runs_waiting == 1
    assert pipeline.waiting_for_worker(later) and not pipeline.waiting_for_worker(pipeline.waiting_since)


@pytest.fixture
def pipeline_queue(celery_app_for_tests, settings):
    """The run tasks' queue in the test Redis, emptied afterwards."""
    settings.TALLY_PIPELINE_QUEUE = "supervisor-test-runs"
    yield settings.TALLY_PIPELINE_QUEUE
    with celery_app_for_tests.connection_for_write() as connection:
        connection.default_channel.queue_purge(settings.TALLY_PIPELINE_QUEUE)


def test_run_tasks_lost_from_the_queue_are_sent_again_once_a_redelivery_would_have_come(running, queued,
                                                                                      pipeline_queue, settings):
    # The supervisor waited for lost tasks for ever (Redis lost its data, a purge, a worker killed between
    # receiving a task and taking it): "waiting for a worker" while every worker was idle.
    settings.TALLY_TASK_REDELIVERY_SECONDS = 60
    assert decision().action == "restarted"          # its task never reaches the broker: lost
    since = Pipeline.objects.get(pk=running.pk).waiting_since
    assert supervisor.supervise(now=since + timedelta(seconds=74))[0].action == "waiting_for_worker"
    result = supervisor.supervise(now=since + timedelta(seconds=76))[0]
    assert result.action == "restarted" and "no longer in the queue and no worker took them: lost" in result.detail
    assert queued == [(running.pk, 1), (running.pk, 1)]
    entry = ActionLog.objects.filter(actor="supervisor").latest("pk")
    assert "attempt 2" in entry.message and "lost" in entry.message


def test_run_tasks_in_the_queue_are_waited_for_however_long(running, queued, pipeline_queue, settings):
    settings.TALLY_TASK_REDELIVERY_SECONDS = 60
    assert decision().action == "restarted"
    actions.send_run(0, 0)                           # a task in the queue (another pipeline's, say)
    since = Pipeline.objects.get(pk=running.pk).waiting_since
    assert supervisor.supervise(now=since + timedelta(hours=1))[0].action == "waiting_for_worker"
    assert queued == [(running.pk, 1)]


def test_a_taken_run_task_ends_the_wait(running, queued):
    supervisor.supervise()
    pipeline = Pipeline.objects.get(pk=running.pk)
    now = timezone.now()
    assert Pipeline.objects.filter(pk=pipeline.pk, epoch=pipeline.epoch - 1).run_taken(now) == 0  # an older epoch's
    assert Pipeline.objects.filter(pk=pipeline.pk, epoch=pipeline.epoch).run_taken(now) == 1
    pipeline.refresh_from_db()
    assert (pipeline.runs_waiting, pipeline.waiting_since) == (0, None)
    assert not pipeline.waiting_for_worker(timezone.now() + timedelta(hours=1))


def test_a_pipeline_with_two_runs_is_restarted_whole_when_one_of_them_died(running, queued):
    Pipeline.objects.filter(pk=running.pk).update(parallel_runs=2)
    running.refresh_from_db()
    run_row(running, heartbeat_age=1)                       # one live run, started two minutes ago
    run_row(running, heartbeat_age=60)                      # its peer stopped heartbeating
    result = decision()
    assert result.action == "restarted" and "only 1 of its 2 runs are live" in result.detail
    assert queued == [(running.pk, 2)]
    assert Pipeline.objects.get(pk=running.pk).epoch == running.epoch + 1   # fences the survivor too


def test_a_pipeline_with_two_runs_one_of_which_halted_is_left_for_an_operator(running, queued):
    # A halted run's partition holds a record a restart cannot get past: restarting the pipeline whole only
    # halted again, and after the bounded attempts stopped a pipeline an operator was meant to look at.
    Pipeline.objects.filter(pk=running.pk).update(parallel_runs=2)
    running.refresh_from_db()
    run_row(running, heartbeat_age=1)                       # its peer still reads the other partitions
    halted = run_row(running, state=RunState.FAILED)
    ConsumerRun.objects.filter(pk=halted.pk).update(end_reason="bad_record: offset 7", ended_at=timezone.now())
    result = decision()
    assert result.action == "halted" and "bad_record: offset 7" in result.detail
    assert queued == [] and Pipeline.objects.get(pk=running.pk).epoch == running.epoch


def test_two_young_runs_of_a_pipeline_are_left_to_join(running, queued):
    Pipeline.objects.filter(pk=running.pk).update(parallel_runs=2)
    running.refresh_from_db()
    young = run_row(running, heartbeat_age=0)
    ConsumerRun.objects.filter(pk=young.pk).update(started_at=timezone.now())
    assert decision().action == "ok" and queued == []


@pytest.mark.parametrize("begun_after", [None, 10], ids=["taken", "taken-then-begun"])
def test_a_run_gets_a_lease_to_start_from_its_take_and_from_its_beginning(running, queued, begun_after):
    # Restarted long ago (its backoff is over), then the run task waited in the queue; a worker takes it now.
    # Until its run has heartbeated once the pipeline has no live run, yet the supervisor waits a lease from
    # the take, not from the enqueueing: a start slower than that would otherwise be restarted once more. A
    # worker whose engine host processes were still loading begins the run later: a lease from then.
    supervisor.supervise()
    pipeline = Pipeline.objects.get(pk=running.pk)
    taken_at = timezone.now() + timedelta(minutes=5)
    Pipeline.objects.filter(pk=pipeline.pk).update(restart_after=taken_at - timedelta(minutes=4))
    assert Pipeline.objects.filter(pk=pipeline.pk, epoch=pipeline.epoch).run_taken(taken_at) == 1
    leased_from = taken_at
    if begun_after is not None:
        leased_from = taken_at + timedelta(seconds=begun_after)
        assert Pipeline.objects.filter(pk=pipeline.pk, epoch=pipeline.epoch).run_begun(leased_from) == 1
        assert supervisor.supervise(now=taken_at + timedelta(seconds=16))[0].action == "waiting"
    assert supervisor.supervise(now=leased_from + timedelta(seconds=14))[0].action == "waiting"
    assert supervisor.supervise(now=leased_from + timedelta(seconds=16))[0].action == "restarted"
    assert queued == [(running.pk, 1), (running.pk, 1)]


def test_a_run_begun_never_brings_the_next_attempt_closer(running):
    later = timezone.now() + timedelta(minutes=10)
    Pipeline.objects.filter(pk=running.pk).update(restart_after=later)
    assert Pipeline.objects.filter(pk=running.pk).run_begun(timezone.now()) == 1
    assert Pipeline.objects.get(pk=running.pk).restart_after == later


def test_a_run_is_begun_before_its_engine_starts(running, monkeypatch):
    seen = []

    def engine(name, options):
        seen.append(Pipeline.objects.get(name=name).restart_after)
        return RunResult(pipeline=name, reason=EndReason.STOPPED)

    monkeypatch.setattr(runs, "engine_for", lambda kind: engine)
    before = timezone.now()
    assert runs.run_here(running.pk, running.epoch)["reason"] == EndReason.STOPPED
    assert len(seen) == 1 and seen[0] >= before + timedelta(seconds=15)


def test_a_run_that_fails_after_an_operator_restarted_its_pipeline_leaves_no_error_on_the_new_epoch(
        running, queued, monkeypatch):
    # The failure of a run the restart replaced was written on the pipeline: its page said "run failed" while the
    # new epoch's run read on, and nothing cleared it.
    def fails_as_it_is_replaced(name, options):
        actions.restart(name, actor="alice")
        return RunResult(pipeline=name, reason=EndReason.ERROR, detail="KafkaUnreachable: no broker")

    monkeypatch.setattr(runs, "engine_for", lambda kind: fails_as_it_is_replaced)
    assert runs.run_here(running.pk, running.epoch)["reason"] == EndReason.ERROR
    pipeline = Pipeline.objects.get(pk=running.pk)
    assert (pipeline.epoch, pipeline.last_error) == (running.epoch + 1, "")


def test_the_reason_of_a_whole_restart_names_the_run_that_is_not_live(running, queued):
    Pipeline.objects.filter(pk=running.pk).update(parallel_runs=2)
    running.refresh_from_db()
    dead = run_row(running, heartbeat_age=60)
    live = run_row(running, heartbeat_age=0)
    ConsumerRun.objects.filter(pk=live.pk).update(started_at=timezone.now() - timedelta(seconds=100))  # started last
    result = decision()
    assert result.action == "restarted"
    assert f"run {dead.pk} on worker-2 (pid 4242) stopped heartbeating 60 s ago" in result.detail
    assert f"run {live.pk}" not in result.detail   # the live run is not why: it read "stopped heartbeating 0 s ago"


def test_a_restart_with_fewer_runs_keeps_that_many_and_the_supervisor_leaves_them_alone(running, enqueued, capsys):
    # `restart --runs 1` of a pipeline of two runs: the supervisor read one live run of two as a death, restarted
    # the pipeline whole with two runs and counted an attempt, undoing the operator's choice.
    Pipeline.objects.filter(pk=running.pk).update(parallel_runs=2)
    code, out, _ = pipeline_command(capsys, "restart", "orders", "--runs", "1", "--actor", "alice")
    assert code == 0 and "1 run(s) enqueued" in out and "runs 2 -> 1" in out
    pipeline = Pipeline.objects.get(pk=running.pk)
    assert pipeline.parallel_runs == 1
    entry = ActionLog.objects.get(action="restart", actor="alice")
    assert entry.params["runs"] == 1 and entry.params["parallel_runs_before"] == 2
    run_row(pipeline, heartbeat_age=1)                      # its one run, settled long ago
    assert decision().action == "ok"   # one of one live, not "only 1 of its 2"
    assert Pipeline.objects.get(pk=running.pk).epoch == pipeline.epoch


def test_runs_a_spark_pipeline_cannot_hold_are_refused_and_recorded(running, enqueued, capsys):
    Pipeline.objects.filter(pk=running.pk).update(engine="spark")
    code, _, err = pipeline_command(capsys, "restart", "orders", "--runs", "2")
    assert code == 1 and "the spark engine runs one driver per pipeline" in err
    pipeline = Pipeline.objects.get(pk=running.pk)
    assert (pipeline.epoch, pipeline.parallel_runs, enqueued) == (running.epoch, 1, [])
    assert ActionLog.objects.get().result == ActionResult.REFUSED


@pytest.mark.kafka
def test_a_stop_that_lands_as_a_run_starts_fences_that_run_instead_of_being_joined_by_it(
        kafka_bootstrap, make_topic, table, queued, monkeypatch):
    # The task checked its epoch, then the engine joined the pipeline's epoch as it then was: the stop's own.
    # The stopped pipeline kept consuming, and nothing would ever fence it.
    topic = make_topic("stop-race")
    produce_values(topic, range(1, 6))
    pipeline = create_pipeline("raced", topic, table)
    actions.start("raced")
    epoch = Pipeline.objects.get(pk=pipeline.pk).epoch
    python_engine = runs.engine_for(pipeline.engine)

    def stopped_as_it_starts(name, options):
        actions.stop(name, actor="bob")
        return python_engine(name, dataclasses.replace(options, max_seconds=15))   # bounded, without the fix

    monkeypatch.setattr(runs, "engine_for", lambda kind: stopped_as_it_starts)
    result = runs.run_here(pipeline.pk, epoch)

    assert result["reason"] == EndReason.FENCED and result["records"] == 0
    run = ConsumerRun.objects.get(pipeline=pipeline)
    assert (run.epoch, run.state) == (epoch, RunState.FENCED)
    assert sink_offsets(table) == []
