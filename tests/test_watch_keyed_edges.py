"""Keyed watches at their edges: a tombstone that deletes, a tombstone whose delete was lost, a key the producer
wrote into two partitions, and a row left at an older version of its key (what the keyed audit cannot see)."""
import uuid

import pytest
from django.conf import settings
from django.db import connection
from kafka import KafkaProducer
from psycopg2 import sql

from consumers.kafka import admin
from consumers.models import WatchRange
from consumers.operations import watch_setup
from consumers.reconciliation import watch_audit
from tests.watch_helpers import drop_tables

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

# Record timestamps (ms) far apart: which record of a key is the latest never depends on the clock.
T0 = 1_700_000_000_000


@pytest.fixture
def table_name():
    """An upsert table keyed by the record key: one row per key, its latest value."""
    name = f"team_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (id text PRIMARY KEY, body text)").format(
            sql.Identifier(name)).as_string(cur.cursor))
    yield name
    drop_tables(name)


def produce_at(topic: str, records) -> None:
    """records: (partition, key, value, timestamp_ms), sent in order and acknowledged."""
    producer = KafkaProducer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, acks="all")
    try:
        for partition, key, value, stamp in records:
            producer.send(topic, value, key=key, partition=partition, timestamp_ms=stamp)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)


def upsert(table: str, rows) -> None:
    with connection.cursor() as cur:
        for key, body in rows:
            cur.execute(sql.SQL("INSERT INTO {} (id, body) VALUES (%s, %s) ON CONFLICT (id) DO UPDATE "
                                "SET body = excluded.body").format(sql.Identifier(table)).as_string(cur.cursor),
                        [key, body])


def keyed_watch(topic: str, table: str, group: str):
    watch, _ = watch_setup.create(watch_setup.WatchSpec(
        name=f"keyed-{uuid.uuid4().hex[:6]}", group=group, topic=topic, sink_table=table, record_id="key",
        row_id="id", keyed=True, settle_seconds=0))
    return watch


def test_tombstones_delete_rows_and_a_tombstone_whose_row_stayed_is_lost(make_topic, table_name):
    """a: written, b: written then deleted (the consumer deleted it), c: written then deleted (the delete never
    reached the table). Only c's tombstone is lost; a's and b's earlier records are superseded."""
    topic, group = make_topic("upserts"), f"g-{uuid.uuid4().hex[:6]}"
    produce_at(topic, [(0, b"a", b"a1", T0), (0, b"b", b"b1", T0 + 1000), (0, b"c", b"c1", T0 + 2000),
                       (0, b"a", b"a2", T0 + 3000), (0, b"b", None, T0 + 4000), (0, b"c", None, T0 + 5000)])
    upsert(table_name, [("a", "a2"), ("c", "c1")])
    admin.commit_offsets(group, topic, {0: 6})

    report = watch_audit.check_watch(keyed_watch(topic, table_name, group))

    assert (report.checked, report.lost, report.duplicated) == (6, 1, 0)
    assert report.lost_offsets == [{"partition": 0, "offset": 5}]
    assert sum(r.superseded for r in WatchRange.objects.filter(watch__name=report.watch)) == 3


def test_a_row_left_at_an_older_version_of_its_key_is_not_seen(make_topic, table_name):
    """The consumer lost the last record of `a` (its row holds a1, not a2): keyed, the audit checks that the row
    exists, not what it holds (docs/watch.md, "Content"), so nothing is lost."""
    topic, group = make_topic("upserts"), f"g-{uuid.uuid4().hex[:6]}"
    produce_at(topic, [(0, b"a", b"a1", T0), (0, b"a", b"a2", T0 + 1000)])
    upsert(table_name, [("a", "a1")])
    admin.commit_offsets(group, topic, {0: 2})

    report = watch_audit.check_watch(keyed_watch(topic, table_name, group))

    assert (report.checked, report.lost, report.duplicated, report.status) == (2, 0, 0, "OK")


def test_a_key_deleted_in_another_partition_not_yet_committed_is_left_for_later(make_topic, table_name):
    """Key `k` was written to partition 0 and later deleted by a tombstone in partition 1 (the producer's
    partitioning changed). The consumer applied both, but has not committed partition 1 yet (it writes before
    it commits). The latest record of `k` is beyond the settled range, so `k` is not judged now: its record in
    partition 0 is superseded, not lost. When partition 1's commit settles, the tombstone is judged."""
    topic, group = make_topic("upserts", partitions=2), f"g-{uuid.uuid4().hex[:6]}"
    produce_at(topic, [(0, b"k", b"k1", T0), (1, b"k", None, T0 + 1000)])
    admin.commit_offsets(group, topic, {0: 1, 1: 0})   # the row of k was written, then deleted: none left
    watch = keyed_watch(topic, table_name, group)

    report = watch_audit.check_watch(watch)

    assert (report.checked, report.lost, report.duplicated) == (1, 0, 0), report.lost_offsets
    assert sum(r.superseded for r in WatchRange.objects.filter(watch=watch)) == 1

    admin.commit_offsets(group, topic, {0: 1, 1: 1})
    report = watch_audit.check_watch(watch)
    assert (report.checked, report.lost, report.duplicated, report.status) == (2, 0, 0, "OK")


def test_a_key_in_two_partitions_is_judged_by_its_latest_record_across_them(make_topic, table_name):
    """Both partitions committed: `k`'s tombstone in partition 1 is its latest record, the row is still there, so
    the delete was lost; its older record in partition 0 is superseded."""
    topic, group = make_topic("upserts", partitions=2), f"g-{uuid.uuid4().hex[:6]}"
    produce_at(topic, [(0, b"k", b"k1", T0), (1, b"k", None, T0 + 1000)])
    upsert(table_name, [("k", "k1")])
    admin.commit_offsets(group, topic, {0: 1, 1: 1})

    report = watch_audit.check_watch(keyed_watch(topic, table_name, group))

    assert (report.checked, report.lost, report.duplicated) == (2, 1, 0)
    assert report.lost_offsets == [{"partition": 1, "offset": 0}]


def test_within_a_partition_the_last_record_by_offset_decides_whatever_the_timestamps(make_topic, table_name):
    """Producers with skewed clocks: k's tombstone comes after its upsert but carries an older timestamp. The
    consumer applied them in offset order and deleted the row; the upsert, ranked newer by its timestamp alone, was
    reported lost. m's second value, stamped earlier, is the one the table holds."""
    topic, group = make_topic("skewed"), f"g-{uuid.uuid4().hex[:6]}"
    produce_at(topic, [(0, b"k", b"k1", T0 + 2000), (0, b"k", None, T0 + 1000),
                       (0, b"m", b"m1", T0 + 5000), (0, b"m", b"m2", T0 + 3000)])
    upsert(table_name, [("m", "m2")])
    admin.commit_offsets(group, topic, {0: 4})

    report = watch_audit.check_watch(keyed_watch(topic, table_name, group))

    assert (report.checked, report.lost, report.duplicated, report.status) == (4, 0, 0, "OK"), report.as_json()
    assert sum(r.superseded for r in WatchRange.objects.filter(watch__name=report.watch)) == 2
