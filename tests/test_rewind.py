"""Rewinds of the demo pipelines, every mode, against the real broker and PostgreSQL: the dry run changes
nothing; the real run moves the offsets in one audited transaction; after catch-up the exactly-once sink
is exact, row by row, with and without roll back sink."""
import time
from datetime import UTC, datetime

import pytest
from django.db import OperationalError

from consumers.kafka import admin as kafka_admin
from consumers.models import ActionLog, ActionResult, BatchLedger, PartitionOffset, Pipeline
from consumers.operations import rewind as rewind_operation
from consumers.operations.rewind import rewind
from tests.ops_helpers import (
    AT_LEAST_ONCE,
    AT_MOST_ONCE,
    EXACTLY_ONCE,
    catch_up,
    drop_demo_sinks,
    expected_rows,
    positions,
    produce,
    seed,
    sink_rows,
)

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

FIRST, SECOND = 20, 10          # records produced before and after the moment used by to-datetime
TOTAL = FIRST + SECOND          # 15 per partition


@pytest.fixture
def demo(kafka_bootstrap, settings):
    """The demo topic with values 1..30 on 2 partitions (21..30 produced a second after the moment), and
    the exactly-once pipeline caught up."""
    settings.KAFKA_SESSION_TIMEOUT_MS = 6000
    settings.TALLY_REWIND_STOP_TIMEOUT_SECONDS = 10
    seed(FIRST)
    time.sleep(1.1)
    moment = datetime.now(UTC)
    time.sleep(1.1)
    produce(FIRST + 1, TOTAL)
    catch_up(EXACTLY_ONCE)
    yield moment
    drop_demo_sinks()


def snapshot(name):
    pipeline = Pipeline.objects.get(name=name)
    return (positions(name), sink_rows(name), pipeline.epoch, pipeline.desired_state,
            list(PartitionOffset.objects.filter(pipeline=pipeline).values_list("replay_until", flat=True)),
            BatchLedger.objects.filter(pipeline=pipeline, superseded_from__isnull=False).count())


# mode, value, expected new offset per partition (each partition holds 15 records, 10 before the moment)
MODES = [
    ("to-earliest", None, {0: 0, 1: 0}),
    ("to-offset", "4", {0: 4, 1: 4}),
    ("shift-by", "-6", {0: 9, 1: 9}),
    ("to-datetime", "MOMENT", {0: 10, 1: 10}),
    ("by-duration", "PT1H", {0: 0, 1: 0}),
    ("to-current", None, {0: 15, 1: 15}),
]


@pytest.mark.parametrize("mode,value,expected", MODES, ids=[m[0] for m in MODES])
def test_each_mode_dry_run_changes_nothing_and_the_real_run_keeps_the_exactly_once_sink_exact(
        demo, mode, value, expected):
    value = demo.isoformat() if value == "MOMENT" else value
    for rollback_sink in (False, True):
        check_one_rewind(mode, value, expected, rollback_sink)


def check_one_rewind(mode, value, expected, rollback_sink):
    before = snapshot(EXACTLY_ONCE)
    assert before[1] == expected_rows(range(1, TOTAL + 1))

    dry = rewind(EXACTLY_ONCE, mode, value, rollback_sink=rollback_sink, dry_run=True, actor="alice")
    assert {m.partition: m.new for m in dry.moves} == expected
    assert {m.partition: m.reprocess for m in dry.moves} == {p: 15 - n for p, n in expected.items()}
    assert snapshot(EXACTLY_ONCE) == before
    assert dry.action_log.dry_run and dry.action_log.result == ActionResult.DONE

    done = rewind(EXACTLY_ONCE, mode, value, rollback_sink=rollback_sink, actor="alice")
    assert positions(EXACTLY_ONCE) == expected
    entry = ActionLog.objects.get(pk=done.action_log.pk)
    assert (entry.action, entry.actor, entry.result, entry.dry_run) == ("rewind", "alice", ActionResult.DONE, False)
    assert entry.offsets_before == {"0": 15, "1": 15}
    assert entry.offsets_after == {str(p): n for p, n in expected.items()}
    assert Pipeline.objects.get(name=EXACTLY_ONCE).epoch == before[2] + 1   # fenced
    kept = sink_rows(EXACTLY_ONCE)
    if rollback_sink:
        assert kept == [row for row in before[1] if row[1] < expected[row[0]]]
        assert done.rows_deleted == {p: 15 - n for p, n in expected.items()}
        assert dry.rows_to_delete == done.rows_deleted   # the preview counted what the rewind deleted
    else:
        assert dry.rows_to_delete == {}
        assert kept == before[1]
        moved_back = {p for p, n in expected.items() if n < 15}
        assert {o.partition: o.replay_until for o in PartitionOffset.objects.filter(pipeline__name=EXACTLY_ONCE)} \
            == {p: (15 if p in moved_back else None) for p in expected}
    superseded = BatchLedger.objects.filter(pipeline__name=EXACTLY_ONCE, superseded_from__isnull=False,
                                            committed_at__lt=entry.created_at)
    assert all(row.superseded_from <= expected[row.partition] for row in superseded)
    assert all(row.end_offset <= expected[row.partition] for row in BatchLedger.objects.filter(
        pipeline__name=EXACTLY_ONCE, superseded_from__isnull=True, committed_at__lt=entry.created_at))

    catch_up(EXACTLY_ONCE)
    assert sink_rows(EXACTLY_ONCE) == expected_rows(range(1, TOTAL + 1))
    assert positions(EXACTLY_ONCE) == {0: 15, 1: 15}


def test_a_rewind_leaves_a_stopped_pipeline_stopped_and_a_paused_one_paused(demo):
    from consumers.models import DesiredState
    from consumers.operations import pipeline_setup

    pipeline = Pipeline.objects.get(name=EXACTLY_ONCE)
    assert pipeline.desired_state == DesiredState.STOPPED
    rewind(EXACTLY_ONCE, "shift-by", "-5", actor="alice")
    after = Pipeline.objects.get(name=EXACTLY_ONCE)
    assert (after.desired_state, after.epoch) == (DesiredState.STOPPED, pipeline.epoch + 1)   # fenced, not paused
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.PAUSED)
    rewind(EXACTLY_ONCE, "shift-by", "5", actor="alice")
    assert Pipeline.objects.get(name=EXACTLY_ONCE).desired_state == DesiredState.PAUSED
    assert positions(EXACTLY_ONCE) == {0: 15, 1: 15}
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.STOPPED)
    rewind(EXACTLY_ONCE, "to-current", actor="alice")
    pipeline_setup.delete(EXACTLY_ONCE, actor="alice")   # a stopped pipeline is deleted after its rewind
    assert not Pipeline.objects.filter(name=EXACTLY_ONCE).exists()


def test_to_latest_skips_unread_records_and_says_how_many(demo):
    produce(TOTAL + 1, TOTAL + 4)          # two new records per partition, not consumed yet
    dry = rewind(EXACTLY_ONCE, "to-latest", dry_run=True)
    assert [(m.current, m.new, m.skip, m.reprocess) for m in dry.moves] == [(15, 17, 2, 0), (15, 17, 2, 0)]
    rewind(EXACTLY_ONCE, "to-latest")
    catch_up(EXACTLY_ONCE)
    assert sink_rows(EXACTLY_ONCE) == expected_rows(range(1, TOTAL + 1))   # 31..34 skipped on purpose
    assert positions(EXACTLY_ONCE) == {0: 17, 1: 17}


def test_a_rewind_of_chosen_partitions_leaves_the_others_alone(demo):
    rewind(EXACTLY_ONCE, "to-offset", "3", partitions=[1], rollback_sink=True)
    assert positions(EXACTLY_ONCE) == {0: 15, 1: 3}
    assert [row for row in sink_rows(EXACTLY_ONCE) if row[0] == 1] == [(1, o, 2 * o + 2) for o in range(3)]
    catch_up(EXACTLY_ONCE)
    assert sink_rows(EXACTLY_ONCE) == expected_rows(range(1, TOTAL + 1))


@pytest.mark.parametrize("name", [AT_LEAST_ONCE, AT_MOST_ONCE])
def test_the_classic_modes_rewind_through_kafka_and_roll_back_sink_leaves_each_record_once(demo, name):
    catch_up(name)
    assert sink_rows(name) == expected_rows(range(1, TOTAL + 1))
    result = rewind(name, "to-offset", "5", rollback_sink=True)
    assert [(m.current, m.new) for m in result.moves] == [(15, 5), (15, 5)]
    catch_up(name)
    assert sink_rows(name) == expected_rows(range(1, TOTAL + 1))


def test_a_classic_rewind_without_roll_back_replays_into_the_sink_and_the_duplicates_show(demo):
    catch_up(AT_LEAST_ONCE)
    rewind(AT_LEAST_ONCE, "shift-by", "-5")
    catch_up(AT_LEAST_ONCE)
    replayed = [v for v in range(1, TOTAL + 1) if (v - 1) // 2 >= 10]
    assert sink_rows(AT_LEAST_ONCE) == sorted(expected_rows(range(1, TOTAL + 1)) + expected_rows(replayed))


def crashed_before_its_kafka_commit(name, committed):
    """The at-least-once crash between the DB commit and the Kafka commit: the sink holds every record up to
    the log end (15 per partition), Kafka's committed offsets are left behind at `committed`."""
    catch_up(name)
    pipeline = Pipeline.objects.get(name=name)
    kafka_admin.commit_offsets(pipeline.group_id, pipeline.topic, {0: committed, 1: committed},
                               cluster=pipeline.cluster)
    assert positions(name) == {0: 15, 1: 15}


def test_an_at_least_once_rewind_counts_the_records_it_gives_back_from_what_the_sink_holds(demo):
    crashed_before_its_kafka_commit(AT_LEAST_ONCE, 10)
    dry = rewind(AT_LEAST_ONCE, "to-offset", "5", rollback_sink=True, dry_run=True)
    assert [(m.current, m.new, m.reprocess, m.skip) for m in dry.moves] == [(10, 5, 10, 0), (10, 5, 10, 0)]
    assert dry.as_dict()["reprocess"] == 20 and "20 record(s) to reprocess, 0 to skip" in dry.message
    assert "where the sink was written up to, past Kafka's committed offsets: p0 15, p1 15" in dry.message
    assert dry.rows_to_delete == {0: 10, 1: 10}

    done = rewind(AT_LEAST_ONCE, "to-offset", "5", rollback_sink=True)
    assert done.rows_deleted == {0: 10, 1: 10}
    assert "20 record(s) to reprocess, 0 to skip" in done.message
    assert catch_up(AT_LEAST_ONCE).records == 20            # what the summary said it gives back
    assert sink_rows(AT_LEAST_ONCE) == expected_rows(range(1, TOTAL + 1))


def test_an_at_least_once_rewind_that_keeps_the_sink_says_how_many_records_it_writes_again(demo):
    crashed_before_its_kafka_commit(AT_LEAST_ONCE, 10)
    done = rewind(AT_LEAST_ONCE, "shift-by", "-4")           # shift-by moves from where it resumes: Kafka's 10
    assert [(m.current, m.new, m.reprocess) for m in done.moves] == [(10, 6, 9), (10, 6, 9)]
    catch_up(AT_LEAST_ONCE)
    again = [v for v in range(1, TOTAL + 1) if (v - 1) // 2 >= 6]
    assert len(again) == done.as_dict()["reprocess"] == 18
    assert sink_rows(AT_LEAST_ONCE) == sorted(expected_rows(range(1, TOTAL + 1)) + expected_rows(again))


def test_an_at_least_once_rewind_forward_skips_nothing_the_sink_already_holds(demo):
    crashed_before_its_kafka_commit(AT_LEAST_ONCE, 10)
    dry = rewind(AT_LEAST_ONCE, "to-latest", dry_run=True)
    assert [(m.current, m.new, m.reprocess, m.skip) for m in dry.moves] == [(10, 15, 0, 0), (10, 15, 0, 0)]
    assert "0 record(s) to reprocess, 0 to skip" in dry.message


def test_a_second_at_least_once_rewind_before_catch_up_counts_what_the_sink_still_holds_past_it(demo):
    # The first rewind keeps the sink (rows up to 15) and moves the DB's position back to 10 with Kafka's: the second
    # counted from 10, as if the sink ended there, and said 5 records per partition where 10 are written again.
    catch_up(AT_LEAST_ONCE)
    rewind(AT_LEAST_ONCE, "to-offset", "10")
    dry = rewind(AT_LEAST_ONCE, "to-offset", "5", rollback_sink=True, dry_run=True)
    assert [(m.current, m.new, m.reprocess, m.skip) for m in dry.moves] == [(10, 5, 10, 0), (10, 5, 10, 0)]
    assert dry.rows_to_delete == {0: 10, 1: 10}
    done = rewind(AT_LEAST_ONCE, "to-offset", "5")
    assert done.as_dict()["reprocess"] == 20
    assert catch_up(AT_LEAST_ONCE).records == 20             # what the summary said it gives back


def test_a_classic_rewind_whose_database_commit_fails_puts_kafkas_offsets_back(demo, monkeypatch):
    """A classic pipeline resumes from Kafka's committed offsets, which a rewind commits inside its database
    transaction, before that transaction commits. A commit that failed then (the database gone at that moment)
    left Kafka moved while the positions, and the sink rows roll back sink deletes, stayed: the pipeline re-read
    records whose rows were kept, while the audit said the rewind failed. Kafka's offsets are now put back."""
    catch_up(AT_LEAST_ONCE)
    pipeline = Pipeline.objects.get(name=AT_LEAST_ONCE)
    kafka_before = kafka_admin.committed_offsets(pipeline.group_id, pipeline.topic, [0, 1], cluster=pipeline.cluster)
    before = snapshot(AT_LEAST_ONCE)

    def database_gone(*args, **kwargs):   # the last step inside the rewind's transaction, after Kafka's commit
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(rewind_operation, "_summary", database_gone)
    with pytest.raises(rewind_operation.RewindNotCommitted, match="server closed the connection"):
        rewind(AT_LEAST_ONCE, "to-offset", "5", rollback_sink=True)

    assert kafka_admin.committed_offsets(pipeline.group_id, pipeline.topic, [0, 1],
                                         cluster=pipeline.cluster) == kafka_before == {0: 15, 1: 15}
    after = snapshot(AT_LEAST_ONCE)
    assert after[:2] == before[:2]   # positions and sink rows as they were
    entry = ActionLog.objects.filter(action="rewind", dry_run=False).latest("pk")
    assert entry.result == ActionResult.FAILED
    assert "Kafka's committed offsets of group" in entry.message and "were put back" in entry.message
