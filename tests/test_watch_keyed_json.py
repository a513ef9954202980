"""Keyed watches whose row id is read from the record value (`json:PATH`): a tombstone has no value, so it names
the id of its key's latest readable record before it (docs/watch.md, "How it matches"). Checked on PostgreSQL and
on Spark, which must agree."""
import json
import uuid

import pytest
from django.db import connection
from psycopg2 import sql

from consumers.kafka import admin
from tests.test_watch_keyed_edges import T0, produce_at
from tests.test_watch_spark import audit_both, spark, spark_matches  # noqa: F401 (fixtures, used by name)

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def order(order_id: str, status: str = "new") -> bytes:
    return json.dumps({"order": {"id": order_id}, "status": status}).encode()


def create_table(table: str, ids) -> None:
    name = sql.Identifier(table)
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (id text PRIMARY KEY)").format(name).as_string(cur.cursor))
        for rid in ids:
            cur.execute(sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(name).as_string(cur.cursor), [rid])


@pytest.mark.usefixtures("spark")
def test_a_tombstone_deletes_the_row_of_its_keys_latest_readable_id(make_topic, table_name, spark_matches):  # noqa: F811
    """a: written then deleted (the consumer deleted row A); b: written; c: written then deleted, but row C stayed
    (the delete was lost); d: a tombstone of a key never written before: it names no row (unreadable)."""
    topic, group = make_topic("orders"), f"g-{uuid.uuid4().hex[:6]}"
    produce_at(topic, [(0, b"a", order("A"), T0), (0, b"b", order("B"), T0 + 1000), (0, b"c", order("C"), T0 + 2000),
                       (0, b"a", order("A", "paid"), T0 + 3000), (0, b"a", None, T0 + 4000),
                       (0, b"c", None, T0 + 5000), (0, b"d", None, T0 + 6000)])
    create_table(table_name, ["B", "C"])
    admin.commit_offsets(group, topic, {0: 7})

    pg, ranges, findings = audit_both(spark_matches, group=group, topic=topic, sink_table=table_name,
                                      record_id="json:order.id", row_id="id", keyed=True)

    assert pg.lost_offsets == [{"partition": 0, "offset": 5}], pg.lost_offsets   # c's tombstone: row C stayed
    assert (pg.checked, pg.lost, pg.duplicated) == (7, 1, 0)
    (_, _, _, records, ignored, superseded, unreadable, *_), = ranges
    assert (records, ignored, superseded, unreadable) == (7, 0, 3, 1)   # A twice and C superseded; d unreadable
    assert findings == [(0, 5, "lost", 0)]


@pytest.mark.usefixtures("spark")
def test_a_tombstone_stamped_before_the_record_it_follows_still_deletes_its_row(make_topic, table_name,
                                                                              spark_matches):  # noqa: F811
    """Skewed producer clocks: a's tombstone follows its record in the partition but carries an older timestamp. It
    deletes A's row (the consumer applies a partition in offset order); by timestamps alone it named no row and A
    was reported lost."""
    topic, group = make_topic("orders"), f"g-{uuid.uuid4().hex[:6]}"
    produce_at(topic, [(0, b"a", order("A"), T0 + 2000), (0, b"a", None, T0 + 1000), (0, b"b", order("B"), T0 + 3000)])
    create_table(table_name, ["B"])
    admin.commit_offsets(group, topic, {0: 3})

    pg, ranges, findings = audit_both(spark_matches, group=group, topic=topic, sink_table=table_name,
                                      record_id="json:order.id", row_id="id", keyed=True)

    assert (pg.checked, pg.lost, pg.duplicated, findings) == (3, 0, 0, []), pg.as_json()
    (_, _, _, records, ignored, superseded, unreadable, *_), = ranges
    assert (records, ignored, superseded, unreadable) == (3, 0, 1, 0)


def typed(order_id: str, kind: str) -> bytes:
    return json.dumps({"order": {"id": order_id}, "type": kind}).encode()


@pytest.mark.usefixtures("spark")
def test_an_ignored_record_neither_supersedes_nor_is_superseded(make_topic, table_name, spark_matches):  # noqa: F811
    """The consumer skips heartbeats. b: an order, then a heartbeat of the same id; row B is missing, so the order
    is lost (the heartbeat does not replace it). c: a heartbeat, then an order; row C is there. d: an order, a
    heartbeat naming another id, then a tombstone: the tombstone deletes D (the heartbeat names no row)."""
    topic, group = make_topic("orders"), f"g-{uuid.uuid4().hex[:6]}"
    produce_at(topic, [(0, b"b", typed("B", "order"), T0), (0, b"b", typed("B", "heartbeat"), T0 + 1000),
                       (0, b"c", typed("C", "heartbeat"), T0 + 2000), (0, b"c", typed("C", "order"), T0 + 3000),
                       (0, b"d", typed("D", "order"), T0 + 4000), (0, b"d", typed("X", "heartbeat"), T0 + 5000),
                       (0, b"d", None, T0 + 6000)])
    create_table(table_name, ["C"])
    admin.commit_offsets(group, topic, {0: 7})

    pg, ranges, findings = audit_both(spark_matches, group=group, topic=topic, sink_table=table_name,
                                      record_id="json:order.id", row_id="id", keyed=True,
                                      ignore=["json:type=heartbeat"])

    assert findings == [(0, 0, "lost", 0)]   # b's order only
    (_, _, _, records, ignored, superseded, unreadable, *_), = ranges
    assert (records, ignored, superseded, unreadable) == (7, 3, 1, 0)   # D's order superseded by its tombstone
    assert (pg.checked, pg.lost, pg.duplicated) == (7, 1, 0)
