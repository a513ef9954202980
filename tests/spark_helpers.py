"""Helpers shared by the Spark engine tests: make Spark pipelines, produce the classic values, read a sink row
by row; fill a table of order ids and ask plain SQL what the topic check reports of it."""
import contextlib

from django.db import connection
from psycopg2 import sql

from consumers.models import DeliveryMode, Engine, Pipeline
from tests.conftest import drop_sink_tables
from tests.producing import send
from tests.sink_rows import provenance_rows as sink_rows  # noqa: F401 - re-exported for the Spark tests


@contextlib.contextmanager
def spark_pipelines():
    """Yields make(name, topic, mode): a Spark pipeline row at epoch 1 whose sink table is spark_<name>; the sink
    tables of the pipelines made are dropped at the end."""
    made = []

    def make(name, topic, mode=DeliveryMode.EXACTLY_ONCE):
        pipeline = Pipeline.objects.create(name=name, topic=topic, sink_table=f"spark_{name}".replace("-", "_"),
                                           delivery_mode=mode, engine=Engine.SPARK, epoch=1)
        made.append(pipeline.sink_table)
        return pipeline

    try:
        yield make
    finally:
        drop_sink_tables(made)


def produce_values(bootstrap, topic, count, partitions, first=1) -> dict[int, list[int]]:
    """Values first..first+count-1, value v to partition v % partitions; returns each partition's values in
    offset order (so log[p][offset] is the value at that offset)."""
    log = {p: [] for p in range(partitions)}
    for value in range(first, first + count):
        log[value % partitions].append(value)
    send(topic, [(p, None, str(v).encode()) for p, values in log.items() for v in values], bootstrap=bootstrap)
    return log


def expected_rows(log) -> list[tuple[int, int, int]]:
    return [(p, offset, value) for p in sorted(log) for offset, value in enumerate(log[p])]


def insert_order_ids(table: str, order_ids: list[int]) -> None:
    with connection.cursor() as cur:
        cur.execute(sql.SQL("INSERT INTO {} (order_id) SELECT unnest(%s::bigint[])").format(sql.Identifier(table)),
                    [order_ids])


def plain_sql_check(table: str, consumed: list[int]) -> tuple[int, dict[int, int], int]:
    """What plain SQL says of the table's order ids against the `consumed` ones, to set beside the topic check's
    report: (how many consumed are missing, {duplicated id: rows}, how many distinct ids were never consumed)."""
    with connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT count(*) FROM unnest(%s::bigint[]) AS c(k) "
                            "WHERE NOT EXISTS (SELECT 1 FROM {} WHERE order_id = c.k)").format(sql.Identifier(table)),
                    [consumed])
        (missing,), = cur.fetchall()
        cur.execute(sql.SQL("SELECT order_id, count(*) FROM {} GROUP BY order_id HAVING count(*) > 1").format(
            sql.Identifier(table)))
        duplicated = dict(cur.fetchall())
        cur.execute(sql.SQL("SELECT count(DISTINCT order_id) FROM {} WHERE NOT order_id = ANY(%s)").format(
            sql.Identifier(table)), [consumed])
        (unexpected,), = cur.fetchall()
    return missing, duplicated, unexpected
