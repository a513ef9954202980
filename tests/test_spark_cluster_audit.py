"""The topic check on a real standalone cluster: the executors read the sink table in key ranges (a
partitioned JDBC read, the GROUP BY split with it), and the report still agrees with plain SQL."""
import random

import pytest
from django.db import connection
from psycopg2 import sql

from consumers.engine.spark_session import get_spark
from consumers.kafka import admin as kafka_admin
from consumers.reconciliation import topic_check
from tests.spark_helpers import insert_order_ids, plain_sql_check, produce_values

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_the_table_is_read_on_executors_in_disjoint_key_ranges_that_cover_every_key(on_spark_cluster,
                                                                                    orders_table):
    with connection.cursor() as cur:
        cur.execute(sql.SQL("INSERT INTO {} (order_id) SELECT g FROM generate_series(1, 1000) g").format(
            sql.Identifier(orders_table)))
        cur.execute(sql.SQL("INSERT INTO {} (order_id) VALUES (1), (1000), (500), (NULL)").format(
            sql.Identifier(orders_table)))
    spark = get_spark()

    written = topic_check.extract_written(spark, orders_table, "order_id")

    assert written.rdd.getNumPartitions() == 2  # one range per executor core of the two workers
    per_task = written.rdd.mapPartitions(lambda rows: [sorted((r.key, r.written) for r in rows)]).collect()
    assert len(per_task) == 2 and all(per_task)
    first, second = per_task
    assert first[-1][0] < second[0][0]  # disjoint ranges
    assert first + second == [(k, 2 if k in (1, 500, 1000) else 1) for k in range(1, 1001)]


def test_the_topic_check_on_the_cluster_agrees_with_a_plain_sql_count(on_spark_cluster, kafka_bootstrap, make_topic,
                                                                orders_table):
    topic = make_topic("cluster-orders", partitions=3)
    log = produce_values(kafka_bootstrap, topic, 3000, partitions=3)
    committed = {0: 900, 1: 1000, 2: 700}
    kafka_admin.commit_offsets("cluster-orders-loader", topic, committed)
    consumed = [v for p, end in committed.items() for v in log[p][:end]]
    rng = random.Random(16)
    written = [v for v in consumed if rng.random() > 0.02]
    written += rng.sample(written, 30) + [7001, 7002, 7003]
    insert_order_ids(orders_table, written)

    report = topic_check.check_topic(topic, "cluster-orders-loader", orders_table, "order_id", "int_value")

    missing, duplicated, _ = plain_sql_check(orders_table, consumed)
    assert report["records_read"] == len(consumed) == 2600
    assert report["rows_read"] == len(written)
    assert report["missing_count"] == missing > 0
    assert report["duplicated"] == {str(k): n for k, n in duplicated.items()} and duplicated
    assert report["unexpected"] == [7001, 7002, 7003]
