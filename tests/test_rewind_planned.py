"""Which ranges reconciliation calls skipped on purpose by a rewind (consumers/reconciliation/rewinds.py), read
from the action log that consumers/operations/rewind.py writes. Kafka is a stand-in (tests/test_reconcile.py)."""
from datetime import UTC, datetime

import pytest

from consumers.engine import commit, db
from consumers.kafka import admin as kafka_admin
from consumers.kafka.admin import Watermarks
from consumers.models import ActionLog, DeliveryMode
from consumers.operations.rewind import rewind
from consumers.reconciliation import reconcile
from consumers.reconciliation.rewinds import Rewind, skipped_ranges
from tests.test_reconcile import FakeKafka, records, run_sql, setup  # noqa: F401 (setup: fixture)

AT = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def kafka(monkeypatch):
    """The Kafka calls a rewind makes, answered from the same facts reconciliation is given."""
    facts = FakeKafka(high={0: 40}, committed={0: 25})
    monkeypatch.setattr(kafka_admin, "partitions_for", lambda topic, cluster=None: [0])
    monkeypatch.setattr(kafka_admin, "watermarks",
                        lambda topic, partitions=None, cluster=None, **kw: {0: Watermarks(0, facts.high[0])})
    monkeypatch.setattr(kafka_admin, "committed_offsets",
                        lambda group, topic, partitions=None, cluster=None: dict(facts.committed))
    monkeypatch.setattr(kafka_admin, "commit_offsets",
                        lambda group, topic, offsets, cluster=None: facts.committed.update(offsets))
    return facts


@pytest.mark.parametrize("mode, value, skipped", [("to-current", None, 0), ("to-offset", "30", 5)])
def test_a_classic_pipelines_rewind_skips_from_where_it_resumed_and_its_earlier_losses_stay_lost(
        setup, kafka, mode, value, skipped):  # noqa: F811
    pipeline, write = setup(DeliveryMode.AT_MOST_ONCE)
    write(0, range(0, 10))   # Kafka's offset was committed to 25 and the consumer died before writing 10..24
    assert reconcile.reconcile_pipeline(pipeline, kafka=kafka).lost == 15

    result = rewind(pipeline.name, mode, value, actor="op")

    assert sum(move.skip for move in result.moves) == skipped
    entry = ActionLog.objects.get(pk=result.action_log.pk)
    assert (entry.offsets_before, entry.offsets_after) == ({"0": 25}, {"0": 25 + skipped})
    report = reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    part = report.partitions[0]
    assert (part.lost, part.skipped) == (15, skipped)
    assert report.status == "ERR"


def test_a_range_skipped_then_read_again_after_a_rewind_back_reports_what_it_lost(setup, kafka):  # noqa: F811
    pipeline, _ = setup()   # exactly-once
    kafka.high = {0: 70}
    conn = db.connect()

    def write(offsets):
        pipeline.refresh_from_db()   # each rewind fences the runs before it: write at the current epoch
        commit.ensure_positions(conn, pipeline.pk, {0: offsets[0]})
        commit.commit_batch(conn, commit.Target.for_pipeline(pipeline), pipeline.epoch, {0: records(0, offsets)})

    try:
        write(range(0, 20))
        rewind(pipeline.name, "to-offset", "60", actor="op")                  # skips 20..59 on purpose
        write(range(60, 70))
        rewind(pipeline.name, "to-earliest", rollback_sink=True, actor="op")  # and reads everything again
        write(range(0, 70))
    finally:
        conn.close()
    kafka.committed = {0: 70}
    assert reconcile.reconcile_pipeline(pipeline, kafka=kafka).exact

    run_sql(f"DELETE FROM {pipeline.sink_table} WHERE source_offset BETWEEN 30 AND 34")
    report = reconcile.reconcile_pipeline(pipeline, kafka=kafka, full=True)
    part = report.partitions[0]
    assert (part.lost, part.skipped) == (5, 0)
    assert report.status == "ERR"


@pytest.mark.parametrize("moves, expected", [
    ([(10, 50)], [(10, 50)]),                    # forward: skipped
    ([(10, 50), (50, 5)], []),                   # back below it: all read again
    ([(10, 50), (50, 30)], [(10, 30)]),          # back into it: cut where the reading starts again
    ([(10, 50), (50, 50)], [(10, 50)]),          # to the current offset: nothing changes
    ([(10, 50), (50, 5), (20, 60)], [(20, 60)]),  # skipped again later
    ([(10, 20), (30, 40), (40, 35)], [(10, 20), (30, 35)]),
])
def test_skipped_ranges_drop_what_a_later_rewind_back_reads_again(moves, expected):
    history = [Rewind(AT, {0: before}, {0: after}) for before, after in moves]
    assert skipped_ranges(history).get(0, []) == expected
