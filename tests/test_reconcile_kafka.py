"""Reconciliation against the real embedded broker: high watermarks with multi-record batches, lag in
records and seconds, Kafka's committed offset beyond the database, and the `reconcile` command."""
import json
import time

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from consumers.engine import commit, db, sinks
from consumers.engine.transforms import SourceRecord, resolve
from consumers.kafka import admin as kafka_admin
from consumers.models import DeliveryMode, Pipeline
from consumers.reconciliation import reconcile
from tests.conftest import drop_sink_tables
from tests.producing import numbered, send

pytestmark = pytest.mark.kafka


def read_records(topic, partition, start, end):
    """The topic's real records [start, end) of one partition, as the engine would hand them over."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS,
                             enable_auto_commit=False, consumer_timeout_ms=2000)
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    consumer.seek(tp, start)
    found = []
    deadline = time.monotonic() + 10
    while len(found) < end - start and time.monotonic() < deadline:
        for record in consumer.poll(timeout_ms=200).get(tp, []):
            if record.offset < end:
                found.append(SourceRecord(partition, record.offset, record.key, record.value, record.timestamp))
    consumer.close()
    return found


@pytest.fixture
def pipelines(transactional_db):
    conn = db.connect()
    made = []

    def make(topic, mode=DeliveryMode.EXACTLY_ONCE):
        pipeline = Pipeline.objects.create(name=f"rk-{len(made)}", topic=topic, sink_table=f"rk_sink_{len(made)}",
                                           delivery_mode=mode, epoch=1)
        made.append(pipeline)
        with connection.cursor() as cur:
            sinks.ensure_sink_table(cur, pipeline.sink_table, resolve("int_value"), pipeline.is_exactly_once)
        target = commit.Target.for_pipeline(pipeline)

        def write(partition, start, end):
            if pipeline.is_exactly_once:
                commit.ensure_positions(conn, pipeline.pk, {partition: start})
            commit.commit_batch(conn, target, 1, {partition: read_records(topic, partition, start, end)})

        return pipeline, write

    yield make
    conn.close()
    drop_sink_tables(pipeline.sink_table for pipeline in made)


def test_lag_uses_the_true_high_watermark_of_multi_record_batches(kafka_bootstrap, make_topic, pipelines):
    topic = make_topic("rk-hw", partitions=2)
    send(topic, numbered(600, partitions=2))
    pipeline, write = pipelines(topic)
    write(0, 0, 120)
    write(1, 0, 300)
    report = reconcile.reconcile_pipeline(pipeline)
    by_partition = {p.partition: p for p in report.partitions}
    assert (by_partition[0].high_watermark, by_partition[1].high_watermark) == (300, 300)
    assert (by_partition[0].lag_records, by_partition[1].lag_records, report.lag_records) == (180, 0, 180)
    assert 0 < by_partition[0].lag_seconds < 120 and by_partition[1].lag_seconds == 0
    assert report.exact and report.kafka_error == ""
    # The normal case of the log-start check on a real broker: nothing deleted, nothing unrecoverable.
    assert [p.log_start for p in report.partitions] == [0, 0] and report.unrecoverable == 0


def test_a_kafka_offset_committed_beyond_the_database_is_counted_as_lost(kafka_bootstrap, make_topic, pipelines):
    topic = make_topic("rk-amo")
    send(topic, numbered(50))
    pipeline, write = pipelines(topic, DeliveryMode.AT_MOST_ONCE)
    write(0, 0, 10)
    kafka_admin.commit_offsets(pipeline.group_id, topic, {0: 30})  # committed, then the crash: 10..29 never written
    report = reconcile.reconcile_pipeline(pipeline)
    assert (report.lost, report.partitions[0].kafka_committed, report.lag_records) == (20, 30, 20)
    write(0, 30, 50)  # the consumer resumed from Kafka's offset
    kafka_admin.commit_offsets(pipeline.group_id, topic, {0: 50})
    later = reconcile.reconcile_pipeline(pipeline)
    assert later.lost == 20 and [(f.start, f.end) for f in later.partitions[0].findings
                                 if f.kind == "gap"] == [(10, 30)]
    assert later.lag_records == 0


def test_the_reconcile_command_exits_1_on_loss_and_prints_the_json_report(kafka_bootstrap, make_topic, pipelines,
                                                                          capsys):
    topic = make_topic("rk-cmd")
    send(topic, numbered(20))
    exact, write_exact = pipelines(topic)
    write_exact(0, 0, 20)
    call_command("reconcile", exact.name, "--json")  # exact: returns normally (exit code 0)
    data = json.loads(capsys.readouterr().out)
    assert data["pipelines"][0]["name"] == exact.name and data["pipelines"][0]["lost"] == 0
    lossy, write_lossy = pipelines(topic, DeliveryMode.AT_MOST_ONCE)
    write_lossy(0, 0, 5)
    write_lossy(0, 10, 20)
    with pytest.raises(SystemExit) as exited:
        call_command("reconcile")
    assert exited.value.code == 1
    out = capsys.readouterr().out
    assert f"{lossy.name} [at_most_once] ERR: lost 5" in out and "lost: offsets 5..9 (5 records)" in out
