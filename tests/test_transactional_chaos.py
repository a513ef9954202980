"""Chaos on transactional topics: engines SIGKILLed at fault points and from outside on a log with holes
(transaction markers; aborted transactions), then reconciled. Exactly-once stays exact; at-most-once
loses records and reconciliation counts exactly those, never a hole."""
import time

import pytest

from consumers.kafka import admin as kafka_admin
from consumers.models import ConsumerRun, DeliveryMode, PartitionOffset
from consumers.reconciliation.reconcile import reconcile_pipeline
from tests.chaos import EngineProcess, ledger_batches, run_killed_at, run_until_clean_exit, sink_counts, wait_for
from tests.conftest import drop_sink_tables
from tests.pipelines import create_pipeline
from tests.transactional_log import mixed_transactions, produce_transactions, topic_values

pytestmark = [pytest.mark.kafka, pytest.mark.chaos, pytest.mark.usefixtures("kafka_client")]

UNTIL_CAUGHT_UP = ["--batch-size", "7", "--stop-when-caught-up", "--max-seconds", "120"]


@pytest.fixture
def tx_chaos_pipeline(transactional_db, kafka_bootstrap, make_topic, subprocess_env):
    created = []

    def make(transactions, mode=DeliveryMode.EXACTLY_ONCE, partitions=2):
        topic = make_topic("txchaos", partitions=partitions)
        produce_transactions(topic, mixed_transactions(transactions), partitions)
        pipeline = create_pipeline(topic, topic, f"sink_{topic}".replace("-", "_"), "int_value", mode,
                                   batch_size=7)
        created.append(pipeline.sink_table)
        return pipeline, topic_values(topic)

    yield make
    drop_sink_tables(created)


# A fixed crash schedule, so every run of the suite kills the same runs at the same batches: the first
# run dies at its first batch, the next at its third, the last at its second (a random schedule can let a
# whole run go by without a kill).
CRASH_PASSES = (1, 3, 2)


def crash_at_each_pass(env, pipeline, point, passes):
    """One engine run per pass number, each SIGKILLed at that pass through `point`; then a clean run."""
    for number in passes:
        run_killed_at(env, pipeline.name, UNTIL_CAUGHT_UP, f"{point}@{number}")
    assert run_until_clean_exit(env, pipeline.name, UNTIL_CAUGHT_UP, max_runs=1) == 0


def stored_positions(pipeline):
    return dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))


def test_exactly_once_is_exact_on_a_transactional_topic_with_crashes_at_every_fault_point(tx_chaos_pipeline,
                                                                                          subprocess_env):
    pipeline, held = tx_chaos_pipeline(30)
    points = ["after-poll", "mid-write", "after-write", "after-db-commit"]
    for run in range(8):
        run_killed_at(subprocess_env, pipeline.name, UNTIL_CAUGHT_UP, f"{points[run % 4]}:1")
    assert run_until_clean_exit(subprocess_env, pipeline.name, UNTIL_CAUGHT_UP, max_runs=1) == 0
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in held}
    assert stored_positions(pipeline) == kafka_admin.high_watermarks(pipeline.topic)
    report = reconcile_pipeline(pipeline)
    assert (report.lost, report.duplicated, report.lag_records, report.status) == (0, 0, 0, "OK"), report.partitions


def test_at_most_once_chaos_on_a_transactional_topic_reconciles_exactly_the_records_it_lost(tx_chaos_pipeline,
                                                                                           subprocess_env):
    pipeline, held = tx_chaos_pipeline(30, DeliveryMode.AT_MOST_ONCE)
    crash_at_each_pass(subprocess_env, pipeline, "after-kafka-commit", CRASH_PASSES)
    sink = sink_counts(pipeline.sink_table)
    missing = [value for value in held if value not in sink]
    assert missing and all(count == 1 for count in sink.values())
    report = reconcile_pipeline(pipeline)
    # Exactly the records the crashes lost: the markers inside the lost ranges are holes, not losses.
    assert (report.lost, report.duplicated, report.lag_records) == (len(missing), 0, 0), report.partitions
    assert any(f.kind == "hole" for p in report.partitions for f in p.findings)


def test_at_least_once_chaos_on_a_transactional_topic_reconciles_exactly_its_duplicates(tx_chaos_pipeline,
                                                                                         subprocess_env):
    pipeline, held = tx_chaos_pipeline(30, DeliveryMode.AT_LEAST_ONCE)
    crash_at_each_pass(subprocess_env, pipeline, "after-db-commit", CRASH_PASSES)
    sink = sink_counts(pipeline.sink_table)
    assert set(sink) == set(held)  # nothing lost
    extra = sum(count - 1 for count in sink.values())
    assert extra > 0
    report = reconcile_pipeline(pipeline)
    assert (report.lost, report.duplicated, report.lag_records) == (0, extra, 0), report.partitions
    # Resuming from Kafka's offset (which may sit on a marker) leaves no gap in the ledger.
    assert not any(f.kind == "gap" for p in report.partitions for f in p.findings), report.partitions


def test_a_final_run_is_caught_up_only_when_every_partition_is_even_those_dead_members_held(tx_chaos_pipeline,
                                                                                           subprocess_env):
    pipeline, held = tx_chaos_pipeline(60, partitions=3)
    slow = [*UNTIL_CAUGHT_UP, "--delay-ms", "30"]
    for _ in range(3):  # three members at a time, all SIGKILLed once they have committed something
        before = ledger_batches(pipeline.pk)
        engines = [EngineProcess(subprocess_env, pipeline.name, *slow) for _ in range(3)]
        try:
            wait_for(lambda before=before: ledger_batches(pipeline.pk) > before + 2, 90, "batches of the members")
        finally:
            for engine in engines:
                engine.kill()
    assert len(sink_counts(pipeline.sink_table)) < len(held)
    started = time.monotonic()
    final = EngineProcess(subprocess_env, pipeline.name, *UNTIL_CAUGHT_UP)
    assert final.wait(150) == 0, final.output()[-3000:]
    assert "caught_up" in final.output()
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in held}, time.monotonic() - started
    assert stored_positions(pipeline) == kafka_admin.high_watermarks(pipeline.topic)


def test_a_run_holding_one_partition_is_not_caught_up_while_another_run_holds_the_rest(tx_chaos_pipeline,
                                                                                       subprocess_env):
    pipeline, held = tx_chaos_pipeline(30, partitions=3)
    # Another run of the pipeline (one that hangs on a slow sink, say): one record per poll, two seconds
    # each. It holds partitions and barely reads them; it gives up the new run's share between records.
    slow = EngineProcess(subprocess_env, pipeline.name, "--batch-size", "1", "--delay-ms", "2000")
    final = None
    try:
        wait_for(lambda: ConsumerRun.objects.filter(pipeline=pipeline, pid=slow.pid).exclude(
            assigned_partitions=[]).exists(), 30, "the slow run's partitions")
        final = EngineProcess(subprocess_env, pipeline.name, *UNTIL_CAUGHT_UP)

        def own_partitions_done():
            run = ConsumerRun.objects.filter(pipeline=pipeline, pid=final.pid).first()
            if run is None or not run.assigned_partitions:
                return None
            assert len(run.assigned_partitions) == 1  # the later run's share of three: one partition
            highs = kafka_admin.high_watermarks(pipeline.topic)
            positions = stored_positions(pipeline)
            if all(positions.get(p) == highs[p] for p in run.assigned_partitions):
                return run.heartbeat_at
            return None

        done_at = wait_for(own_partitions_done, 60, "the run's own partitions to be written")
        # Two more heartbeats (and caught-up checks) later the run is still going: the topic is not done.
        wait_for(lambda: final.poll() is not None
                 or ConsumerRun.objects.filter(pipeline=pipeline, pid=final.pid).first().heartbeat_at
                 .timestamp() > done_at.timestamp() + 2, 30, "two more heartbeats")
        assert final.poll() is None, f"exited while partitions were unread:\n{final.output()[-2000:]}"
        slow.stop()   # it leaves: the final run takes its partitions and reads them to the end
        assert slow.poll() == 0, slow.output()[-2000:]
        assert final.wait(90) == 0, final.output()[-3000:]
    finally:
        slow.kill()
        if final is not None:
            final.kill()
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in held}
