"""Operator actions: each one moves the desired state and the epoch under the pipeline's row lock, is
audited (refusals too), and start/resume/restart enqueue a run of the new epoch after the commit."""
import pytest

from consumers.models import ActionLog, ActionResult, DesiredState, PartitionOffset, Pipeline
from consumers.operations import actions
from tests.commands import pipeline_command as run_command

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def enqueued(monkeypatch):
    """Runs the actions enqueue (Celery itself is exercised in test_celery_pipelines.py)."""
    calls = []
    monkeypatch.setattr(actions, "enqueue_run", lambda pipeline_id, epoch, runs=1: calls.append((pipeline_id, epoch,
                                                                                                   runs)))
    return calls


@pytest.fixture
def pipeline():
    created = Pipeline.objects.create(name="orders", topic="orders", sink_table="orders_sink")
    PartitionOffset.objects.create(pipeline=created, partition=0, next_offset=42)
    return created


def reloaded(pipeline):
    pipeline.refresh_from_db()
    return pipeline


def test_start_sets_running_bumps_the_epoch_enqueues_a_run_and_is_audited(pipeline, enqueued):
    entry = actions.start("orders", actor="alice")
    assert (reloaded(pipeline).desired_state, pipeline.epoch) == (DesiredState.RUNNING, 1)
    assert enqueued == [(pipeline.pk, 1, 1)]
    assert (entry.action, entry.actor, entry.result) == ("start", "alice", ActionResult.DONE)
    assert entry.offsets_before == entry.offsets_after == {"0": 42}
    assert entry.finished_at is not None and entry.params["epoch"] == 1


def test_pause_and_stop_bump_the_epoch_without_a_new_run(pipeline, enqueued):
    actions.start("orders")
    actions.pause("orders")
    assert (reloaded(pipeline).desired_state, pipeline.epoch) == (DesiredState.PAUSED, 2)
    actions.stop("orders")
    assert (reloaded(pipeline).desired_state, pipeline.epoch) == (DesiredState.STOPPED, 3)
    assert len(enqueued) == 1


def test_resume_and_restart_start_a_new_epoch_with_a_new_run(pipeline, enqueued):
    actions.start("orders")
    actions.pause("orders")
    actions.resume("orders")
    actions.restart("orders", runs=2)
    assert (reloaded(pipeline).desired_state, pipeline.epoch) == (DesiredState.RUNNING, 4)
    assert enqueued == [(pipeline.pk, 1, 1), (pipeline.pk, 3, 1), (pipeline.pk, 4, 2)]
    assert list(ActionLog.objects.order_by("created_at").values_list("action", flat=True)) == [
        "start", "pause", "resume", "restart"]


def test_an_operator_action_clears_the_supervisors_restart_series(pipeline, enqueued):
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.RUNNING, restart_attempts=3,
                                                   last_error="run 7 died")
    actions.restart("orders")
    assert (reloaded(pipeline).restart_attempts, pipeline.last_error) == (0, "")
    assert pipeline.restart_after is not None   # the new run gets one lease to start before the supervisor looks


@pytest.mark.parametrize("action,state,message", [
    ("start", DesiredState.RUNNING, "it is already running; use restart"),
    ("pause", DesiredState.STOPPED, "it is not running"),
    ("resume", DesiredState.RUNNING, "it is not paused"),
    ("restart", DesiredState.PAUSED, "it is not running; use start"),
    ("stop", DesiredState.STOPPED, "it is already stopped"),
])
def test_an_action_that_does_not_fit_the_state_is_refused_and_recorded(pipeline, enqueued, action, state, message):
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=state)
    with pytest.raises(actions.ActionRefused, match=message):
        actions.perform(action, "orders", "bob")
    assert (reloaded(pipeline).desired_state, pipeline.epoch) == (state, 0)
    assert enqueued == []
    entry = ActionLog.objects.get()
    assert (entry.action, entry.actor, entry.result) == (action, "bob", ActionResult.REFUSED)
    assert message in entry.message


def test_an_action_is_refused_while_another_one_runs_on_the_pipeline(pipeline, enqueued):
    ActionLog.objects.create(pipeline=pipeline, action="rewind", actor="carol", result=ActionResult.RUNNING)
    with pytest.raises(actions.ActionRefused, match="Another action is running on pipeline 'orders': rewind by carol"):
        actions.start("orders")
    assert (reloaded(pipeline).desired_state, pipeline.epoch) == (DesiredState.STOPPED, 0)


def test_the_pipeline_command_exits_0_1_and_2(pipeline, enqueued, capsys):
    code, out, _ = run_command(capsys, "start", "orders")
    assert code == 0 and "desired state running, epoch 1" in out
    code, _, err = run_command(capsys, "start", "orders")
    assert code == 1 and "Refused: Cannot start pipeline 'orders': it is already running" in err
    code, _, err = run_command(capsys, "pause", "nope")
    assert code == 1 and "No pipeline named 'nope'" in err
    code, _, err = run_command(capsys, "explode", "orders")
    assert code == 2 and "invalid choice: 'explode'" in err
    assert reloaded(pipeline).epoch == 1


def test_an_abandoned_running_action_no_longer_blocks_the_pipeline(pipeline, enqueued):
    from django.utils import timezone

    ActionLog.objects.create(pipeline=pipeline, action="rewind", actor="carol", result=ActionResult.RUNNING,
                             created_at=timezone.now() - actions.STALE_ACTION_AFTER * 2)
    assert actions.start("orders").result == ActionResult.DONE


def test_runs_given_to_an_action_that_enqueues_no_run_is_a_usage_error_that_changes_nothing(pipeline, enqueued, capsys):
    # `pipeline stop orders --runs 3` said "stop: done" and dropped the number: the operator may have meant restart.
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.RUNNING)
    for action in ("stop", "pause"):
        code, _, err = run_command(capsys, action, "orders", "--runs", "3")
        assert code == 2 and "unrecognized arguments: --runs 3" in err
    assert (reloaded(pipeline).desired_state, pipeline.epoch, pipeline.parallel_runs) == (DesiredState.RUNNING, 0, 1)


@pytest.mark.parametrize("action,state", [
    ("start", DesiredState.STOPPED), ("resume", DesiredState.PAUSED), ("restart", DesiredState.RUNNING)])
def test_an_action_that_enqueues_a_run_on_a_cluster_no_longer_configured_is_refused_and_recorded(
        pipeline, enqueued, action, state):
    # It was "done, 1 run(s) enqueued", and the run failed later in the worker.
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=state, cluster="gone")
    with pytest.raises(actions.ActionRefused, match="Kafka cluster 'gone': no such cluster .*TALLY_KAFKA_CLUSTERS"):
        actions.perform(action, "orders", "bob")
    assert (reloaded(pipeline).desired_state, pipeline.epoch) == (state, 0)
    assert enqueued == []
    entry = ActionLog.objects.get()
    assert (entry.action, entry.actor, entry.result) == (action, "bob", ActionResult.REFUSED)
    assert "no such cluster" in entry.message


def test_a_pipeline_on_a_cluster_no_longer_configured_can_still_be_stopped(pipeline, enqueued):
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.RUNNING, cluster="gone")
    assert actions.stop("orders").result == ActionResult.DONE
