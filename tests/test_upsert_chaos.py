"""Upsert under SIGKILL: a keyed topic with updates and tombstones into a current-state table, the engine
killed at every fault point of the commit. The table then equals the last value per key as read from the
topic here, independently of the engine, and reconciliation reports nothing lost."""
import json
import random

import pytest
from django.conf import settings
from django.db import connection
from kafka import KafkaConsumer, TopicPartition
from psycopg2 import sql

from consumers.engine import db
from consumers.models import DesiredState, Pipeline
from consumers.operations import pipeline_setup
from consumers.operations.pipeline_setup import PipelineSpec
from consumers.reconciliation.reconcile import reconcile_pipeline
from tests.chaos import run_killed_at, run_until_clean_exit
from tests.conftest import drop_sink_tables
from tests.producing import send

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]

BATCH = ["--batch-size", "25"]
UNTIL_CAUGHT_UP = [*BATCH, "--stop-when-caught-up", "--max-seconds", "120"]
KEYS, RECORDS, PARTITIONS = 60, 900, 2


def produce_keyed(topic: str, seed: int) -> None:
    """RECORDS records over KEYS keys, each key in one partition (Kafka's key partitioner); about one in eight
    is a tombstone."""
    rng = random.Random(seed)
    messages = []
    for n in range(RECORDS):
        key = rng.randrange(KEYS)
        value = None if rng.random() < 0.125 else json.dumps({"status": rng.choice(["new", "paid", "sent"]),
                                                              "n": n}).encode()
        messages.append((None, str(key).encode(), value))
    send(topic, messages)


def last_value_per_key(topic: str) -> dict[int, tuple[str, int]]:
    """Read the whole topic with a plain consumer: the last value of each key, tombstoned keys left out."""
    consumer = KafkaConsumer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, enable_auto_commit=False,
                             isolation_level="read_committed", consumer_timeout_ms=3000)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    latest, seen = {}, 0
    for record in consumer:
        seen += 1
        latest[int(record.key)] = None if record.value is None else json.loads(record.value)
    consumer.close()
    assert seen == RECORDS
    return {key: (value["status"], value["n"]) for key, value in latest.items() if value is not None}


def table_state(table: str) -> dict[int, tuple[str, int]]:
    conn = db.connect("tally-tests")
    try:
        with conn.cursor() as cur:
            cur.execute(sql.SQL("SELECT order_id, status, n FROM {}").format(sql.Identifier(table)))
            return {key: (status, n) for key, status, n in cur.fetchall()}
    finally:
        conn.close()


@pytest.fixture
def upsert_pipeline(transactional_db, kafka_bootstrap, make_topic, subprocess_env):
    topic = make_topic("keyed", partitions=PARTITIONS)
    table = f"current_{topic}".replace("-", "_")
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (order_id bigint PRIMARY KEY, status text NOT NULL, n bigint NOT NULL, "
                            "source_topic text NOT NULL, source_partition integer NOT NULL, "
                            "source_offset bigint NOT NULL)").format(sql.Identifier(table)).as_string(cur.cursor))
    produce_keyed(topic, seed=29)
    pipeline = pipeline_setup.create(PipelineSpec(
        name=topic, topic=topic, sink_table=table, transform="json", map={"order_id": "@key"},
        upsert_key=["order_id"], delete_on_tombstone=True))
    Pipeline.objects.filter(pk=pipeline.pk).update(batch_size=25, desired_state=DesiredState.RUNNING)
    yield Pipeline.objects.get(pk=pipeline.pk)
    drop_sink_tables([table])


def test_an_upsert_pipeline_killed_at_every_fault_point_holds_the_last_value_of_each_key(
        upsert_pipeline, subprocess_env):
    pipeline = upsert_pipeline
    points = ["mid-write", "after-write", "after-db-commit", "after-poll", "mid-write@2", "after-write@3",
              "after-db-commit@4"]
    for point in points:
        run_killed_at(subprocess_env, pipeline.name, UNTIL_CAUGHT_UP, point if "@" in point else f"{point}:1")
    assert run_until_clean_exit(subprocess_env, pipeline.name, UNTIL_CAUGHT_UP, max_runs=1) == 0
    expected = last_value_per_key(pipeline.topic)
    assert table_state(pipeline.sink_table) == expected
    report = reconcile_pipeline(pipeline)
    assert report.lost == 0 and report.duplicated == 0 and report.phantom == 0 and report.exact, report.as_json()
    kinds = {}
    for part in report.partitions:
        for finding in part.findings:
            kinds[finding.kind] = kinds.get(finding.kind, 0) + finding.count
    # Every record is accounted for: the current row of its key, superseded by a later one, or a deletion.
    assert kinds.get("superseded", 0) + kinds.get("deleted", 0) + len(expected) == RECORDS, kinds
