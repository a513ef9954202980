"""Helpers for watch tests: the plain kafka-python consumer of examples/ as a process, the topic as a
read_committed consumer reads it, and a team table read row by row."""
import collections
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from psycopg2 import sql

from consumers.engine import db
from tests.producing import send
from tests.transactional_log import read_committed
from tests.waiting import patience

ROOT = Path(__file__).resolve().parent.parent   # (not from conftest: conftest imports this module's fixture)
CONSUMER = ROOT / "examples" / "plain_consumer.py"


def run_plain_consumer(env: dict, topic: str, group: str, table: str, order: str, *, die_at_batch: int = 0,
                       keyed: bool = False, timeout: float = 60) -> int:
    """Run the plain consumer to its end: SIGKILLed by itself (-9) at `die_at_batch`, else 0 once idle."""
    args = [sys.executable, str(CONSUMER), "--topic", topic, "--group", group, "--table", table, "--order", order]
    if die_at_batch:
        args += ["--die-at-batch", str(die_at_batch)]
    if keyed:
        args.append("--keyed")
    done = subprocess.run(args, env=env, capture_output=True, timeout=patience(timeout), cwd=ROOT)
    assert done.returncode in (0, -9), done.stderr.decode()[-2000:]
    return done.returncode


def produce(topic: str, records, partitions: int = 1) -> None:
    """records: (key, value) pairs, round-robin over the partitions unless keyed (then by key's hash)."""
    send(topic, [(None if key is not None else i % partitions, key, value) for i, (key, value) in enumerate(records)])


def read_topic(topic: str, timeout_s: float = 20.0) -> dict[tuple[int, int], tuple]:
    """{(partition, offset): (key, value, timestamp)} of every record a read_committed consumer reads."""
    return read_committed(topic, patience(timeout_s))


def table_rows(query: sql.Composable, params=()) -> list[tuple]:
    """Rows of a query through a fresh connection: what the team's table holds, committed."""
    conn = db.connect("tally-tests")
    try:
        with conn.cursor() as cursor:
            cursor.execute(query, params)
            rows = cursor.fetchall()
        conn.rollback()
    finally:
        conn.close()
    return rows


def id_counts(table: str) -> collections.Counter:
    return collections.Counter(dict(table_rows(sql.SQL("SELECT id, count(*) FROM {} GROUP BY id").format(
        sql.Identifier(table)))))


def drop_tables(*tables: str) -> None:
    conn = db.connect("tally-tests")
    try:
        with conn.cursor() as cursor:
            for table in tables:
                cursor.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        conn.commit()
    finally:
        conn.close()


def as_offsets(listed: list[dict]) -> set[tuple[int, int]]:
    return {(o["partition"], o["offset"]) for o in listed}


def stored_findings(watch, *fields: str) -> list[tuple]:
    """The watch's WatchFinding rows a row per offset, each as (partition, offset, *fields), sorted: the rows
    hold runs of consecutive offsets."""
    from consumers.models import WatchFinding
    runs = WatchFinding.objects.filter(watch=watch).values_list("partition", "offset", "run_length", *fields)
    return sorted((partition, offset, *rest) for partition, first, length, *rest in runs
                  for offset in range(first, first + length))


def json_value(**fields) -> bytes:
    return json.dumps(fields).encode()


@pytest.fixture
def table_name():
    """A name for the team's table of a test; the table (if the test made it) is dropped afterwards."""
    name = f"team_{uuid.uuid4().hex[:8]}"
    yield name
    drop_tables(name)
