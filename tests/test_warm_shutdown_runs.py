"""A worker's warm shutdown asks its runs to stop; a run task it takes after that (one it had already reserved)
must not start a run that nobody will ever ask to stop, keeping the worker from exiting."""
from concurrent.futures import Future

import pytest

from consumers.engine import hosts, runs
from consumers.engine.lifecycle import RunResult
from consumers.models import DesiredState, EndReason, Pipeline
from tests.pipelines import create_pipeline


@pytest.fixture
def warm_shutdown():
    """Begin the warm shutdown of this (test) process; forget it afterwards."""
    runs.stop_all_runs("worker shutting down (Warm)")
    yield
    runs._shutting_down.clear()


@pytest.fixture
def started_runs(monkeypatch):
    """Record every run that would start, in this process or in an engine host, instead of starting it."""
    started = []

    def record(*args, **kwargs):
        started.append(args)
        return {"reason": "stopped", "records": 0, "detail": ""}

    monkeypatch.setattr(runs, "run_here", record)
    monkeypatch.setattr(hosts.HostPool, "run", lambda self, *args, **kwargs: record(*args))
    return started


def test_a_run_task_taken_after_the_warm_shutdown_began_starts_no_run(transactional_db, table, started_runs,
                                                                     warm_shutdown):
    pipeline = create_pipeline("late-task", "late-topic", table)
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.RUNNING, runs_waiting=1)

    result = runs.run_in_worker(pipeline.pk, pipeline.epoch, task_id="reserved-before-the-shutdown")

    assert started_runs == []
    assert result["reason"] == "skipped" and "shutting down" in result["detail"]
    assert Pipeline.objects.get(pk=pipeline.pk).runs_waiting == 0   # taken: the supervisor's lease now counts


def test_an_engine_host_pool_that_was_asked_to_stop_starts_no_host_and_no_run(monkeypatch):
    made = []

    class FakeHost:
        alive = True

        def __init__(self, number):
            self.number = number
            made.append(number)

        def load(self):
            return 0

        def holds(self, pipeline_id):
            return False

        def start_run(self, *args):
            future = Future()
            future.set_result({"reason": "stopped", "records": 0, "detail": ""})
            return future

    monkeypatch.setattr(hosts, "Host", FakeHost)
    pool = hosts.HostPool(1)
    pool.stop_all("worker shutting down (Warm)")

    result = pool.run(1, 1, task_id="reserved-before-the-shutdown")

    assert made == []
    assert result["reason"] == "skipped" and "shutting down" in result["detail"]


def test_a_run_task_revoked_before_its_run_began_stops_its_run_as_it_begins(transactional_db, table, monkeypatch):
    """`celery control revoke --terminate` may come while the task waits for older runs or for its peers, before its
    run is registered: the run must still stop, as it begins, not run on under a task Celery counts as revoked."""
    pipeline = create_pipeline("revoked-early", "revoked-topic", table)
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.RUNNING)
    seen = []

    def engine(name, options):
        seen.append((name, options.stop.is_set(), options.stop.reason))
        return RunResult(name, EndReason.STOPPED, epoch=options.epoch)

    monkeypatch.setattr(runs, "engine_for", lambda kind: engine)

    assert runs.stop_task_run("task-revoked-early", "revoked (celery control revoke --terminate)") is False
    result = runs.run_here(pipeline.pk, pipeline.epoch, task_id="task-revoked-early")

    assert seen == [("revoked-early", True, "revoked (celery control revoke --terminate)")]
    assert result["reason"] == EndReason.STOPPED
    assert runs.stop_run("task-revoked-early") is False   # the run ended and is forgotten
    assert "task-revoked-early" not in runs._stopped_before_start


def test_a_run_task_revoked_while_its_run_is_handed_to_an_engine_host_stops_its_run_there(
        transactional_db, table, monkeypatch, settings):
    """The revoke may come after the task chose to run in an engine host and before that host holds the run: the
    worker's process remembers the stop, and the host is asked to stop the run once it holds it."""
    settings.TALLY_ENGINE_PROCESSES = 1
    pipeline = create_pipeline("revoked-in-hand", "revoked-topic", table)
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.RUNNING)
    sent = []

    class FakeHost:
        alive = True

        def __init__(self, number):
            self.number = number
            self.pending = {}

        def load(self):
            return len(self.pending)

        def holds(self, pipeline_id):
            return False

        def start_run(self, key, *args):
            self.pending[key] = args
            sent.append(("run", key))
            future = Future()
            future.set_result({"reason": "stopped", "records": 0, "detail": ""})
            return future

        def stop(self, key, reason):
            sent.append(("stop", key, reason))

    monkeypatch.setattr(hosts, "Host", FakeHost)
    pool = hosts.HostPool(1)
    pool._watching = True   # no watchdog thread: it would ping the fake host
    monkeypatch.setattr(hosts, "_pool", pool)

    # The hosts are asked first and hold nothing yet: the stop is remembered.
    assert runs.stop_task_run("task-revoked-in-hand", "revoked (celery control revoke --terminate)") is False
    result = runs.run_in_worker(pipeline.pk, pipeline.epoch, task_id="task-revoked-in-hand")

    assert sent == [("run", "task-revoked-in-hand"),
                    ("stop", "task-revoked-in-hand", "revoked (celery control revoke --terminate)")]
    assert result["reason"] == "stopped"
    assert "task-revoked-in-hand" not in runs._stopped_before_start


def test_a_revoke_that_finds_its_run_in_an_engine_host_is_not_also_remembered(monkeypatch):
    stops = []

    class HoldingPool:
        def stop_run(self, key, reason):
            stops.append((key, reason))
            return True

    monkeypatch.setattr(hosts, "_pool", HoldingPool())

    assert runs.stop_task_run("task-in-a-host", "revoked") is True
    assert stops == [("task-in-a-host", "revoked")]
    assert "task-in-a-host" not in runs._stopped_before_start
