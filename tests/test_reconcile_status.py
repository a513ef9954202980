"""The lag evaluation rules (after Burrow's), on their own and through reconcile_pipeline with stored
snapshots, runs and rewinds."""
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from consumers.kafka.admin import Watermarks
from consumers.models import ActionLog, ConsumerRun, LagSnapshot, PartitionOffset, Pipeline, RunState
from consumers.reconciliation import reconcile
from consumers.reconciliation.lag_status import PartitionFacts, Sample, evaluate, worst

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=10)


def facts(samples, *, moved_minutes_ago=1, alive=True, rewound=False, incident=False):
    """samples: [(minutes ago, position, lag)], oldest first; the last one is now."""
    series = [Sample(NOW - timedelta(minutes=m), pos, lag) for m, pos, lag in samples]
    return PartitionFacts(series, series[-1].lag, NOW - timedelta(minutes=moved_minutes_ago), alive, rewound,
                          incident, NOW, WINDOW)


def test_a_partition_whose_lag_touched_zero_in_the_window_is_ok():
    assert evaluate(facts([(10, 100, 50), (5, 150, 0), (0, 160, 30)])) == "OK"


def test_lag_growing_in_every_interval_while_the_position_moves_is_a_warning():
    assert evaluate(facts([(10, 100, 10), (6, 150, 20), (3, 200, 20), (0, 210, 35)])) == "WARN"


def test_lag_that_shrinks_once_in_the_window_is_not_a_warning():
    assert evaluate(facts([(10, 100, 10), (6, 150, 30), (3, 200, 20), (0, 210, 35)])) == "OK"


def test_a_live_consumer_whose_position_does_not_move_while_lagging_is_stalled():
    samples = [(10, 100, 10), (5, 100, 20), (0, 100, 30)]
    assert evaluate(facts(samples, moved_minutes_ago=12)) == "STALL"
    assert evaluate(facts(samples, moved_minutes_ago=1)) == "STALL"  # a full window without a move


def test_no_progress_for_longer_than_the_window_and_no_consumer_is_stopped():
    assert evaluate(facts([(10, 100, 10), (0, 100, 30)], moved_minutes_ago=12, alive=False)) == "STOP"
    assert evaluate(facts([(10, 100, 10), (0, 100, 30)], moved_minutes_ago=3, alive=False)) == "OK"


def test_a_rewind_and_a_position_going_back_are_rewind_and_an_incident_is_an_error():
    assert evaluate(facts([(5, 100, 10), (0, 120, 10)], rewound=True)) == "REWIND"
    assert evaluate(facts([(5, 100, 10), (0, 40, 70)])) == "REWIND"
    assert evaluate(facts([(5, 100, 10), (0, 40, 70)], rewound=True, incident=True)) == "ERR"


def test_the_pipeline_status_is_the_worst_of_its_partitions():
    assert worst(["OK", "WARN", "REWIND"]) == "WARN"
    assert worst(["STALL", "STOP", "OK"]) == "STOP"
    assert worst(["STOP", "ERR"]) == "ERR"


class StillKafka:
    """A topic at 500 on partition 0 while the pipeline sits at 100."""

    def watermarks(self, topic):
        return {0: Watermarks(0, 500)}

    def committed_offsets(self, group_id, topic):
        return {0: 100}

    def record_timestamps(self, topic, offsets):
        return {p: int((NOW - timedelta(minutes=30)).timestamp() * 1000) for p in offsets}


@pytest.fixture
def frozen_clock():
    """Rows created with default timestamps (a run's started_at) read the same clock as `now=NOW`."""
    with time_machine.travel(NOW, tick=False):
        yield


@pytest.fixture
def stuck_pipeline(db, frozen_clock):
    pipeline = Pipeline.objects.create(name="stuck", topic="t", sink_table="stuck_sink_absent", epoch=1)
    PartitionOffset.objects.create(pipeline=pipeline, partition=0, next_offset=100)
    PartitionOffset.objects.filter(pipeline=pipeline).update(updated_at=NOW - timedelta(minutes=20))
    for minutes in (9, 6, 3):
        LagSnapshot.objects.create(pipeline=pipeline, partition=0, taken_at=NOW - timedelta(minutes=minutes),
                                   position=100, lag_records=400)
    return pipeline


def test_a_pipeline_that_sits_still_with_no_consumer_is_stopped(stuck_pipeline):
    report = reconcile.reconcile_pipeline(stuck_pipeline, kafka=StillKafka(), now=NOW)
    assert report.status == "STOP" and report.lag_records == 400 and report.lag_seconds == pytest.approx(1800)
    assert report.records_per_second == 0
    assert stuck_pipeline.health.status == "STOP"


def test_a_pipeline_that_sits_still_with_a_live_consumer_is_stalled(stuck_pipeline):
    ConsumerRun.objects.create(pipeline=stuck_pipeline, epoch=1, host="h", pid=1, state=RunState.RUNNING,
                               started_at=NOW - timedelta(minutes=30), heartbeat_at=NOW - timedelta(seconds=5))
    assert reconcile.reconcile_pipeline(stuck_pipeline, kafka=StillKafka(), now=NOW).status == "STALL"


def test_a_run_whose_start_reads_later_than_its_heartbeat_is_not_its_own_restart(stuck_pipeline):
    # The worker that created the row and the one that heartbeats may disagree on the time by a second.
    ConsumerRun.objects.create(pipeline=stuck_pipeline, epoch=1, host="h", pid=1, state=RunState.RUNNING,
                               started_at=NOW - timedelta(seconds=4), heartbeat_at=NOW - timedelta(seconds=5))
    assert reconcile.reconcile_pipeline(stuck_pipeline, kafka=StillKafka(), now=NOW).status == "STALL"


def test_a_run_started_after_the_last_heartbeat_of_another_proves_that_one_dead(stuck_pipeline):
    ConsumerRun.objects.create(pipeline=stuck_pipeline, epoch=1, host="h", pid=1, state=RunState.RUNNING,
                               started_at=NOW - timedelta(seconds=30), heartbeat_at=NOW - timedelta(seconds=5))
    ConsumerRun.objects.create(pipeline=stuck_pipeline, epoch=2, host="h", pid=2, state=RunState.CRASHED,
                               started_at=NOW - timedelta(seconds=3), heartbeat_at=NOW - timedelta(seconds=3))
    assert reconcile.reconcile_pipeline(stuck_pipeline, kafka=StillKafka(), now=NOW).status == "STOP"


def test_a_recent_operator_rewind_turns_a_stopped_pipeline_into_rewind(stuck_pipeline):
    ActionLog.objects.create(pipeline=stuck_pipeline, action="rewind", actor="cli", result="done",
                             created_at=NOW - timedelta(minutes=2))
    assert reconcile.reconcile_pipeline(stuck_pipeline, kafka=StillKafka(), now=NOW).status == "REWIND"
