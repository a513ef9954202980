"""The commit protocol against the real PostgreSQL: replays skipped, gaps refused, zombies fenced,
bad records dead-lettered — each batch all or nothing."""
import pytest
from django.db import connection

from consumers.engine import commit, db, sinks
from consumers.engine.transforms import SourceRecord, resolve
from consumers.models import BatchLedger, DeadLetter, DeliveryMode, PartitionOffset, Pipeline


def records(partition, offsets, value=None):
    return [SourceRecord(partition, o, None, (value or str(o + 1)).encode()) for o in offsets]


@pytest.fixture
def pipeline_and_conn(transactional_db):
    def make(mode=DeliveryMode.EXACTLY_ONCE, transform="int_value"):
        pipeline = Pipeline.objects.create(name=f"p-{mode}", topic="nums", sink_table=f"sink_{mode}",
                                           delivery_mode=mode, transform=transform, epoch=1)
        with connection.cursor() as cur:
            sinks.ensure_sink_table(cur, pipeline.sink_table, resolve(transform), pipeline.is_exactly_once)
        return pipeline, commit.Target.for_pipeline(pipeline)

    conn = db.connect()
    yield make, conn
    conn.close()
    with connection.cursor() as cur:
        for pipeline in Pipeline.objects.all():
            sinks.drop_sink_table(cur, pipeline.sink_table)


def sink_offsets(table):
    with connection.cursor() as cur:
        cur.execute(f'SELECT source_offset FROM "{table}" ORDER BY source_offset')  # test-only, fixed name
        return [r[0] for r in cur.fetchall()]


def test_a_batch_writes_rows_ledger_and_next_offset_together(pipeline_and_conn):
    make, conn = pipeline_and_conn
    pipeline, target = make()
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    outcomes = commit.commit_batch(conn, target, 1, {0: records(0, range(0, 10))})
    assert outcomes == [commit.PartitionOutcome(0, 0, 10, 10, 10, 0, 0)]
    assert sink_offsets(pipeline.sink_table) == list(range(10))
    assert PartitionOffset.objects.get(pipeline=pipeline, partition=0).next_offset == 10
    ledger = BatchLedger.objects.get(pipeline=pipeline)
    assert (ledger.first_offset, ledger.end_offset, ledger.rows_written) == (0, 10, 10)


def test_exactly_once_skips_a_replay_and_writes_only_what_is_new(pipeline_and_conn):
    make, conn = pipeline_and_conn
    pipeline, target = make()
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    commit.commit_batch(conn, target, 1, {0: records(0, range(0, 10))})
    outcomes = commit.commit_batch(conn, target, 1, {0: records(0, range(5, 15))})
    assert outcomes[0].skipped == 5 and outcomes[0].first_offset == 10
    assert sink_offsets(pipeline.sink_table) == list(range(15))


def test_exactly_once_refuses_a_batch_that_starts_above_next_offset(pipeline_and_conn):
    make, conn = pipeline_and_conn
    pipeline, target = make()
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    with pytest.raises(commit.Gap, match="offsets 0..4 would be lost"):
        commit.commit_batch(conn, target, 1, {0: records(0, range(5, 10))})
    assert sink_offsets(pipeline.sink_table) == []
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 0


def test_a_writer_from_an_older_epoch_is_fenced_and_writes_nothing(pipeline_and_conn):
    make, conn = pipeline_and_conn
    pipeline, target = make()
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    pipeline.bump_epoch()
    with pytest.raises(commit.Fenced):
        commit.commit_batch(conn, target, 1, {0: records(0, range(0, 3))})
    assert sink_offsets(pipeline.sink_table) == []
    assert not BatchLedger.objects.exists()


def test_a_bad_record_becomes_a_dead_letter_in_the_same_transaction(pipeline_and_conn):
    make, conn = pipeline_and_conn
    pipeline, target = make()
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    batch = records(0, [0, 1]) + records(0, [2], value="not-a-number") + records(0, [3])
    outcome, = commit.commit_batch(conn, target, 1, {0: batch})
    assert (outcome.rows_written, outcome.dead_letters, outcome.end_offset) == (3, 1, 4)
    letter = DeadLetter.objects.get(pipeline=pipeline)
    assert letter.offset == 2 and "not an integer" in letter.error
    assert sink_offsets(pipeline.sink_table) == [0, 1, 3]


def test_the_classic_modes_write_replays_again(pipeline_and_conn):
    make, conn = pipeline_and_conn
    pipeline, target = make(DeliveryMode.AT_LEAST_ONCE)
    commit.commit_batch(conn, target, 1, {0: records(0, range(0, 4))})
    commit.commit_batch(conn, target, 1, {0: records(0, range(2, 6))})
    assert sink_offsets(pipeline.sink_table) == [0, 1, 2, 2, 3, 3, 4, 5]
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 6


def test_exactly_once_replays_inside_a_rewind_window_skip_rows_the_sink_already_has(pipeline_and_conn):
    make, conn = pipeline_and_conn
    pipeline, target = make()
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    commit.commit_batch(conn, target, 1, {0: records(0, range(0, 10))})
    # A rewind to 4 that keeps the sink: offsets 4..9 come again and must not be duplicated.
    PartitionOffset.objects.filter(pipeline=pipeline).update(next_offset=4, replay_until=10)
    commit.commit_batch(conn, target, 1, {0: records(0, range(4, 12))})
    assert sink_offsets(pipeline.sink_table) == list(range(12))
    position = PartitionOffset.objects.get(pipeline=pipeline)
    assert (position.next_offset, position.replay_until) == (12, None)
