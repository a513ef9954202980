"""A watched consumer of a transactional topic that committed its last record + 1 (as Spring Kafka, Flink and
manual commits do) sits below the final transaction marker: only a hole is left before the log end, so it is caught
up, with no lag, both in a check and in the beat's pass over quiet watches, and the read of the record at its offset
stops at the log end instead of waiting out its timeout."""
import time
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from kafka import KafkaProducer
from psycopg2 import sql

from consumers.kafka import admin
from consumers.models import WatchPartition
from consumers.operations import watch_setup
from consumers.reconciliation import watch_audit, watch_pass
from tests.watch_helpers import drop_tables

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def committed_below_the_marker(make_topic):
    """Records 0..2 in one committed transaction, its marker at offset 3; the group committed 3; the table holds
    every record."""
    topic, group = make_topic("txend"), f"g-{uuid.uuid4().hex[:6]}"
    producer = KafkaProducer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS,
                             transactional_id=f"tx-{uuid.uuid4().hex[:8]}", acks="all")
    producer.init_transactions()
    producer.begin_transaction()
    for value in range(3):
        producer.send(topic, str(value).encode(), partition=0)
    producer.commit_transaction()
    producer.close(timeout=5)
    assert admin.watermarks(topic)[0].end == 4
    table = f"team_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(table)).as_string(cur.cursor))
        cur.execute(sql.SQL("INSERT INTO {} VALUES (0), (1), (2)").format(sql.Identifier(table)).as_string(cur.cursor))
    admin.commit_offsets(group, topic, {0: 3})
    watch, _ = watch_setup.create(watch_setup.WatchSpec(name=f"tx-{uuid.uuid4().hex[:6]}", group=group, topic=topic,
                                                        sink_table=table, record_id="value", row_id="id",
                                                        settle_seconds=0))
    yield watch
    drop_tables(table)


def test_a_check_finds_no_lag_and_stays_ok_past_the_window(committed_below_the_marker):
    watch, now = committed_below_the_marker, timezone.now()
    first = watch_audit.check_watch(watch, settle_seconds=0, now=now)
    later = watch_audit.check_watch(watch, settle_seconds=0,
                                    now=now + timedelta(seconds=settings.RECONCILE_WINDOW_SECONDS + 60))
    assert first.clean and first.checked == 3
    assert (first.lag_records, first.lag_seconds) == (0, 0.0), first.as_json()
    assert later.status == "OK", later.as_json()


def test_the_quiet_pass_finds_no_lag(committed_below_the_marker):
    watch, now = committed_below_the_marker, timezone.now()
    watch_audit.check_watch(watch, settle_seconds=0, now=now)          # audits the records: the watch is quiet
    watch_pass.check_all(now=now + timedelta(seconds=60))
    assert list(WatchPartition.objects.filter(watch=watch).values_list("lag_records", "lag_seconds")) == [(0, 0.0)]


def test_the_record_at_a_marker_is_looked_for_no_further_than_the_log_end(committed_below_the_marker):
    watch, ended = committed_below_the_marker, set()
    started = time.monotonic()
    assert admin.record_timestamps(watch.topic, {0: 3}, timeout_s=60, ended=ended) == {0: None}
    assert ended == {0} and time.monotonic() - started < 30   # it waited out the timeout before


def test_an_offset_retention_removed_since_the_watermarks_keeps_its_lag(monkeypatch):
    """The probe jumped to the log end on an out-of-range offset (kafka-python's default reset), which passed for a
    read that found only holes: a stalled group behind retention showed lag 0. It now reads from the log start."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from consumers.kafka.admin import Watermarks
    from consumers.reconciliation import watch_lag
    from tests.test_kafka_ranges import RetainedConsumer

    monkeypatch.setattr(admin, "probe_consumer", lambda cluster, **config: RetainedConsumer(6, 10, **config))
    ended: set = set()
    assert admin.record_timestamps("orders", {0: 2}, timeout_s=1, ended=ended) == {0: None}
    assert ended == set()
    part = SimpleNamespace(committed=2, start_offset=0, log_start=None, high_watermark=None, lag_records=None,
                           lag_seconds=None)
    watch_lag.measure(SimpleNamespace(topic="orders"), {0: part}, {0: Watermarks(2, 10)}, admin, datetime.now(UTC), [])
    assert part.lag_records == 8
