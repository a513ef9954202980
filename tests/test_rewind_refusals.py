"""Every refused rewind input, through the command line: the message, the exit code (1 refused, 2 usage
error), the refusal in the action log, and nothing moved."""
from datetime import UTC, datetime, timedelta

import pytest

from consumers.models import ActionLog, ActionResult, Pipeline
from tests.commands import run_command
from tests.ops_helpers import EXACTLY_ONCE, catch_up, drop_demo_sinks, positions, seed, sink_rows

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]




@pytest.fixture
def consumed(kafka_bootstrap, settings):
    settings.KAFKA_SESSION_TIMEOUT_MS = 6000
    seed(20)
    catch_up(EXACTLY_ONCE)
    yield
    drop_demo_sinks()


def state():
    pipeline = Pipeline.objects.get(name=EXACTLY_ONCE)
    return positions(EXACTLY_ONCE), sink_rows(EXACTLY_ONCE), pipeline.epoch, pipeline.desired_state


FUTURE = (datetime.now(UTC) + timedelta(days=1)).isoformat()
REFUSALS = [
    (["--to-offset", "11"], "partition 0: offset 11 is outside [0, 10]"),
    (["--to-offset", "-1"], "to-offset needs an offset >= 0"),
    (["--shift-by", "-11"], "offset -1 is outside [0, 10]"),
    (["--shift-by", "1"], "offset 11 is outside [0, 10]"),
    (["--to-datetime", FUTURE], "is in the future"),
    (["--to-datetime", "yesterday"], "needs an ISO-8601 date and time"),
    (["--to-datetime", "2026-13-45T99:00:00"], "needs an ISO-8601 date and time"),
    (["--by-duration", "10 minutes"], "needs an ISO-8601 duration"),
    (["--by-duration", "P1M"], "needs an ISO-8601 duration in days, hours, minutes or seconds"),
    (["--by-duration=-PT5M"], "needs a positive duration"),
    (["--to-offset", "abc"], "to-offset needs an integer"),
    (["--to-earliest", "--partition", "7"], "Unknown partition(s) 7 of topic 'nums'"),
]


# Ids name the future instant instead of printing it: pytest-xdist workers collect at different moments and
# must collect the same test ids.
@pytest.mark.parametrize("arguments,message", REFUSALS,
                         ids=[" ".join(a).replace(FUTURE, "tomorrow") for a, _ in REFUSALS])
def test_bad_input_is_refused_with_exit_code_1_and_nothing_moves(consumed, capsys, arguments, message):
    before = state()
    code, out, err = run_command(capsys, "rewind", EXACTLY_ONCE, *arguments, "--execute")
    assert code == 1
    assert message in err and "Refused" in err
    assert state() == before
    entry = ActionLog.objects.filter(action="rewind").latest("created_at")
    assert entry.result == ActionResult.REFUSED and message in entry.message


def test_an_unknown_pipeline_is_refused(consumed, capsys):
    code, _, err = run_command(capsys, "rewind", "no-such-pipeline", "--to-earliest")
    assert code == 1 and "No pipeline named 'no-such-pipeline'" in err
    assert ActionLog.objects.get(result=ActionResult.REFUSED).params["pipeline"] == "no-such-pipeline"


def test_a_rewind_while_another_action_runs_on_the_pipeline_is_refused(consumed, capsys):
    pipeline = Pipeline.objects.get(name=EXACTLY_ONCE)
    ActionLog.objects.create(pipeline=pipeline, action="rewind", actor="bob", result=ActionResult.RUNNING)
    before = state()
    code, _, err = run_command(capsys, "rewind", EXACTLY_ONCE, "--to-earliest", "--rollback-sink", "--execute")
    assert code == 1 and "Another action is running on pipeline 'nums-exactly-once': rewind by bob" in err
    assert state() == before


@pytest.mark.parametrize("arguments", [[], ["--to-earliest", "--to-latest"], ["--to-offset"],
                                       ["--shift-by", "1", "--partition", "x"]],
                         ids=["no-mode", "two-modes", "missing-value", "bad-partition"])
def test_usage_errors_exit_with_code_2_and_move_nothing(consumed, capsys, arguments):
    before = state()
    code, _, err = run_command(capsys, "rewind", EXACTLY_ONCE, *arguments)
    assert code == 2 and "usage:" in err
    assert state() == before


def test_a_rewind_without_execute_previews_and_moves_nothing_and_with_execute_moves(consumed, capsys):
    before = state()
    code, out, _ = run_command(capsys, "rewind", EXACTLY_ONCE, "--to-earliest", "--rollback-sink")
    assert code == 0 and "Preview only: nothing changed. Add --execute to rewind." in out
    assert state() == before
    assert ActionLog.objects.get(action="rewind").dry_run is True
    code, out, _ = run_command(capsys, "rewind", EXACTLY_ONCE, "--to-earliest", "--rollback-sink", "--execute")
    assert code == 0 and "Preview only" not in out
    assert positions(EXACTLY_ONCE) == {0: 0, 1: 0} and sink_rows(EXACTLY_ONCE) == []
    code, _, err = run_command(capsys, "rewind", EXACTLY_ONCE, "--to-earliest", "--execute", "--dry-run")
    assert code == 2 and "not allowed with argument" in err


def test_the_dry_run_prints_the_plan_as_json_and_exits_0(consumed, capsys):
    import json

    code, out, _ = run_command(capsys, "rewind", EXACTLY_ONCE, "--shift-by", "-4", "--dry-run", "--json")
    data = json.loads(out)
    assert code == 0 and data["dry_run"] is True and data["reprocess"] == 8
    assert [(p["current"], p["new"]) for p in data["partitions"]] == [(10, 6), (10, 6)]
    assert positions(EXACTLY_ONCE) == {0: 10, 1: 10}


def test_roll_back_sink_of_a_pipeline_whose_sink_table_is_gone_is_refused_and_audited_at_every_step(consumed, client):
    """The dry run answered a 500 (and was not in the action log); the real run a 500 after pausing the pipeline."""
    from django.db import connection

    from consumers.engine import sinks
    from tests.views_helpers import make_operator

    pipeline = Pipeline.objects.get(name=EXACTLY_ONCE)
    with connection.cursor() as cursor:
        sinks.drop_sink_table(cursor, pipeline.sink_table)
    client.force_login(make_operator())
    for dry_run in (True, False):
        response = client.post(f"/api/pipelines/{EXACTLY_ONCE}/rewind", {"mode": "to-offset", "value": "3",
                               "rollback_sink": True, "dry_run": dry_run}, content_type="application/json")
        assert response.status_code == 409, response.content
        assert f"the sink table '{pipeline.sink_table}' does not exist" in response.json()["error"]
    refusals = ActionLog.objects.filter(action="rewind").order_by("created_at")
    assert [(e.dry_run, e.result) for e in refusals] == [(True, ActionResult.REFUSED), (False, ActionResult.REFUSED)]
    after = Pipeline.objects.get(pk=pipeline.pk)
    assert (positions(EXACTLY_ONCE), after.epoch, after.desired_state) == ({0: 10, 1: 10}, pipeline.epoch,
                                                                          pipeline.desired_state)


def test_a_rewind_whose_runs_do_not_end_in_time_is_refused_and_the_pipeline_keeps_running(
        consumed, capsys, settings, monkeypatch):
    from django.utils import timezone

    from consumers.models import ConsumerRun, DesiredState, RunState
    from consumers.operations import actions

    enqueued = []
    monkeypatch.setattr(actions, "enqueue_run", lambda pipeline_id, epoch, runs=1: enqueued.append(epoch))
    settings.TALLY_REWIND_STOP_TIMEOUT_SECONDS = 1
    pipeline = Pipeline.objects.get(name=EXACTLY_ONCE)
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.RUNNING)
    stuck = ConsumerRun.objects.create(pipeline=pipeline, epoch=pipeline.epoch, host="elsewhere", pid=1,
                                       state=RunState.RUNNING, heartbeat_at=timezone.now())
    before_positions, before_rows = positions(EXACTLY_ONCE), sink_rows(EXACTLY_ONCE)
    code, _, err = run_command(capsys, "rewind", EXACTLY_ONCE, "--to-earliest", "--rollback-sink", "--execute")
    assert code == 1 and f"Run(s) {stuck.pk} of pipeline 'nums-exactly-once' did not end within 1 s" in err
    assert (positions(EXACTLY_ONCE), sink_rows(EXACTLY_ONCE)) == (before_positions, before_rows)
    pipeline.refresh_from_db()
    assert pipeline.desired_state == DesiredState.RUNNING and enqueued == [pipeline.epoch]
    assert ActionLog.objects.get(action="rewind").result == ActionResult.REFUSED


def test_an_action_taken_once_the_rewind_is_done_is_not_undone_by_the_rewind_resuming_the_pipeline(
        consumed, monkeypatch):
    """The rewind's entry is done when its transaction commits; another operator may stop the pipeline before the
    rewind resumes it. The stop stands: the pipeline is not set running again behind the operator's back."""
    from consumers.models import DesiredState
    from consumers.operations import actions
    from consumers.operations import rewind as rewind_ops

    enqueued = []
    monkeypatch.setattr(actions, "enqueue_run", lambda pipeline_id, epoch, runs=1: enqueued.append(epoch))
    pipeline = Pipeline.objects.get(name=EXACTLY_ONCE)
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.RUNNING)
    applied = rewind_ops._apply

    def apply_then_bob_stops(*args, **kwargs):
        deleted = applied(*args, **kwargs)
        assert actions.stop(EXACTLY_ONCE, actor="bob").result == ActionResult.DONE
        return deleted

    monkeypatch.setattr(rewind_ops, "_apply", apply_then_bob_stops)
    result = rewind_ops.rewind(EXACTLY_ONCE, "shift-by", "-4", actor="alice")

    assert positions(EXACTLY_ONCE) == {0: 6, 1: 6}
    pipeline.refresh_from_db()
    assert (pipeline.desired_state, enqueued, result.resumed) == (DesiredState.STOPPED, [], False)


def test_a_rewind_of_a_pipeline_whose_cluster_is_not_configured_is_a_409_naming_it_and_nothing_moves(consumed, client):
    """It was a 503, 'Kafka cannot be used now', as if waiting would help: the clusters file no longer has it."""
    from tests.views_helpers import make_operator

    Pipeline.objects.filter(name=EXACTLY_ONCE).update(cluster="gone")
    before = state()
    client.force_login(make_operator())
    for dry_run in (True, False):
        response = client.post(f"/api/pipelines/{EXACTLY_ONCE}/rewind", {"mode": "to-earliest", "dry_run": dry_run},
                               content_type="application/json")
        assert response.status_code == 409, response.content
        assert "Kafka cluster 'gone': no such cluster" in response.json()["error"]
    refusals = ActionLog.objects.filter(action="rewind").order_by("created_at")
    assert [(e.dry_run, e.result) for e in refusals] == [(True, ActionResult.REFUSED), (False, ActionResult.REFUSED)]
    assert state() == before
