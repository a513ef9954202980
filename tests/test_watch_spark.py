"""The watch audit on Spark gives the PostgreSQL audit's answer on the same data: the same topic and table
audited by two watches, one matched inside PostgreSQL, one forced onto Spark executors (spark_threshold=1).
Each case holds lost and duplicated records, ignored and unreadable ones; offset ids add transaction markers
and a phantom row at a marker's position; keyed ids add superseded records and a lost delete."""
import json
import uuid

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from psycopg2 import sql

from consumers.engine.spark_session import get_spark
from consumers.kafka import admin
from consumers.models import WatchRange
from consumers.operations import watch_setup
from consumers.reconciliation import watch_audit, watch_spark
from tests.test_watch_command import CleanupPolicy
from tests.transactional_log import mixed_transactions, produce_transactions
from tests.watch_helpers import as_offsets, produce, read_topic, stored_findings

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def spark():
    return get_spark()


@pytest.fixture
def spark_matches(monkeypatch):
    """The Spark match's calls: proof that the forced check ran on Spark (and the other did not)."""
    calls = []
    real = watch_spark.match

    def counted(watch, *args, **kwargs):
        calls.append(watch.name)
        return real(watch, *args, **kwargs)

    monkeypatch.setattr(watch_spark, "match", counted)
    return calls


def execute(statement: sql.Composable, rows=((),)) -> None:
    with connection.cursor() as cur:
        for params in rows:
            cur.execute(statement.as_string(cur.cursor), params)


def commit_all(group: str, topic: str) -> None:
    admin.commit_offsets(group, topic, {p: mark.high for p, mark in admin.watermarks(topic).items()})


def audit_both(spark_matches, kafka=None, matched_on_spark=True, **spec):
    """Two watches of the same group, topic and table; one checked on PostgreSQL, one on Spark (`kafka`: the
    watch's Kafka calls, the cluster's by default; `matched_on_spark`: whether the forced check is matched
    there). Returns both reports and what each stored (ranges, findings)."""
    results = []
    for engine, threshold in (("pg", 0), ("spark", 1)):
        watch, _ = watch_setup.create(watch_setup.WatchSpec(name=f"{engine}-{uuid.uuid4().hex[:6]}",
                                                            settle_seconds=0, **spec))
        report = watch_audit.check_watch(watch, now=timezone.now(), kafka=kafka, spark_threshold=threshold)
        assert not report.error, report.error
        ranges = sorted((r.partition, r.start, r.end, r.records, r.ignored, r.superseded, r.unreadable, r.lost,
                         r.duplicated, r.phantom, r.lost_offsets, r.duplicated_offsets, r.phantom_offsets, r.note)
                        for r in WatchRange.objects.filter(watch=watch))
        findings = stored_findings(watch, "kind", "extra")
        results.append((watch.name, report, ranges, findings))
    (pg_name, pg, pg_ranges, pg_findings), (spark_name, on_spark, spark_ranges, spark_findings) = results
    assert spark_matches == ([spark_name] if matched_on_spark else [])   # only the forced check matched on Spark
    assert on_spark.as_json() | {"lag": None} == pg.as_json() | {"lag": None}
    assert (on_spark.checked, on_spark.phantom) == (pg.checked, pg.phantom)
    assert spark_ranges == pg_ranges and spark_findings == pg_findings
    return pg, pg_ranges, pg_findings


def test_plain_ids_with_ignored_unreadable_repeated_lost_and_duplicated_records(spark, make_topic, table_name,
                                                                               spark_matches):
    topic = make_topic("orders", partitions=2)
    values = [json.dumps({"id": n}).encode() for n in range(1, 41)]
    values += [json.dumps({"type": "heartbeat"}).encode()] * 3 + [b"not json", json.dumps({"id": 5}).encode()]
    values.append(json.dumps({"id": "7"}).encode())   # a string id names the same bigint row as a number
    produce(topic, [(None, v) for v in values], partitions=2)
    execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(table_name)))
    rows = [n for n in range(1, 41) if n not in (3, 17)] + [8, 20, 20, 7]   # 3, 17 lost; 8 twice, 20 three times
    execute(sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(sql.Identifier(table_name)), [[n] for n in rows])
    group = f"g-{uuid.uuid4().hex[:6]}"
    commit_all(group, topic)

    pg, ranges, findings = audit_both(spark_matches, group=group, topic=topic, sink_table=table_name,
                                      record_id="json:id", row_id="id", ignore=["json:type=heartbeat"])

    records = read_topic(topic)
    where = {json.loads(v).get("id"): at for at, (_, v, _) in sorted(records.items()) if v != b"not json"}
    five = sorted(at for at, (_, v, _) in records.items() if v == json.dumps({"id": 5}).encode())
    assert pg.checked == len(values) == sum(r[3] for r in ranges)
    assert sum(r[4] for r in ranges) == 3 and sum(r[6] for r in ranges) == 1   # heartbeats ignored, one unreadable
    # 3 and 17 have no row; id 5 has two records and one row: its second record is lost
    assert as_offsets(pg.lost_offsets) == {where[3], where[17], five[1]}
    assert pg.duplicated == 1 + 2   # 8: one extra row, 20: two extra rows (7: two records, two rows: fine)
    assert as_offsets(pg.duplicated_offsets) == {where[8], where[20]}
    assert len(findings) == 5


def test_offset_ids_with_transaction_markers_a_phantom_and_an_ignored_record(spark, make_topic, table_name,
                                                                            spark_matches):
    topic = make_topic("tx", partitions=1)
    produce_transactions(topic, mixed_transactions(3, size=5))
    records = sorted(read_topic(topic))
    end = admin.watermarks(topic)[0].high
    holes = sorted(set(range(end)) - {o for _, o in records})
    assert holes   # the markers' positions hold no record
    execute(sql.SQL("CREATE TABLE {} (part integer, off bigint)").format(sql.Identifier(table_name)))
    lost, doubled, ignored = records[1], records[4], records[6]
    value_of_ignored = read_topic(topic)[ignored][1].decode()
    rows = [at for at in records if at not in (lost, ignored)] + [doubled, (0, holes[0])]
    execute(sql.SQL("INSERT INTO {} (part, off) VALUES (%s, %s)").format(sql.Identifier(table_name)), rows)
    group = f"g-{uuid.uuid4().hex[:6]}"
    commit_all(group, topic)

    pg, ranges, findings = audit_both(spark_matches, group=group, topic=topic, sink_table=table_name,
                                      record_id="offset", row_id="part,off", ignore=[f"value={value_of_ignored}"])

    assert pg.checked == len(records) and sum(r[4] for r in ranges) == 1
    assert as_offsets(pg.lost_offsets) == {lost} and as_offsets(pg.duplicated_offsets) == {doubled}
    assert pg.phantom == 1 and [r[12] for r in ranges] == [[holes[0]]]


def test_offset_ids_on_a_compacted_topic_count_a_second_row_at_a_hole_and_no_phantom(spark, make_topic, table_name,
                                                                                   spark_matches):
    topic = make_topic("compacted", partitions=1)
    produce_transactions(topic, mixed_transactions(2, size=3))
    records = sorted(read_topic(topic))
    holes = sorted(set(range(admin.watermarks(topic)[0].high)) - {o for _, o in records})
    execute(sql.SQL("CREATE TABLE {} (part integer, off bigint)").format(sql.Identifier(table_name)))
    # Positions compaction may have emptied since the consumer read them: one row is no finding, two are.
    rows = records + [(0, holes[0]), (0, holes[0]), (0, holes[1])]
    execute(sql.SQL("INSERT INTO {} (part, off) VALUES (%s, %s)").format(sql.Identifier(table_name)), rows)
    group = f"g-{uuid.uuid4().hex[:6]}"
    commit_all(group, topic)

    pg, ranges, findings = audit_both(spark_matches, kafka=CleanupPolicy("compact"), group=group, topic=topic,
                                      sink_table=table_name, record_id="offset", row_id="part,off")

    assert (pg.checked, pg.lost, pg.phantom, pg.duplicated) == (len(records), 0, 0, 1)
    assert findings == [(0, holes[0], "duplicated", 1)]
    assert any("cleanup.policy=compact" in note for note in pg.notes)


@pytest.mark.parametrize("column", ["text COLLATE tally_ci", "citext"], ids=["collation", "citext"])
@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_case_insensitive_ids_are_matched_as_postgresql_compares_them(spark, make_topic, table_name, spark_matches,
                                                                      keyed, column):
    # Spark compares text by its bytes: 'Ann' would be lost there and delivered in PostgreSQL, where the row-id
    # column's nondeterministic collation, or its type citext, makes it equal to the row 'ann'.
    topic = make_topic("people")
    produce(topic, [(None, name.encode()) for name in ("Ann", "bob", "Cy", "Dee", "Dee")])
    execute(sql.SQL("CREATE COLLATION IF NOT EXISTS tally_ci (provider = icu, locale = 'und-u-ks-level2', "
                    "deterministic = false)"))
    execute(sql.SQL("CREATE EXTENSION IF NOT EXISTS citext"))
    execute(sql.SQL("CREATE TABLE {} (name {})").format(sql.Identifier(table_name), sql.SQL(column)))
    execute(sql.SQL("INSERT INTO {} (name) VALUES (%s)").format(sql.Identifier(table_name)),
            [["ann"], ["BOB"], ["DEE"], ["dee"]])
    group = f"g-{uuid.uuid4().hex[:6]}"
    commit_all(group, topic)

    pg, _, _ = audit_both(spark_matches, matched_on_spark=False, group=group, topic=topic,
                          sink_table=table_name, record_id="value", row_id="name", keyed=keyed)

    assert as_offsets(pg.lost_offsets) == {(0, 2)} and pg.checked == 5
    assert pg.duplicated == (1 if keyed else 0)


def test_ids_of_a_char_column_are_matched_as_postgresql_compares_them(spark, make_topic, table_name, spark_matches):
    # char(n) ignores trailing blanks: the record 'bob  ' names the row 'bob'. Compared as text, 'bob  ' would be
    # lost in PostgreSQL; on Spark, which reads the rows blank-padded ('ann  '), 'ann' would be.
    topic = make_topic("people")
    produce(topic, [(None, name.encode()) for name in ("ann", "bob  ", "cy")])
    execute(sql.SQL("CREATE TABLE {} (name char(5))").format(sql.Identifier(table_name)))
    execute(sql.SQL("INSERT INTO {} (name) VALUES (%s)").format(sql.Identifier(table_name)), [["ann"], ["bob"]])
    group = f"g-{uuid.uuid4().hex[:6]}"
    commit_all(group, topic)

    pg, _, _ = audit_both(spark_matches, matched_on_spark=False, group=group, topic=topic, sink_table=table_name,
                          record_id="value", row_id="name")

    assert as_offsets(pg.lost_offsets) == {(0, 2)} and pg.checked == 3


def test_keyed_updates_with_superseded_records_a_lost_delete_and_a_lost_latest(spark, make_topic, table_name,
                                                                              spark_matches):
    topic = make_topic("updates", partitions=2)
    updates = [(f"k{n}".encode(), f"v{n}-{version}".encode()) for version in range(2) for n in range(1, 11)]
    updates += [(b"k2", None)]   # a delete whose row is still there: the delete was lost
    produce(topic, updates, partitions=2)
    execute(sql.SQL("CREATE TABLE {} (id text)").format(sql.Identifier(table_name)))
    rows = [f"k{n}" for n in range(1, 11) if n != 3] + ["k4"]   # k3's latest has no row; k4 has two
    execute(sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(sql.Identifier(table_name)), [[k] for k in rows])
    group = f"g-{uuid.uuid4().hex[:6]}"
    commit_all(group, topic)

    pg, ranges, findings = audit_both(spark_matches, group=group, topic=topic, sink_table=table_name,
                                      record_id="key", row_id="id", keyed=True)

    records = read_topic(topic)
    latest = {}
    for at, (key, _, _) in sorted(records.items(), key=lambda item: (item[1][2], item[0][1])):
        latest[key] = at
    assert pg.checked == len(updates) and sum(r[5] for r in ranges) == len(updates) - 10
    assert as_offsets(pg.lost_offsets) == {latest[b"k2"], latest[b"k3"]}
    assert as_offsets(pg.duplicated_offsets) == {latest[b"k4"]} and pg.duplicated == 1


def test_keyed_a_key_whose_latest_record_is_in_a_partition_with_nothing_to_settle_is_left(
        spark, make_topic, table_name, spark_matches):
    """`k` written to partition 0, then deleted by a tombstone in partition 1 that the consumer applied but has not
    committed: both paths read partition 1's unsettled records too, so `k`'s record in partition 0 is superseded,
    not lost."""
    from kafka import KafkaProducer

    topic = make_topic("moved", partitions=2)
    producer = KafkaProducer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, acks="all")
    producer.send(topic, b"k1", key=b"k", partition=0, timestamp_ms=1_700_000_000_000)
    producer.send(topic, None, key=b"k", partition=1, timestamp_ms=1_700_000_001_000)
    producer.flush(timeout=30)
    producer.close(timeout=5)
    execute(sql.SQL("CREATE TABLE {} (id text)").format(sql.Identifier(table_name)))
    group = f"g-{uuid.uuid4().hex[:6]}"
    admin.commit_offsets(group, topic, {0: 1, 1: 0})

    pg, ranges, _ = audit_both(spark_matches, group=group, topic=topic, sink_table=table_name, record_id="key",
                               row_id="id", keyed=True)

    assert (pg.checked, pg.lost, pg.duplicated) == (1, 0, 0)
    assert [(r[0], r[5]) for r in ranges] == [(0, 1)]   # partition 0's record: superseded


def test_a_partition_with_nothing_to_settle_is_not_read(spark, make_topic, table_name, spark_matches):
    topic = make_topic("half", partitions=2)
    produce(topic, [(None, str(v).encode()) for v in range(1, 11)], partitions=2)
    records = read_topic(topic)
    execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(table_name)))
    first = sorted(at for at in records if at[0] == 0)
    rows = [int(records[at][1]) for at in first[1:]]   # partition 0's first record lost; partition 1 unwritten
    execute(sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(sql.Identifier(table_name)), [[n] for n in rows])
    group = f"g-{uuid.uuid4().hex[:6]}"
    admin.commit_offsets(group, topic, {0: admin.watermarks(topic)[0].high, 1: 0})   # partition 1: all lag

    pg, ranges, _ = audit_both(spark_matches, group=group, topic=topic, sink_table=table_name, record_id="value",
                               row_id="id")

    assert pg.checked == len(first) and as_offsets(pg.lost_offsets) == {first[0]}
    assert [r[0] for r in ranges] == [0]


def test_a_table_in_another_schema_is_read_from_that_schema_on_both_paths(spark, make_topic, table_name,
                                                                          spark_matches):
    topic = make_topic("orders")
    produce(topic, [(None, str(n).encode()) for n in range(1, 11)])
    schema = f"sales_{uuid.uuid4().hex[:8]}"
    execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        for where, ids in (((schema, table_name), [n for n in range(1, 11) if n != 4] + [6]),
                           ((table_name,), list(range(1, 11)))):   # public's namesake holds every record once
            execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(*where)))
            execute(sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(sql.Identifier(*where)), [[n] for n in ids])
        group = f"g-{uuid.uuid4().hex[:6]}"
        commit_all(group, topic)
        pg, _, findings = audit_both(spark_matches, group=group, topic=topic, sink_table=f"{schema}.{table_name}",
                                     record_id="value", row_id="id")
        assert as_offsets(pg.lost_offsets) == {(0, 3)} and as_offsets(pg.duplicated_offsets) == {(0, 5)}
        assert [f[1:3] for f in findings] == [(3, "lost"), (5, "duplicated")]
    finally:
        execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
