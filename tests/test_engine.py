"""The kafka-python engine in this process against the real broker and PostgreSQL: every mode consumes
everything, bad records become dead letters (or stop the run), positions come from the database, and a
newer epoch ends a run."""
import subprocess
import sys
import threading

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from consumers.engine import commit, db
from consumers.engine.lifecycle import UnknownPipeline
from consumers.engine.python import run_pipeline
from consumers.kafka import admin as kafka_admin
from consumers.models import BadRecordPolicy, ConsumerRun, DeadLetter, DeliveryMode, PartitionOffset, Pipeline
from tests.chaos import produce_values, sink_counts, split_reported, wait_for
from tests.conftest import ROOT, drop_sink_tables
from tests.pipelines import create_pipeline
from tests.waiting import patience

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_client")]


@pytest.fixture
def make_pipeline(transactional_db, kafka_bootstrap, make_topic, settings):
    """A topic holding `values` and a pipeline reading it; the sink table is dropped afterwards."""
    settings.KAFKA_SESSION_TIMEOUT_MS = 6000
    created = []

    def make(values, mode=DeliveryMode.EXACTLY_ONCE, partitions=1, **fields):
        topic = make_topic("eng", partitions=partitions)
        produce_values(topic, values, partitions)
        pipeline = create_pipeline(topic, topic, f"sink_{topic}".replace("-", "_"), "int_value", mode,
                                   batch_size=fields.pop("batch_size", 10), **fields)
        created.append(pipeline.sink_table)
        return pipeline

    yield make
    drop_sink_tables(created)


def in_thread(name, **kwargs):
    """Run the engine in a thread; returns (thread, holder) where holder["result"] is the RunResult."""
    holder = {}

    def target():
        try:
            holder["result"] = run_pipeline(name, **kwargs)
        finally:
            connection.close()  # this thread's Django connection, or the test database cannot be dropped

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, holder


@pytest.mark.parametrize("mode", [DeliveryMode.EXACTLY_ONCE, DeliveryMode.AT_LEAST_ONCE, DeliveryMode.AT_MOST_ONCE])
def test_each_mode_consumes_every_record_once_when_nothing_fails(make_pipeline, mode):
    pipeline = make_pipeline(range(1, 61), mode, partitions=2)
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert (result.reason, result.records, result.rows_written) == ("caught_up", 60, 60)
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in range(1, 61)}
    run = ConsumerRun.objects.get(pk=result.run_id)
    assert (run.state, run.end_reason, run.records_processed, run.epoch) == ("stopped", "caught_up", 60, 0)
    assert sorted(run.assigned_partitions) == [0, 1] and run.ended_at is not None
    # The database and (after the DB commit, or before it in at-most-once) Kafka agree on the position.
    positions = dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))
    assert positions == {0: 30, 1: 30}
    assert kafka_admin.committed_offsets(pipeline.group_id, pipeline.topic, [0, 1]) == {0: 30, 1: 30}


def test_a_value_that_is_not_an_integer_becomes_a_dead_letter_and_the_pipeline_goes_on(make_pipeline):
    pipeline = make_pipeline(["1", "2", "three", "4", "5"])
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert (result.reason, result.records, result.rows_written, result.dead_letters) == ("caught_up", 5, 4, 1)
    assert sink_counts(pipeline.sink_table) == {1: 1, 2: 1, 4: 1, 5: 1}
    letter = DeadLetter.objects.get(pipeline=pipeline)
    assert (letter.offset, bytes(letter.value)) == (2, b"three") and "not an integer" in letter.error


def test_the_stop_policy_ends_the_run_on_a_bad_record_without_writing_its_batch(make_pipeline):
    pipeline = make_pipeline(["oops", "2", "3"], on_bad_record=BadRecordPolicy.STOP)
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "bad_record" and "offset 0" in result.detail
    assert sink_counts(pipeline.sink_table) == {}
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 0
    assert not DeadLetter.objects.filter(pipeline=pipeline).exists()
    run = ConsumerRun.objects.get(pk=result.run_id)
    assert run.state == "failed" and run.end_reason.startswith("bad_record")


def test_exactly_once_resumes_from_the_database_position_not_from_kafkas(make_pipeline):
    pipeline = make_pipeline(range(1, 41))
    conn = db.connect("tally-tests")
    commit.ensure_positions(conn, pipeline.pk, {0: 25})
    conn.close()
    kafka_admin.commit_offsets(pipeline.group_id, pipeline.topic, {0: 5})  # Kafka's copy is only advisory
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert result.records == 15
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in range(26, 41)}
    assert kafka_admin.committed_offsets(pipeline.group_id, pipeline.topic) == {0: 40}


def test_the_classic_modes_resume_from_kafkas_committed_offset(make_pipeline):
    pipeline = make_pipeline(range(1, 41), DeliveryMode.AT_LEAST_ONCE)
    kafka_admin.commit_offsets(pipeline.group_id, pipeline.topic, {0: 30})
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert result.records == 10
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in range(31, 41)}


def test_a_new_exactly_once_pipeline_with_reset_policy_latest_starts_at_the_high_watermark(make_pipeline):
    pipeline = make_pipeline(range(1, 21), reset_policy="latest")
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert (result.reason, result.records) == ("caught_up", 0)
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 20


def test_a_run_ends_as_fenced_when_the_pipeline_moves_to_a_newer_epoch(make_pipeline):
    pipeline = make_pipeline(range(1, 201))
    thread, holder = in_thread(pipeline.name, delay_ms=20, max_seconds=60)
    wait_for(lambda: PartitionOffset.objects.filter(pipeline=pipeline, next_offset__gt=0).exists(), 30,
             "the first batch")
    Pipeline.objects.get(pk=pipeline.pk).bump_epoch()
    thread.join(timeout=10)
    result = holder["result"]
    assert result.reason == "fenced" and "epoch 1" in result.detail
    assert ConsumerRun.objects.get(pk=result.run_id).state == "fenced"
    written = PartitionOffset.objects.get(pipeline=pipeline).next_offset
    assert 0 < written < 200
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in range(1, written + 1)}


def test_a_gap_makes_the_engine_seek_back_to_the_database_position(make_pipeline):
    pipeline = make_pipeline(range(1, 101))
    thread, holder = in_thread(pipeline.name, delay_ms=10, stop_when_caught_up=True, max_seconds=60)
    wait_for(lambda: PartitionOffset.objects.filter(pipeline=pipeline, next_offset__gte=30).exists(), 30,
             "30 records")
    # Move the position back behind the engine's fetch position (as a rewind that keeps the sink does,
    # with its replay window), without a new epoch: the next batch starts above next_offset.
    PartitionOffset.objects.filter(pipeline=pipeline).update(next_offset=10, replay_until=100)
    thread.join(timeout=60)
    assert holder["result"].reason == "caught_up"
    assert holder["result"].records >= 100  # the replayed records count again
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in range(1, 101)}


def test_a_stop_event_ends_the_run_cleanly(make_pipeline):
    pipeline = make_pipeline(range(1, 11))
    stop = threading.Event()
    thread, holder = in_thread(pipeline.name, stop=stop, max_seconds=60)
    wait_for(lambda: PartitionOffset.objects.filter(pipeline=pipeline, next_offset=10).exists(), 30, "all records")
    stop.set()
    thread.join(timeout=10)
    assert holder["result"].reason == "stopped"
    assert ConsumerRun.objects.get(pk=holder["result"].run_id).state == "stopped"


@pytest.mark.parametrize("mode", [DeliveryMode.EXACTLY_ONCE, DeliveryMode.AT_LEAST_ONCE, DeliveryMode.AT_MOST_ONCE])
def test_no_mode_joins_the_consumer_group_and_every_mode_commits_offsets_to_kafka(make_pipeline, mode):
    # Runs take their partitions from the database (consumers/engine/shares.py): no join to wait for. The
    # group is where Kafka keeps their offsets (the classic modes resume from it).
    pipeline = make_pipeline(range(1, 21), mode, partitions=2)
    stop = threading.Event()
    thread, holder = in_thread(pipeline.name, stop=stop, max_seconds=60)
    try:
        wait_for(lambda: PartitionOffset.objects.filter(pipeline=pipeline, next_offset=10).count() == 2, 30,
                 "every record")
        group = kafka_admin.describe_group(pipeline.group_id)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert group.members == []
    assert holder["result"].reason == "stopped"
    assert kafka_admin.committed_offsets(pipeline.group_id, pipeline.topic, [0, 1]) == {0: 10, 1: 10}


@pytest.mark.parametrize("mode", [DeliveryMode.EXACTLY_ONCE, DeliveryMode.AT_LEAST_ONCE])
def test_a_run_that_holds_no_partition_stops_once_the_whole_topic_is_caught_up(make_pipeline, mode):
    # Two runs, one partition: one of them never holds anything, and still ends when the topic is done.
    pipeline = make_pipeline(range(1, 31), mode, partitions=1)
    runs = [in_thread(pipeline.name, stop_when_caught_up=True, max_seconds=patience(90)) for _ in range(2)]
    for thread, _ in runs:
        thread.join(timeout=patience(120))
    assert [holder["result"].reason for _, holder in runs] == ["caught_up", "caught_up"]
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in range(1, 31)}


def test_two_exactly_once_runs_split_the_partitions_and_a_stopped_runs_share_moves_to_the_other(make_pipeline):
    pipeline = make_pipeline(range(1, 401), partitions=4)
    stops = [threading.Event(), threading.Event()]

    def holdings():
        return {run.pk: sorted(run.assigned_partitions)
                for run in ConsumerRun.objects.filter(pipeline=pipeline).alive(timezone.now())}

    first, first_holder = in_thread(pipeline.name, stop=stops[0], delay_ms=20, max_seconds=120)
    try:
        wait_for(lambda: list(holdings().values()) == [[0, 1, 2, 3]], 30, "the first run to hold every partition")
        second, second_holder = in_thread(pipeline.name, stop=stops[1], delay_ms=20, max_seconds=120)
        try:
            def split():
                runs = list(ConsumerRun.objects.filter(pipeline=pipeline).alive(timezone.now()).order_by("pk"))
                return len(runs) == 2 and split_reported(runs, 4) and [sorted(r.assigned_partitions) for r in runs]

            # Run ids in order take every other partition; no partition is held twice.
            assert wait_for(split, 30, "two runs reading two partitions each") == [[0, 2], [1, 3]]
            stops[0].set()
            first.join(timeout=30)
            assert first_holder["result"].reason == "stopped"
            wait_for(lambda: list(holdings().values()) == [[0, 1, 2, 3]], 30, "the second run to take over")
            wait_for(lambda: PartitionOffset.objects.filter(pipeline=pipeline, next_offset=100).count() == 4, 60,
                     "every record")
        finally:
            stops[1].set()
            second.join(timeout=30)
        assert second_holder["result"].reason == "stopped"
    finally:
        stops[0].set()
        first.join(timeout=30)
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in range(1, 401)}


def test_an_unknown_pipeline_is_refused(transactional_db):
    with pytest.raises(UnknownPipeline, match="no-such"):
        run_pipeline("no-such")


def test_the_command_exits_non_zero_with_a_message_for_an_unknown_pipeline(transactional_db, subprocess_env):
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "run_pipeline", "no-such-pipeline"],
                          cwd=ROOT, env=subprocess_env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "No pipeline named 'no-such-pipeline'" in done.stderr


def test_the_command_refuses_an_unknown_crash_point(transactional_db):
    with pytest.raises(CommandError, match="Unknown crash point 'before-lunch'"):
        call_command("run_pipeline", "whatever", "--crash-at", "after-poll:0.5,before-lunch")
