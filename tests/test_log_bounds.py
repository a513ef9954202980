"""Real loss stays loud: stored positions against the log's bounds (a stand-in watermark source here; the
embedded broker does not implement DeleteRecords), with the real PostgreSQL."""
import pytest
from django.db import connection

from consumers.engine import commit, db, log_bounds, sinks
from consumers.engine.transforms import resolve
from consumers.kafka.admin import Watermarks
from consumers.models import BatchLedger, LogTruncatedPolicy, PartitionOffset, Pipeline
from consumers.reconciliation import reconcile
from tests.test_reconcile import FakeKafka, kinds, records


@pytest.fixture
def truncated(transactional_db):
    """A pipeline that read [0, 10) of partition 0; then retention moved the log start to 25."""
    conn = db.connect()
    pipeline = Pipeline.objects.create(name="trunc", topic="nums", sink_table="trunc_sink", epoch=1)
    with connection.cursor() as cur:
        sinks.ensure_sink_table(cur, pipeline.sink_table, resolve("int_value"), True)
    target = commit.Target.for_pipeline(pipeline)
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    commit.commit_batch(conn, target, 1, {0: records(0, range(0, 10))})
    yield pipeline, target, conn
    conn.close()
    with connection.cursor() as cur:
        sinks.drop_sink_table(cur, pipeline.sink_table)


def test_by_default_a_log_start_past_the_stored_position_stops_with_the_reason(truncated):
    pipeline, target, conn = truncated
    with pytest.raises(log_bounds.LogBoundsError, match=r"offsets 10\.\.24 were deleted before they were read"):
        log_bounds.check(conn, pipeline, target, 1, {0: 10}, {0: Watermarks(25, 40)})
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 10  # nothing moved
    assert BatchLedger.objects.filter(pipeline=pipeline).count() == 1


def test_the_skip_policy_moves_to_the_log_start_and_records_it_in_the_ledger(truncated):
    pipeline, target, conn = truncated
    pipeline.on_log_truncated = LogTruncatedPolicy.SKIP
    positions = {0: 10}
    skipped = log_bounds.check(conn, pipeline, target, 1, positions, {0: Watermarks(25, 40)})
    assert [s.note for s in skipped] == ["skipped by retention: offsets 10..24"] and positions == {0: 25}
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 25
    row = BatchLedger.objects.filter(pipeline=pipeline).latest("id")
    assert (row.first_offset, row.end_offset, row.records) == (10, 25, 0)
    assert row.note == "skipped by retention: offsets 10..24"
    # Reconciliation reports them lost before read (an incident: the lost-records alert fires on it).
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 40}, log_start={0: 25}, committed={0: 25}))
    assert kinds(report, "unrecoverable") == [(10, 25, 15)] and report.unrecoverable == 15
    assert not report.exact and report.status == "ERR"


def test_the_skip_policy_refuses_a_fenced_writer(truncated):
    pipeline, target, conn = truncated
    pipeline.on_log_truncated = LogTruncatedPolicy.SKIP
    with pytest.raises(commit.Fenced):
        log_bounds.check(conn, pipeline, target, 0, {0: 10}, {0: Watermarks(25, 40)})
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 10


def test_a_stored_position_above_the_log_end_is_an_error_and_reconciliation_says_so(truncated):
    pipeline, target, conn = truncated
    with pytest.raises(log_bounds.LogBoundsError, match="position ahead of log end"):
        log_bounds.check(conn, pipeline, target, 1, {0: 10}, {0: Watermarks(0, 4)})  # topic recreated
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 4}, committed={0: 10}))
    assert report.status == "ERR" and kinds(report, "ahead") == [(4, 10, 6)]
    assert report.lag_records == 0  # no silent "waiting": the status says what is wrong


def test_positions_inside_the_log_pass(truncated):
    pipeline, target, conn = truncated
    assert log_bounds.check(conn, pipeline, target, 1, {0: 10}, {0: Watermarks(0, 10)}) == []
