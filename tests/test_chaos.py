"""Chaos: the engine runs in subprocesses that are killed with SIGKILL (from outside at random moments,
or by themselves at fault points), restarted until caught up, and the sink is then checked row by row."""
import json
import os
import random
import signal
import time

import psutil
import pytest

from consumers.kafka import admin as kafka_admin
from consumers.models import ConsumerRun, DeliveryMode, PartitionOffset, Pipeline
from consumers.operations.rewind import rewind
from tests.chaos import (
    EngineProcess,
    ledger_batches,
    produce_values,
    run_killed_at,
    run_until_clean_exit,
    sink_counts,
    split_reported,
    wait_for,
)
from tests.conftest import drop_sink_tables
from tests.pipelines import create_pipeline
from tests.waiting import patience

pytestmark = [pytest.mark.kafka, pytest.mark.chaos, pytest.mark.usefixtures("kafka_client")]

BATCH = ["--batch-size", "10"]
UNTIL_CAUGHT_UP = [*BATCH, "--stop-when-caught-up", "--max-seconds", "120"]


@pytest.fixture
def chaos_pipeline(transactional_db, kafka_bootstrap, make_topic, subprocess_env):
    created = []

    def make(records, mode=DeliveryMode.EXACTLY_ONCE, partitions=1, transform="int_value"):
        topic = make_topic("chaos", partitions=partitions)
        produce_values(topic, range(1, records + 1), partitions)
        pipeline = create_pipeline(topic, topic, f"sink_{topic}".replace("-", "_"), transform, mode,
                                   batch_size=10)
        created.append(pipeline.sink_table)
        return pipeline

    yield make
    drop_sink_tables(created)


def every_value_once(records):
    return {value: 1 for value in range(1, records + 1)}


def assert_positions_at_high_watermarks(pipeline):
    positions = dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))
    assert positions == kafka_admin.high_watermarks(pipeline.topic)


# Every point an exactly-once batch passes (after-kafka-commit belongs to at-most-once: it never passes it).
EXACTLY_ONCE_POINTS = ["after-poll", "mid-write", "after-write", "after-db-commit"]


def crash_once_at_every_point(env, pipeline):
    for point in EXACTLY_ONCE_POINTS:
        run_killed_at(env, pipeline.name, UNTIL_CAUGHT_UP, f"{point}:1")


def assert_a_clean_run_ends_with_every_value_once(env, pipeline, records):
    assert run_until_clean_exit(env, pipeline.name, UNTIL_CAUGHT_UP, max_runs=1) == 0
    assert sink_counts(pipeline.sink_table) == every_value_once(records)
    assert_positions_at_high_watermarks(pipeline)


def test_exactly_once_writes_every_value_once_despite_random_sigkills(chaos_pipeline, subprocess_env):
    pipeline = chaos_pipeline(500, partitions=3)
    rng = random.Random()
    kills = 0
    while kills < 10:
        before = ledger_batches(pipeline.pk)
        engine = EngineProcess(subprocess_env, pipeline.name, *UNTIL_CAUGHT_UP, "--delay-ms", "20")
        try:
            wait_for(lambda engine=engine, before=before: engine.poll() is not None
                     or ledger_batches(pipeline.pk) > before, 60,
                     "the engine's next batch")
            assert engine.poll() is None, f"finished before {kills + 1} kills:\n{engine.output()[-2000:]}"
            time.sleep(rng.uniform(0, 0.25))  # somewhere in a poll, a write, a commit or a sleep
            engine.kill()
            kills += 1
        finally:
            engine.kill()
    assert run_until_clean_exit(subprocess_env, pipeline.name, UNTIL_CAUGHT_UP, max_runs=1) == 0
    assert sink_counts(pipeline.sink_table) == every_value_once(500)
    assert_positions_at_high_watermarks(pipeline)


def test_exactly_once_writes_every_value_once_with_crashes_at_every_fault_point(chaos_pipeline, subprocess_env):
    pipeline = chaos_pipeline(200, partitions=2)
    for run in range(10):
        run_killed_at(subprocess_env, pipeline.name, UNTIL_CAUGHT_UP, f"{EXACTLY_ONCE_POINTS[run % 4]}:1")
    assert ledger_batches(pipeline.pk) == 2  # only the two after-db-commit crashes had committed a batch
    assert_a_clean_run_ends_with_every_value_once(subprocess_env, pipeline, 200)


def test_exactly_once_rows_written_one_by_one_survive_a_crash_at_every_fault_point(chaos_pipeline, subprocess_env):
    # The test above writes int_value's plain digits, which take the verbatim COPY. A multi-row transform never
    # does: its rows go through the row-by-row COPY, killed here between its two halves (mid-write).
    pipeline = chaos_pipeline(100, partitions=2, transform="csv_ints")
    crash_once_at_every_point(subprocess_env, pipeline)
    assert ledger_batches(pipeline.pk) == 1  # only the after-db-commit crash had committed a batch
    assert_a_clean_run_ends_with_every_value_once(subprocess_env, pipeline, 100)


def test_a_replay_after_a_rewind_that_kept_the_sink_survives_a_crash_at_every_fault_point(
        chaos_pipeline, subprocess_env):
    # Replayed rows may be in the sink already: they are written skipping the provenance keys present, another
    # write path, killed here at each point it passes.
    pipeline = chaos_pipeline(100, partitions=2)
    assert run_until_clean_exit(subprocess_env, pipeline.name, UNTIL_CAUGHT_UP, max_runs=1) == 0
    result = rewind(pipeline.name, "to-earliest", actor="alice")
    assert result.action_log.result == "done", result.message
    crash_once_at_every_point(subprocess_env, pipeline)
    assert_a_clean_run_ends_with_every_value_once(subprocess_env, pipeline, 100)


def test_exactly_once_holds_when_runs_die_while_polling_ahead_of_the_batch_being_committed(
        chaos_pipeline, subprocess_env):
    """The write-behind: a run polls the next batch while the previous one's transaction commits. Killed
    there, that batch may or may not have committed; either way the next run resumes from the database."""
    pipeline = chaos_pipeline(300, partitions=3)
    for _ in range(5):
        run_killed_at(subprocess_env, pipeline.name, UNTIL_CAUGHT_UP, "after-next-poll@1")
    assert ledger_batches(pipeline.pk) <= 5   # at most the batch in flight of each killed run
    assert run_until_clean_exit(subprocess_env, pipeline.name, UNTIL_CAUGHT_UP, max_runs=1) == 0
    assert sink_counts(pipeline.sink_table) == every_value_once(300)
    assert_positions_at_high_watermarks(pipeline)


def test_runs_started_together_with_processes_split_the_partitions_and_write_each_value_once(
        chaos_pipeline, subprocess_env):
    pipeline = chaos_pipeline(400, partitions=4)
    engine = EngineProcess(subprocess_env, pipeline.name, *UNTIL_CAUGHT_UP, "--processes", "2", "--json")
    assert engine.wait(patience(120)) == 0, engine.output()[-3000:]
    outcome = json.loads([line for line in engine.output().splitlines() if line.startswith('{"runs"')][-1])
    runs = outcome["runs"]
    assert len(runs) == 2 and all(run["reason"] == "caught_up" for run in runs)
    assert sum(run["records"] for run in runs) == 400 and all(run["records"] > 0 for run in runs)
    assert outcome["busy_seconds"] > 0
    # They waited for each other, so each took its share (2 of the 4 partitions of 100 records) at once: a run
    # that took every partition first and handed two over later would have written more than its share.
    assert sorted(run["records"] for run in runs) == [200, 200]
    assert sink_counts(pipeline.sink_table) == every_value_once(400)
    assert_positions_at_high_watermarks(pipeline)


def test_at_least_once_duplicates_after_kills_between_the_write_and_the_kafka_commit(chaos_pipeline, subprocess_env):
    pipeline = chaos_pipeline(100, DeliveryMode.AT_LEAST_ONCE)
    for _ in range(3):
        engine = run_killed_at(subprocess_env, pipeline.name, UNTIL_CAUGHT_UP, "after-db-commit:1")
        assert "crash-at: fault after-db-commit fired (p=1)" in engine.output()
    assert run_until_clean_exit(subprocess_env, pipeline.name, UNTIL_CAUGHT_UP, max_runs=1) == 0
    counts = sink_counts(pipeline.sink_table)
    assert set(counts) == set(range(1, 101))                     # nothing missing
    duplicated = {value: n for value, n in counts.items() if n > 1}
    # Kafka never heard of the first batch, so every run wrote it again: 3 kills + the clean run.
    assert duplicated and set(duplicated.values()) == {4} and max(duplicated) <= 10


def test_at_most_once_loses_values_after_kills_between_the_kafka_commit_and_the_write(chaos_pipeline, subprocess_env):
    pipeline = chaos_pipeline(100, DeliveryMode.AT_MOST_ONCE)
    for _ in range(3):
        run_killed_at(subprocess_env, pipeline.name, UNTIL_CAUGHT_UP, "after-kafka-commit:1")
    assert run_until_clean_exit(subprocess_env, pipeline.name, UNTIL_CAUGHT_UP, max_runs=1) == 0
    counts = sink_counts(pipeline.sink_table)
    missing = sorted(set(range(1, 101)) - set(counts))
    # Each killed run had committed its batch to Kafka: three batches are gone for good.
    assert missing and missing == list(range(1, len(missing) + 1)) and 3 <= len(missing) <= 30
    assert set(counts.values()) == {1}


def test_a_zombie_from_an_older_epoch_writes_nothing_after_a_restart(chaos_pipeline, subprocess_env):
    pipeline = chaos_pipeline(200, partitions=2)
    with EngineProcess(subprocess_env, pipeline.name, *BATCH, "--delay-ms", "50") as zombie:
        wait_for(lambda: ledger_batches(pipeline.pk) >= 2, 60, "the first engine's batches")
        os.kill(zombie.pid, signal.SIGSTOP)   # frozen mid-batch (a long GC pause, a stuck VM)
        restarted_epoch = Pipeline.objects.get(pk=pipeline.pk).bump_epoch()  # the operator restarts the pipeline
        assert run_until_clean_exit(subprocess_env, pipeline.name, UNTIL_CAUGHT_UP, max_runs=1) == 0
        os.kill(zombie.pid, signal.SIGCONT)   # the zombie wakes up holding records it polled long ago
        assert zombie.wait(30) != 0
        assert "fenced" in zombie.output()
    assert sink_counts(pipeline.sink_table) == every_value_once(200)
    runs = {run.epoch: run for run in ConsumerRun.objects.filter(pipeline=pipeline)}
    assert runs[restarted_epoch - 1].state == "fenced" and runs[restarted_epoch].state == "stopped"
    assert_positions_at_high_watermarks(pipeline)


def test_an_at_least_once_run_hung_past_its_lease_cannot_undo_a_rewind_by_committing_its_kafka_offsets(
        chaos_pipeline, subprocess_env, settings):
    # The classic modes resume from Kafka's committed offsets. A run frozen between a batch's DB commit and its
    # Kafka commit for longer than its lease counts as dead, so a rewind goes ahead; when the run wakes it must
    # not put its old position back over the rewind's, or the next run skips what the rewind gave back.
    pipeline = chaos_pipeline(100, DeliveryMode.AT_LEAST_ONCE)
    settings.TALLY_RUN_LEASE_SECONDS = 3
    env = dict(subprocess_env, TALLY_RUN_LEASE_SECONDS="3")
    with EngineProcess(env, pipeline.name, *BATCH, "--crash-at", "after-db-commit@3/stop") as zombie:
        frozen = psutil.Process(zombie.pid)
        wait_for(lambda: frozen.status() == psutil.STATUS_STOPPED, 60, "the run to freeze after its third batch")
        result = rewind(pipeline.name, "to-earliest", rollback_sink=True, actor="alice")
        assert result.action_log.result == "done", result.message
        os.kill(zombie.pid, signal.SIGCONT)
        assert zombie.wait(30) != 0
        assert "fenced" in zombie.output()
    assert kafka_admin.committed_offsets(pipeline.group_id, pipeline.topic, [0]) == {0: 0}
    assert run_until_clean_exit(env, pipeline.name, UNTIL_CAUGHT_UP, max_runs=1) == 0
    assert sink_counts(pipeline.sink_table) == every_value_once(100)


def test_when_one_of_two_runs_is_killed_its_partitions_move_and_nothing_is_lost_or_doubled(
        chaos_pipeline, subprocess_env):
    pipeline = chaos_pipeline(400, partitions=4)
    first = EngineProcess(subprocess_env, pipeline.name, *BATCH, "--delay-ms", "20")
    second = EngineProcess(subprocess_env, pipeline.name, *BATCH, "--delay-ms", "20")
    try:
        runs = {}

        def both_assigned_and_working():
            for process in (first, second):
                run = ConsumerRun.objects.filter(pipeline=pipeline, pid=process.pid).first()
                if run is None or not run.records_processed:
                    return False
                runs[process.pid] = run
            return split_reported(runs.values(), 4)

        wait_for(both_assigned_and_working, 60, "two working members, each reading its share")
        first.kill()
        wait_for(lambda: ConsumerRun.objects.get(pk=runs[second.pid].pk).assigned_partitions == [0, 1, 2, 3], 60,
                 "the survivor to take every partition")
        wait_for(lambda: PartitionOffset.objects.filter(pipeline=pipeline, next_offset=100).count() == 4, 90,
                 "every partition to be consumed")
        second.stop()
        assert second.poll() == 0, second.output()[-2000:]
    finally:
        first.kill()
        second.kill()
    assert sink_counts(pipeline.sink_table) == every_value_once(400)
