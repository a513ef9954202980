"""The commit protocol against the real PostgreSQL: replays skipped, gaps refused, zombies fenced,
bad records dead-lettered — each batch all or nothing."""
import pytest

from consumers.engine import commit, db
from consumers.engine.transforms import SourceRecord
from consumers.models import BatchLedger, DeadLetter, DeliveryMode, PartitionOffset, Pipeline
from tests.conftest import drop_sink_tables
from tests.pipelines import create_pipeline
from tests.sink_rows import sink_offsets


def records(partition, offsets, value=None):
    return [SourceRecord(partition, o, None, (value or str(o + 1)).encode()) for o in offsets]


@pytest.fixture
def pipeline_and_conn(transactional_db):
    def make(mode=DeliveryMode.EXACTLY_ONCE, transform="int_value"):
        pipeline = create_pipeline(f"p-{mode}", "nums", f"sink_{mode}", transform, mode, epoch=1)
        return pipeline, commit.Target.for_pipeline(pipeline)

    conn = db.connect()
    yield make, conn
    conn.close()
    drop_sink_tables(pipeline.sink_table for pipeline in Pipeline.objects.all())


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
    with pytest.raises(commit.Gap, match="positions 0..4 were never read"):
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


# --- positions, not offset arithmetic: real logs have holes (transaction markers, aborted records) -----

def ledger_rows(pipeline):
    return list(BatchLedger.objects.filter(pipeline=pipeline).order_by("id")
                .values_list("first_offset", "end_offset", "records"))


def test_a_batch_that_crossed_a_transaction_marker_stores_the_consumers_position_past_it(pipeline_and_conn):
    make, conn = pipeline_and_conn
    pipeline, target = make()
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    # Offsets 0-4 committed, marker at 5; the consumer's position after the poll is 6.
    commit.commit_batch(conn, target, 1, {0: records(0, range(0, 5))}, fetches={0: commit.Fetch(0, 6)})
    assert PartitionOffset.objects.get(pipeline=pipeline, partition=0).next_offset == 6
    # The next poll is fetched from 6: no gap, although offset 5 never arrived.
    commit.commit_batch(conn, target, 1, {0: records(0, range(6, 11))}, fetches={0: commit.Fetch(6, 12)})
    assert PartitionOffset.objects.get(pipeline=pipeline, partition=0).next_offset == 12
    assert ledger_rows(pipeline) == [(0, 6, 5), (6, 12, 5)]
    assert sink_offsets(pipeline.sink_table) == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]


def test_a_batch_fetched_from_the_stored_position_is_not_a_gap_when_its_first_record_is_later(pipeline_and_conn):
    make, conn = pipeline_and_conn
    pipeline, target = make()
    commit.ensure_positions(conn, pipeline.pk, {0: 5})
    # Offsets 5-9 were an aborted transaction and 10 its marker: read_committed returns 11 first.
    outcome, = commit.commit_batch(conn, target, 1, {0: records(0, range(11, 14))},
                                   fetches={0: commit.Fetch(5, 14)})
    assert (outcome.first_offset, outcome.end_offset, outcome.records) == (5, 14, 3)
    assert PartitionOffset.objects.get(pipeline=pipeline, partition=0).next_offset == 14


def test_a_poll_that_crossed_only_a_hole_moves_the_stored_position_with_an_empty_ledger_row(pipeline_and_conn):
    make, conn = pipeline_and_conn
    pipeline, target = make()
    commit.ensure_positions(conn, pipeline.pk, {0: 11})
    outcome, = commit.commit_batch(conn, target, 1, {}, fetches={0: commit.Fetch(11, 12)})
    assert (outcome.first_offset, outcome.end_offset, outcome.records) == (11, 12, 0)
    assert PartitionOffset.objects.get(pipeline=pipeline, partition=0).next_offset == 12
    assert ledger_rows(pipeline) == [(11, 12, 0)]


def test_exactly_once_refuses_a_batch_fetched_from_above_the_stored_position(pipeline_and_conn):
    make, conn = pipeline_and_conn
    pipeline, target = make()
    commit.ensure_positions(conn, pipeline.pk, {0: 5})
    with pytest.raises(commit.Gap, match="fetched from position 6"):
        commit.commit_batch(conn, target, 1, {0: records(0, range(6, 9))}, fetches={0: commit.Fetch(6, 9)})
    assert PartitionOffset.objects.get(pipeline=pipeline, partition=0).next_offset == 5
    assert ledger_rows(pipeline) == []


def test_a_replayed_fetch_that_ends_at_or_below_the_stored_position_writes_nothing(pipeline_and_conn):
    make, conn = pipeline_and_conn
    pipeline, target = make()
    commit.ensure_positions(conn, pipeline.pk, {0: 12})
    outcome, = commit.commit_batch(conn, target, 1, {0: records(0, range(6, 11))}, fetches={0: commit.Fetch(6, 12)})
    assert (outcome.records, outcome.skipped, outcome.end_offset) == (0, 5, 12)
    assert ledger_rows(pipeline) == [] and sink_offsets(pipeline.sink_table) == []
