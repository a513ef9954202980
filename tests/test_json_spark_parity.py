"""Both engines apply the same JSON mapping (and upsert) to the same topic and give the same table: the Spark
engine compiles the driver's plan on its executors and commits through the same protocol."""
import json
import random

import pytest
from django.conf import settings
from django.db import connection
from kafka import KafkaProducer
from psycopg2 import sql

from consumers.engine import db
from consumers.engine import python as python_engine
from consumers.engine import spark as spark_engine
from consumers.engine.spark_session import get_spark
from consumers.models import DeadLetter, Engine, Pipeline
from tests.conftest import drop_sink_tables, leftover_connections
from tests.producing import send

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

COLUMNS = ("order_id", "customer", "amount", "ordered_at", "tags", "active")
DDL = ("CREATE TABLE {} (order_id bigint NOT NULL {}, customer text, amount numeric(10,2), ordered_at timestamptz, "
       "tags jsonb, active boolean, source_topic text NOT NULL, source_partition integer NOT NULL, "
       "source_offset bigint NOT NULL, UNIQUE (source_topic, source_partition, source_offset))")
MAPPING = {"order_id": "@key", "customer": "customer.name", "tags": "meta.tags"}


def produce(topic: str) -> None:
    rng = random.Random(4)
    producer = KafkaProducer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, acks="all", linger_ms=5)
    for n in range(400):
        key = rng.randrange(40)
        roll = rng.random()
        if roll < 0.1:
            value = None                                  # a tombstone
        elif roll < 0.15:
            value = b"{broken"                            # not JSON
        elif roll < 0.2:
            value = json.dumps({"amount": "lots"}).encode()  # a numeric that is not a number
        else:
            value = json.dumps({"customer": {"name": f"c{n}"}, "amount": round(rng.uniform(0, 999), 3),
                                "ordered_at": 1_714_559_400_000 + n * 1000, "meta": {"tags": ["a", n]},
                                "active": rng.random() < 0.5}).encode()
        producer.send(topic, value, key=str(key).encode())
    producer.flush(timeout=30)
    producer.close(timeout=5)


def table_text(table: str) -> set[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT {}, source_partition, source_offset FROM {}").format(
            sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in COLUMNS),
            sql.Identifier(table)))
        return set(cur.fetchall())


@pytest.mark.parametrize("upsert", [False, True], ids=["append", "upsert"])
def test_spark_writes_the_same_table_as_the_python_engine(transactional_db, kafka_bootstrap, make_topic, upsert):
    get_spark()
    topic = make_topic("json-parity", partitions=2)
    produce(topic)
    tables = {}
    for engine in (Engine.PYTHON, Engine.SPARK):
        table = f"parity_{engine}_{topic}".replace("-", "_")
        with connection.cursor() as cur:
            cur.execute(sql.SQL(DDL.format("{}", "UNIQUE" if upsert else "")).format(sql.Identifier(table)))
        Pipeline.objects.create(name=f"{engine}-{topic}", topic=topic, sink_table=table, transform="json",
                                json_map=MAPPING, engine=engine, upsert_key=["order_id"] if upsert else [],
                                delete_on_tombstone=upsert, group_id=f"{engine}-{topic}")
        tables[engine] = table
    try:
        python = python_engine.run_pipeline(f"python-{topic}", stop_when_caught_up=True, max_seconds=60)
        spark = spark_engine.run_pipeline(f"spark-{topic}", batch_size=150, stop_when_caught_up=True,
                                          max_seconds=180)
        assert (python.reason, spark.reason) == ("caught_up", "caught_up"), (python.detail, spark.detail)
        written = table_text(tables[Engine.PYTHON])
        assert written == table_text(tables[Engine.SPARK])
        # Upsert keeps one row per key (tombstoned keys have none); append has a row per good record.
        assert 0 < len(written) <= 40 if upsert else len(written) > 250
        letters = {engine: set(DeadLetter.objects.filter(pipeline__engine=engine).values_list(
            "partition", "offset", "error")) for engine in (Engine.PYTHON, Engine.SPARK)}
        assert letters[Engine.PYTHON] == letters[Engine.SPARK] and len(letters[Engine.PYTHON]) >= 20
        expected = 0 if upsert else 1  # append: a tombstone is not JSON; upsert deletes with it
        assert any("tombstone" in e for _, _, e in letters[Engine.PYTHON]) == bool(expected)
    finally:
        drop_sink_tables(list(tables.values()))


# Today's mapping rules on both engines: a JSON array into text[], a date from a timestamp with an offset, a domain
# over a domain (5.0 into an integer domain), a domain's DEFAULT, epoch seconds (`seen::seconds`, a unit the plan
# carries to the executors; also written as text, and text that is no number), and an upsert key of a
# nondeterministic collation whose spellings are one key within a batch and across batches, and whose tombstone
# deletes the other spelling.
TYPES_DDL = ("CREATE TABLE {table} (name text COLLATE tally_ci NOT NULL UNIQUE, tags text[], day date, qty {qty}, "
             "region {region}, seen timestamptz, source_topic text NOT NULL, source_partition integer NOT NULL, "
             "source_offset bigint NOT NULL)")
TYPES_RECORDS = [
    (b"Ann", {"tags": ["a", "b,c"], "day": "2024-02-01", "qty": 2, "seen": 1_706_745_600}),
    (b"bob", {"tags": [1, None], "day": "2024-01-01T23:30:00-05:00", "qty": 5.0, "seen": 1_704_153_600.5}),
    (b"ANN", {"tags": ["a", "b,c"], "day": 1_709_251_200_000, "qty": "9", "seen": 1_709_251_200}),
    (b"Dee", {"tags": ["d"], "day": "2024-04-01", "qty": 1}),
    (b"DEE", None),                                     # a tombstone: deletes Dee's row
    (b"eve", {"tags": ["e"], "day": "2024-05-01", "qty": 0}),      # the domain's CHECK refuses it
    (b"ann", {"tags": ["x"], "day": "2024-06-01", "qty": 5.5}),    # not an integer: Ann's row stays
    (b"fay", {"tags": ["f"], "day": "2024-07-01", "qty": 3, "seen": "1719792000"}),  # epoch seconds as text
    (b"gus", {"tags": ["g"], "day": "2024-08-01", "qty": 4, "seen": "12abc"}),       # no number: a dead letter
]


def test_spark_maps_arrays_dates_domains_and_collated_upsert_keys_as_the_python_engine(transactional_db, make_topic):
    get_spark()
    topic = make_topic("json-types")
    send(topic, [(0, key, None if value is None else json.dumps(value).encode()) for key, value in TYPES_RECORDS])
    suffix = topic.rsplit("-", 1)[1]
    inner, qty, region = (f"tally_{name}_{suffix}" for name in ("int", "qty", "region"))
    with connection.cursor() as cur:
        cur.execute("CREATE COLLATION IF NOT EXISTS tally_ci (provider = icu, locale = 'und-u-ks-level2', "
                    "deterministic = false)")
        cur.execute(sql.SQL("CREATE DOMAIN {} AS integer NOT NULL").format(sql.Identifier(inner)))
        cur.execute(sql.SQL("CREATE DOMAIN {} AS {} CHECK (VALUE > 0)").format(sql.Identifier(qty),
                                                                                sql.Identifier(inner)))
        cur.execute(sql.SQL("CREATE DOMAIN {} AS text NOT NULL DEFAULT 'eu'").format(sql.Identifier(region)))
    tables = {}
    try:
        for engine in (Engine.PYTHON, Engine.SPARK):
            table = tables[engine] = f"types_{engine}_{suffix}"
            with connection.cursor() as cur:
                cur.execute(sql.SQL(TYPES_DDL).format(table=sql.Identifier(table), qty=sql.Identifier(qty),
                                                      region=sql.Identifier(region)))
            Pipeline.objects.create(name=f"{engine}-{topic}", topic=topic, sink_table=table, transform="json",
                                    json_map={"name": "@key", "seen": "seen::seconds"}, engine=engine,
                                    upsert_key=["name"],
                                    delete_on_tombstone=True, group_id=f"{engine}-{topic}")
        # Two records a batch: 'Ann' and 'ANN' fall into different batches.
        python = python_engine.run_pipeline(f"python-{topic}", batch_size=2, stop_when_caught_up=True, max_seconds=60)
        spark = spark_engine.run_pipeline(f"spark-{topic}", batch_size=2, stop_when_caught_up=True, max_seconds=180)
        assert (python.reason, spark.reason) == ("caught_up", "caught_up"), (python.detail, spark.detail)
        rows = {}
        for engine, table in tables.items():
            with connection.cursor() as cur:
                cur.execute(sql.SQL("SELECT name, tags::text, day::text, qty, region, seen::text, source_offset "
                                    "FROM {} ORDER BY source_offset").format(sql.Identifier(table)))
                rows[engine] = cur.fetchall()
        assert rows[Engine.PYTHON] == [("bob", "{1,NULL}", "2024-01-01", 5, "eu", "2024-01-02 00:00:00.5+00", 1),
                                       ("ANN", '{a,"b,c"}', "2024-03-01", 9, "eu", "2024-03-01 00:00:00+00", 2),
                                       ("fay", "{f}", "2024-07-01", 3, "eu", "2024-07-01 00:00:00+00", 7)]
        assert rows[Engine.SPARK] == rows[Engine.PYTHON]
        letters = {engine: sorted(DeadLetter.objects.filter(pipeline__engine=engine).values_list("offset", "error"))
                   for engine in tables}
        assert [offset for offset, _ in letters[Engine.PYTHON]] == [5, 6, 8]
        assert letters[Engine.PYTHON][2][1].endswith("column seen (from seen::seconds): not an ISO-8601 timestamp, "
                                                     "nor epoch seconds written as digits: '12abc'")
        assert letters[Engine.SPARK] == letters[Engine.PYTHON]
    finally:
        drop_sink_tables(list(tables.values()))
        db.close_pool()   # its sessions' upsert staging tables use the domains too, until their servers exit
        leftover_connections(keep=lambda row: row[0].startswith("tally-engine"))
        with connection.cursor() as cur:
            for domain in (qty, inner, region):
                cur.execute(sql.SQL("DROP DOMAIN IF EXISTS {}").format(sql.Identifier(domain)))
