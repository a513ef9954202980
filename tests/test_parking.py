"""Parked runs (consumers/engine/parking.py): a run idle for TALLY_PARK_IDLE_SECONDS closes its consumer, keeps its
partitions and its heartbeat, and reads on exactly as before when records arrive, when it is stopped or fenced,
and when a peer joins. Against the real broker and PostgreSQL, under both Kafka clients."""
import threading

import pytest

from consumers.engine import parking
from consumers.kafka import admin as kafka_admin
from consumers.models import ConsumerRun, DeliveryMode, PartitionOffset, Pipeline
from tests.chaos import produce_values, sink_counts, wait_for
from tests.test_engine import in_thread, make_pipeline  # noqa: F401 - the engine tests' fixture
from tests.transactional_log import produce_transactions, topic_values
from tests.waiting import patience

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_client")]


@pytest.fixture
def make_parking_pipeline(make_pipeline, settings):  # noqa: F811 - the engine tests' fixture, imported above
    """The engine tests' `make_pipeline`, with runs that park after a second idle."""
    settings.TALLY_PARK_IDLE_SECONDS = 1
    return make_pipeline


def parked_on(topic: str) -> list[parking.Parked]:
    return [p for p in list(parking.lot().parked) if p.topic == topic and not p.woken.is_set()]


def every_value_once(first: int, last: int) -> dict[int, int]:
    return {value: 1 for value in range(first, last + 1)}


@pytest.mark.parametrize("mode", [DeliveryMode.EXACTLY_ONCE, DeliveryMode.AT_LEAST_ONCE])
def test_a_parked_run_wakes_for_new_records_writes_each_once_and_parks_again(make_parking_pipeline,
                                                                          mode):
    pipeline = make_parking_pipeline(range(1, 11), mode, partitions=2)
    stop = threading.Event()
    thread, holder = in_thread(pipeline.name, stop=stop, max_seconds=patience(120))
    try:
        wait_for(lambda: sink_counts(pipeline.sink_table) == every_value_once(1, 10), patience(30), "the first ten")
        wait_for(lambda: parked_on(pipeline.topic), patience(30), "the run to park")
        run = ConsumerRun.objects.get(pipeline=pipeline)
        assert sorted(run.assigned_partitions) == [0, 1]     # parked, it still holds its partitions
        produce_values(pipeline.topic, range(11, 31), 2)
        wait_for(lambda: sink_counts(pipeline.sink_table) == every_value_once(1, 30), patience(30),
                 "the parked run to wake and write the next twenty")
        wait_for(lambda: parked_on(pipeline.topic), patience(30), "the run to park again")
    finally:
        stop.set()
        thread.join(timeout=patience(30))
    assert holder["result"].reason == "stopped", holder["result"].detail
    assert sink_counts(pipeline.sink_table) == every_value_once(1, 30)
    assert kafka_admin.committed_offsets(pipeline.group_id, pipeline.topic, [0, 1]) == {0: 15, 1: 15}
    assert not parked_on(pipeline.topic)


def test_a_parked_run_wakes_for_transactions_crosses_their_markers_and_keeps_only_what_was_committed(
        make_parking_pipeline):
    pipeline = make_parking_pipeline([])
    stop = threading.Event()
    thread, holder = in_thread(pipeline.name, stop=stop, max_seconds=patience(120))
    try:
        wait_for(lambda: parked_on(pipeline.topic), patience(30), "the run to park")
        committed = produce_transactions(pipeline.topic, [(range(1, 6), True), (range(6, 11), False),
                                                          (range(11, 16), True)])
        held = topic_values(pipeline.topic)   # what a read_committed consumer reads (see transactional_log)
        end = kafka_admin.watermarks(pipeline.topic)[0].high
        wait_for(lambda: PartitionOffset.objects.filter(pipeline=pipeline, partition=0, next_offset=end).exists(),
                 patience(30), "the woken run to store the position past the last marker")
        wait_for(lambda: parked_on(pipeline.topic), patience(30), "the run to park again past the markers")
    finally:
        stop.set()
        thread.join(timeout=patience(30))
    assert holder["result"].reason == "stopped", holder["result"].detail
    assert set(committed) <= set(held)
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in held}


def test_a_parked_run_ends_when_its_pipeline_moves_to_a_newer_epoch(make_parking_pipeline):
    pipeline = make_parking_pipeline(range(1, 6))
    thread, holder = in_thread(pipeline.name, max_seconds=patience(120))
    wait_for(lambda: parked_on(pipeline.topic), patience(30), "the run to park")
    Pipeline.objects.filter(pk=pipeline.pk).bump_epoch()
    thread.join(timeout=patience(30))
    assert holder["result"].reason == "fenced", holder["result"].detail
    assert not parked_on(pipeline.topic)


def test_a_parked_run_wakes_when_a_peer_joins_and_hands_it_its_share(make_parking_pipeline):
    pipeline = make_parking_pipeline(range(1, 41), partitions=2)
    stop = threading.Event()
    first = in_thread(pipeline.name, stop=stop, max_seconds=patience(120))
    wait_for(lambda: parked_on(pipeline.topic), patience(30), "the first run to park")
    second = in_thread(pipeline.name, stop=stop, max_seconds=patience(120))
    try:
        wait_for(lambda: sorted(sorted(r.assigned_partitions) for r in ConsumerRun.objects.filter(
            pipeline=pipeline, ended_at__isnull=True)) == [[0], [1]], patience(60), "the two runs to split")
        produce_values(pipeline.topic, range(41, 61), 2)
        wait_for(lambda: sink_counts(pipeline.sink_table) == every_value_once(1, 60), patience(30),
                 "the records of both partitions")
    finally:
        stop.set()
        for thread, _ in (first, second):
            thread.join(timeout=patience(30))
    assert [holder["result"].reason for _, holder in (first, second)] == ["stopped", "stopped"]
