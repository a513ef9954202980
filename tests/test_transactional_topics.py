"""Transactional topics on the real broker: holes from markers and aborted records are not gaps, aborted
records never reach a sink, and every mode (both engines elsewhere) ends caught up with lag 0."""
import pytest

from consumers.engine.python import run_pipeline
from consumers.kafka import admin as kafka_admin
from consumers.models import BatchLedger, DeliveryMode, PartitionOffset
from consumers.reconciliation.reconcile import reconcile_pipeline
from tests.chaos import sink_counts
from tests.conftest import drop_sink_tables
from tests.pipelines import create_pipeline
from tests.transactional_log import mixed_transactions, produce_transactions, topic_values

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_client")]


@pytest.fixture
def make_tx_pipeline(transactional_db, kafka_bootstrap, make_topic):
    created = []

    def make(transactions, mode=DeliveryMode.EXACTLY_ONCE, partitions=1, batch_size=4, **fields):
        topic = make_topic("tx", partitions=partitions)
        committed = produce_transactions(topic, transactions, partitions)
        pipeline = create_pipeline(topic, topic, f"sink_{topic}".replace("-", "_"), "int_value", mode,
                                   batch_size=batch_size, **fields)
        created.append(pipeline.sink_table)
        return pipeline, committed

    yield make
    drop_sink_tables(created)


def test_the_embedded_broker_leaves_real_offset_holes(make_tx_pipeline):
    pipeline, committed = make_tx_pipeline([(range(1, 6), True), (range(6, 11), False), (range(11, 16), True)])
    assert committed == [1, 2, 3, 4, 5, 11, 12, 13, 14, 15]
    # A marker per transaction (and the aborted records, if the broker keeps them) take offsets.
    assert kafka_admin.watermarks(pipeline.topic)[0].high >= 12


@pytest.mark.parametrize("mode", [DeliveryMode.EXACTLY_ONCE, DeliveryMode.AT_LEAST_ONCE, DeliveryMode.AT_MOST_ONCE])
def test_each_mode_reads_a_transactional_topic_to_its_end_and_reconciles_with_nothing_lost(make_tx_pipeline, mode):
    pipeline, committed = make_tx_pipeline(mixed_transactions(9), mode, partitions=2)
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "caught_up", result.detail
    # Every record the topic holds (read_committed), exactly once.
    held = topic_values(pipeline.topic)
    assert set(committed) <= set(held)
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in held}
    marks = kafka_admin.watermarks(pipeline.topic)
    positions = dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))
    assert positions == {p: mark.high for p, mark in marks.items()}  # past the last marker
    # The ledger counts records present, not positions covered.
    assert sum(BatchLedger.objects.filter(pipeline=pipeline).values_list("records", flat=True)) == len(held)
    # Kafka's copy is the same position, after the DB commit.
    assert kafka_admin.committed_offsets(pipeline.group_id, pipeline.topic, sorted(marks)) == positions
    report = reconcile_pipeline(pipeline)
    assert (report.lost, report.duplicated, report.lag_records, report.status) == (0, 0, 0, "OK"), report.partitions


def test_a_batch_size_that_ends_exactly_before_a_marker_still_reaches_the_log_end(make_tx_pipeline):
    # batch 5 = one transaction: each poll ends just before a marker; the next crosses only the marker.
    pipeline, committed = make_tx_pipeline([(range(1, 6), True), (range(6, 11), True)], batch_size=5)
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert (result.reason, result.records) == ("caught_up", len(committed))
    assert PartitionOffset.objects.get(pipeline=pipeline, partition=0).next_offset == 12


def test_an_open_transaction_is_not_lag_and_does_not_keep_a_pipeline_from_being_caught_up(make_tx_pipeline):
    from django.conf import settings
    from kafka import KafkaProducer

    pipeline, committed = make_tx_pipeline([(range(1, 6), True)])
    producer = KafkaProducer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, transactional_id="tally-open-tx")
    producer.init_transactions()
    producer.begin_transaction()
    for value in range(100, 105):
        producer.send(pipeline.topic, str(value).encode(), partition=0)
    producer.flush()
    try:
        mark = kafka_admin.watermarks(pipeline.topic)[0]
        assert mark.high > mark.stable == mark.end  # the open transaction lies between
        result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
        assert result.reason == "caught_up", result.detail
        assert sink_counts(pipeline.sink_table) == {value: 1 for value in committed}
        assert PartitionOffset.objects.get(pipeline=pipeline, partition=0).next_offset == mark.stable
        report = reconcile_pipeline(pipeline)
        assert (report.lost, report.lag_records, report.status) == (0, 0, "OK"), report.partitions
    finally:
        producer.abort_transaction()
        producer.close(timeout=5)


@pytest.mark.parametrize("level", ["read_committed", "read_uncommitted"])
def test_the_engine_reads_with_the_pipelines_isolation_level_read_committed_by_default(make_tx_pipeline,
                                                                                      monkeypatch, level):
    from consumers.engine import python as engine
    from consumers.models import Pipeline

    pipeline, _ = make_tx_pipeline([(range(1, 6), True)])
    assert Pipeline.objects.get(pk=pipeline.pk).isolation_level == "read_committed"  # the default
    Pipeline.objects.filter(pk=pipeline.pk).update(isolation_level=level)
    levels = []
    real = engine.make_consumer

    def recording(*args, **kwargs):
        consumer = real(*args, **kwargs)
        levels.append(consumer.isolation_level)
        return consumer

    monkeypatch.setattr(engine, "make_consumer", recording)
    assert run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60).reason == "caught_up"
    assert levels == [level]
