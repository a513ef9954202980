"""The one definition of "a run is alive" and the run state transitions, with injected time."""
import re
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from consumers.models import ConsumerRun, Pipeline, RunState
from dashboard import status
from tests.alert_clock import NOW, frozen_clock  # noqa: F401 - an autouse fixture


@pytest.fixture
def pipeline(db, settings):
    settings.TALLY_RUN_LEASE_SECONDS = 15
    return Pipeline.objects.create(name="nums", topic="nums", sink_table="nums_sink")


def run(pipeline, *, state=RunState.RUNNING, heartbeat_age=1, started_age=60):
    return ConsumerRun.objects.create(pipeline=pipeline, epoch=1, host="w1", pid=7, state=state,
                                      started_at=NOW - timedelta(seconds=started_age),
                                      heartbeat_at=NOW - timedelta(seconds=heartbeat_age))


def alive(pipeline, now=NOW):
    return set(ConsumerRun.objects.filter(pipeline=pipeline).alive(now))


def test_a_run_is_alive_while_it_has_not_ended_and_heartbeats_within_the_lease(pipeline):
    fresh, starting = run(pipeline, heartbeat_age=15), run(pipeline, state=RunState.STARTING, heartbeat_age=3)
    expired = run(pipeline, heartbeat_age=16)
    ended = [run(pipeline, state=state, heartbeat_age=1)
             for state in (RunState.STOPPED, RunState.FENCED, RunState.CRASHED, RunState.FAILED)]
    assert alive(pipeline) == {fresh, starting}
    assert expired not in alive(pipeline) and not set(ended) & alive(pipeline)
    assert alive(pipeline, now=NOW + timedelta(seconds=4)) == {starting}


def test_the_lease_is_one_setting(pipeline, settings):
    old = run(pipeline, heartbeat_age=40)
    assert old not in alive(pipeline)
    settings.TALLY_RUN_LEASE_SECONDS = 60
    assert old in alive(pipeline)


def test_a_run_started_after_another_runs_last_heartbeat_replaced_it(pipeline):
    killed = run(pipeline, heartbeat_age=5, started_age=60)
    restart = run(pipeline, heartbeat_age=1, started_age=3)
    skewed = run(pipeline, heartbeat_age=5, started_age=4)   # its own start reads later than its heartbeat
    serving = set(ConsumerRun.objects.filter(pipeline=pipeline).alive(NOW).not_restarted())
    assert killed in alive(pipeline) and killed not in serving
    assert restart in serving and skewed not in serving   # the restart also started after skewed's heartbeat
    ConsumerRun.objects.filter(pk=restart.pk).delete()
    assert set(ConsumerRun.objects.filter(pipeline=pipeline).alive(NOW).not_restarted()) == {skewed}


def test_transitions_write_state_heartbeat_and_reason(pipeline):
    row = run(pipeline, state=RunState.STARTING, heartbeat_age=10)
    runs = ConsumerRun.objects.filter(pk=row.pk)
    runs.mark_running(NOW)
    row.refresh_from_db()
    assert (row.state, row.heartbeat_at) == (RunState.RUNNING, NOW)
    runs.heartbeat(NOW + timedelta(seconds=1), records_processed=5, assigned_partitions=[0, 2])
    row.refresh_from_db()
    assert (row.heartbeat_at, row.records_processed, row.assigned_partitions) == (
        NOW + timedelta(seconds=1), 5, [0, 2])
    runs.end(RunState.FENCED, "fenced: " + "x" * 3000, NOW + timedelta(seconds=2), records_processed=6)
    row.refresh_from_db()
    assert (row.state, row.ended_at, row.heartbeat_at, row.records_processed, len(row.end_reason)) == (
        RunState.FENCED, NOW + timedelta(seconds=2), NOW + timedelta(seconds=2), 6, 2000)


def test_only_a_run_that_has_not_ended_can_be_declared_crashed(pipeline):
    live, stopped = run(pipeline, heartbeat_age=100), run(pipeline, state=RunState.STOPPED)
    assert ConsumerRun.objects.filter(pk__in=[live.pk, stopped.pk]).declare_crashed("lease expired", NOW) == 1
    live.refresh_from_db()
    stopped.refresh_from_db()
    assert (live.state, live.ended_at, live.end_reason) == (RunState.CRASHED, NOW, "lease expired")
    assert stopped.state == RunState.STOPPED


def test_serving_is_alive_and_not_restarted(pipeline):
    killed = run(pipeline, heartbeat_age=5, started_age=60)
    restart = run(pipeline, heartbeat_age=1, started_age=3)
    runs = ConsumerRun.objects.filter(pipeline=pipeline)
    assert set(runs.serving(NOW)) == {restart}
    assert set(runs.restarted()) == {killed}


def liveness(pipeline, run_row, now=NOW):
    return ConsumerRun.objects.with_liveness(now).get(pk=run_row.pk).liveness


def test_a_killed_run_reads_dead_since_its_last_heartbeat_never_running(pipeline):
    killed = run(pipeline, heartbeat_age=120)
    shown = liveness(pipeline, killed)
    assert (shown.kind, shown.label) == ("dead", "dead")
    assert shown.since == NOW - timedelta(seconds=120) and "15 s lease" in shown.reason
    assert shown.as_json()["live"] is False


def test_a_run_replaced_by_its_restart_reads_dead_with_that_reason(pipeline):
    killed = run(pipeline, heartbeat_age=5, started_age=60)
    restart = run(pipeline, heartbeat_age=1, started_age=3)
    assert liveness(pipeline, killed).reason == "a later run replaced it (a restart)"
    assert (liveness(pipeline, restart).kind, liveness(pipeline, restart).label) == ("live", "running")


def test_an_ended_run_reads_how_it_ended(pipeline):
    ended = run(pipeline, state=RunState.FAILED, heartbeat_age=1)
    ConsumerRun.objects.filter(pk=ended.pk).update(end_reason="bad_record: offset 7", ended_at=NOW)
    shown = liveness(pipeline, ended)
    assert (shown.kind, shown.label, shown.reason) == ("ended", "failed", "bad_record: offset 7")


def test_the_halted_run_is_the_latest_run_failed_in_the_current_epoch(pipeline):
    assert pipeline.halted_run() is None
    failed = run(pipeline, state=RunState.FAILED, started_age=30)
    Pipeline.objects.filter(pk=pipeline.pk).update(epoch=1)
    pipeline.refresh_from_db()
    assert pipeline.halted_run() == failed
    assert set(ConsumerRun.objects.halted()) == {failed}
    pipeline.bump_epoch()  # an operator's restart: the old halt no longer holds the pipeline
    assert pipeline.halted_run() is None
    Pipeline.objects.filter(pk=pipeline.pk).update(epoch=1)
    pipeline.refresh_from_db()
    run(pipeline, started_age=10)  # a later run that is not failed
    assert pipeline.halted_run() is None


def test_the_pipeline_page_and_api_show_a_killed_run_dead(pipeline, client, django_user_model):
    from tests.views_helpers import make_viewer

    run(pipeline, heartbeat_age=120)
    client.force_login(make_viewer())
    page = client.get("/pipelines/nums/").content.decode()
    table = page[page.index('id="runs"'):]
    table = table[:table.index("</table>")]
    assert 'data-liveness="dead"' in table and ">running<" not in table
    runs = client.get("/api/pipelines/nums/").json()["runs"]
    assert [(r["state"], r["stored_state"], r["live"]) for r in runs] == [("dead", "running", False)]


def test_the_admins_runs_list_shows_liveness_by_the_same_rule(pipeline, client, django_user_model):
    run(pipeline, heartbeat_age=120)
    client.force_login(django_user_model.objects.create_superuser("root", password="pw-root-123"))
    page = client.get("/admin/consumers/consumerrun/").content.decode()
    assert "dead: no heartbeat within the 15 s lease" in page


def rows_read_from_runs(query: str) -> int:
    """Rows the plan of `query` reads from the runs table (every scan node, times its loops), sequential scans off (a
    test's few rows would rather be scanned whole whatever the query)."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute(f"EXPLAIN (ANALYZE, TIMING off) {query}")
        plan = [row[0] for row in cur.fetchall()]
    read = [re.search(r"actual rows=(\d+) loops=(\d+)", line) for line in plan
            if "Scan" in line and "consumers_consumerrun" in line]
    return sum(int(m[1]) * int(m[2]) for m in read if m)


def test_the_newest_runs_and_their_liveness_cost_the_runs_shown_not_every_run_ever(pipeline):
    # "Was it replaced by a restart?" asked as "is its id among the restarted runs" made PostgreSQL work out every
    # restarted run of every pipeline for each view: the pipeline page took 1.5 s with 200,000 runs in the table.
    with connection.cursor() as cur:   # a long history of crash-loop restarts, generated: a run a minute
        cur.execute("""INSERT INTO consumers_consumerrun (pipeline_id, epoch, host, pid, task_id, engine, state,
                           assigned_partitions, claimed_partitions, records_processed, started_at, heartbeat_at,
                           ended_at, end_reason)
                       SELECT %s, i, 'w1', 7, '', 'python', 'crashed', '[]', '[]', 0, %s - make_interval(mins => i),
                              %s - make_interval(mins => i), %s - make_interval(mins => i), 'crashed'
                       FROM generate_series(20000, 1, -1) AS i""", [pipeline.pk, NOW, NOW, NOW])
        cur.execute("ANALYZE consumers_consumerrun")
    run(pipeline, started_age=30)

    with CaptureQueriesContext(connection) as captured:
        runs = status.recent_runs(pipeline, now=NOW)
    assert [r.liveness.kind for r in runs] == ["live"] + ["ended"] * 9
    [query] = [q["sql"] for q in captured.captured_queries]

    assert rows_read_from_runs(query) < 100


def test_restarted_is_one_rule_however_it_is_asked(pipeline):
    """A run is restarted when another run of its pipeline started after its last heartbeat: strictly after, never
    itself, never a run of another pipeline. restarted(), not_restarted() and with_liveness share its one text
    (replaced_by_a_restart); this history is built so that a rule off in any of those ways answers otherwise."""
    killed = run(pipeline, heartbeat_age=5, started_age=60)
    restart = run(pipeline, heartbeat_age=1, started_age=3)
    quiet = Pipeline.objects.create(name="quiet", topic="quiet", sink_table="quiet_sink")
    skewed = run(quiet, heartbeat_age=5, started_age=4)   # its own start reads later than its heartbeat
    tied = run(quiet, heartbeat_age=4, started_age=30)    # skewed started at its last heartbeat, not after it
    elsewhere = run(Pipeline.objects.create(name="later", topic="later", sink_table="later_sink"),
                    heartbeat_age=0, started_age=0.5)     # after restart's heartbeat, but of another pipeline
    runs = ConsumerRun.objects.all()
    assert set(runs.restarted()) == {killed}
    assert set(runs.not_restarted()) == {restart, skewed, tied, elsewhere}
    assert {r for r in runs.with_liveness(NOW) if r.is_restarted} == {killed}
    assert set(runs.serving(NOW)) == {restart, skewed, tied, elsewhere}
