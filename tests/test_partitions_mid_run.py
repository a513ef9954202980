"""A partition that appears while a run is reading is picked up from its start (its records were produced
since it appeared, whatever the reset policy), written once, reconciled and counted in "caught up", in
every delivery mode.

The embedded broker does not implement CreatePartitions, so the topic is created with two partitions and
partition 1 is hidden from this process's view of the topic's metadata (the consumer's and the admin
helpers') until the run has committed a batch of partition 0; everything else -- broker, fetches, commits,
the database -- is real. Records go to partition 1 before it is revealed, so a run that started it at the
log end (the reset policy "latest") would skip them. kafka-python refreshes topic metadata every
`metadata_max_age_ms` on real Kafka too; the runs look for new partitions at each balance (about a second).
"""
import threading

import pytest
from kafka import KafkaConsumer

from consumers.engine import caught_up
from consumers.engine import spark as spark_engine
from consumers.engine.rdkafka import RdKafkaConsumer
from consumers.kafka import admin as kafka_admin
from consumers.models import ConsumerRun, DeliveryMode, Engine, PartitionOffset, ResetPolicy, RunState
from consumers.reconciliation.reconcile import reconcile_pipeline
from tests.chaos import sink_counts
from tests.conftest import drop_sink_tables
from tests.pipelines import create_pipeline
from tests.producing import into, send
from tests.test_engine import in_thread
from tests.waiting import patience, wait_for

pytestmark = [pytest.mark.kafka]

NEW = 1  # the partition that appears mid-run


@pytest.fixture
def hidden_partition(monkeypatch):
    """Partition NEW of every topic is invisible to this process until the returned event is set."""
    revealed = threading.Event()
    partitions_for_topic = KafkaConsumer.partitions_for_topic
    watermarks = kafka_admin.watermarks

    def visible_partitions(self, topic):
        partitions = partitions_for_topic(self, topic)
        return partitions if revealed.is_set() or partitions is None else {p for p in partitions if p != NEW}

    def visible_watermarks(topic, partitions=None, **kwargs):
        marks = watermarks(topic, partitions, **kwargs)
        return marks if revealed.is_set() else {p: m for p, m in marks.items() if p != NEW}

    monkeypatch.setattr(KafkaConsumer, "partitions_for_topic", visible_partitions)
    partitions = RdKafkaConsumer.partitions

    def visible_rdkafka_partitions(self):   # the librdkafka client's view of the topic
        found = partitions(self)
        return found if revealed.is_set() or found is None else {p for p in found if p != NEW}

    monkeypatch.setattr(RdKafkaConsumer, "partitions", visible_rdkafka_partitions)
    monkeypatch.setattr(kafka_admin, "watermarks", visible_watermarks)
    return revealed


@pytest.mark.parametrize("mode", [DeliveryMode.EXACTLY_ONCE, DeliveryMode.AT_LEAST_ONCE, DeliveryMode.AT_MOST_ONCE])
def test_a_partition_that_appears_while_a_run_reads_is_read_from_its_start(transactional_db, kafka_bootstrap,
                                                                            make_topic, hidden_partition, mode,
                                                                            kafka_client):
    topic = make_topic("grow", partitions=2)
    pipeline = create_pipeline(topic, topic, f"sink_{topic}".replace("-", "_"), "int_value", mode,
                               batch_size=10, reset_policy=ResetPolicy.LATEST)
    stop = threading.Event()
    thread, holder = in_thread(pipeline.name, stop=stop, max_seconds=patience(120))
    ready = ConsumerRun.objects.filter(pipeline=pipeline, assigned_partitions=[0])
    check_growth(pipeline, kafka_bootstrap, hidden_partition, stop, thread, holder, ready,
                 "the run to hold partition 0")
    assert ConsumerRun.objects.filter(pipeline=pipeline).latest("pk").assigned_partitions == [0, NEW]


@pytest.mark.spark
def test_the_spark_engine_reads_a_partition_that_appears_mid_run_from_its_start(transactional_db, kafka_bootstrap,
                                                                                make_topic, hidden_partition):
    topic = make_topic("grow-spark", partitions=2)
    pipeline = create_pipeline(topic, topic, f"sink_{topic}".replace("-", "_"), "int_value",
                               DeliveryMode.EXACTLY_ONCE, batch_size=10, reset_policy=ResetPolicy.LATEST,
                               engine=Engine.SPARK)
    stop, holder = threading.Event(), {}

    def target():
        try:
            holder["result"] = spark_engine.run_pipeline(pipeline.name, stop=stop, max_seconds=patience(240))
        finally:
            from django.db import connection
            connection.close()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    ready = ConsumerRun.objects.filter(pipeline=pipeline, state=RunState.RUNNING)
    check_growth(pipeline, kafka_bootstrap, hidden_partition, stop, thread, holder, ready, "the Spark query to run")


def check_growth(pipeline, kafka_bootstrap, hidden_partition, stop, thread, holder, ready, what):
    """Partition 0 read, then partition NEW appears with records already in it: both end up in the sink
    exactly once, reconciled, caught up."""
    topic = pipeline.topic
    try:
        wait_for(ready.exists, patience(120), what)
        send(topic, into(0, range(1, 21)))
        wait_for(lambda: PartitionOffset.objects.filter(pipeline=pipeline, partition=0, next_offset=20).exists(),
                 patience(60), "partition 0's records")
        assert caught_up.topic_caught_up(pipeline).done   # as far as anyone here can see: one partition
        send(topic, into(NEW, range(21, 31)))  # before the run can see the partition
        hidden_partition.set()
        wait_for(lambda: PartitionOffset.objects.filter(pipeline=pipeline, partition=NEW, next_offset=10).exists(),
                 patience(60), "the new partition's records")
    finally:
        stop.set()
        thread.join(timeout=patience(60))
    try:
        assert holder["result"].reason == "stopped", holder["result"].detail
        assert sink_counts(pipeline.sink_table) == {value: 1 for value in range(1, 31)}
        assert caught_up.topic_caught_up(pipeline).done
        report = reconcile_pipeline(pipeline)
        assert [p.partition for p in report.partitions] == [0, NEW]
        assert (report.lost, report.duplicated, report.lag_records, report.status) == (0, 0, 0, "OK")
    finally:
        drop_sink_tables([pipeline.sink_table])
