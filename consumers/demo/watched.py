"""The demo's consumer that Tally does not run: examples/plain_consumer.py, the blog post's loop that commits
before it writes, killed on the classic schedule, and the watch that finds what it lost.

`run_watched_consumer` (after the classic demo seeded topic `nums`) starts the watch afresh, runs the plain
consumer as its own process until the schedule's classic crash SIGKILLs it between its commit and its write,
starts it again until it has read everything, then checks the watch and compares with the table row by
row. Nothing of Tally's engine is involved: only a consumer group, a table and the watch.
"""
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from psycopg2 import sql

from consumers.demo.schedule import crash_schedule
from consumers.engine import db
from consumers.kafka import admin as kafka_admin
from consumers.models import DeliveryMode, Watch
from consumers.operations import watch_setup
from consumers.reconciliation import watch_audit

WATCH_NAME = "nums-plain-consumer"   # also its consumer group
TABLE = "demo_nums_plain_consumer"
TOPIC = "nums"
CONSUMER = Path(__file__).resolve().parents[2] / "examples" / "plain_consumer.py"
BATCH = 10                  # the example's max_poll_records, as the classic demo's
MAX_STARTS = 5
RUN_TIMEOUT_S = 120.0


def classic_crash_batch(seed: int, records: int) -> int:
    """The batch (from 1) whose commit the schedule's classic at-most-once crash follows."""
    crash = crash_schedule(seed, WATCH_NAME, DeliveryMode.AT_MOST_ONCE, ("after-kafka-commit",), 0.0, records,
                           BATCH, 1)[0]
    return crash.attempt + 1


def reset() -> None:
    """A fresh watch, group and table: the demo's topic was just created anew."""
    Watch.objects.filter(name=WATCH_NAME).delete()
    kafka_admin.delete_groups([WATCH_NAME])
    conn = db.connect("tally-demo")
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(TABLE)))
            cursor.execute(sql.SQL("CREATE TABLE {} (id bigint, kafka_partition integer, kafka_offset bigint)")
                           .format(sql.Identifier(TABLE)))
        conn.commit()
    finally:
        conn.close()


def run_watched_consumer(records: int, seed: int) -> dict:
    """Run the plain consumer with its classic crash and check its watch; the result for the demo page."""
    reset()
    crash_batch = classic_crash_batch(seed, records)
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": db.database_url(),
           "KAFKA_BOOTSTRAP_SERVERS": settings.KAFKA_BOOTSTRAP_SERVERS, "PYTHONUNBUFFERED": "1"}
    kills, code = 0, None
    for start in range(MAX_STARTS):
        args = [sys.executable, str(CONSUMER), "--topic", TOPIC, "--group", WATCH_NAME, "--table", TABLE,
                "--order", "commit-then-write"]
        if start == 0:
            args += ["--die-at-batch", str(crash_batch)]
        code = subprocess.run(args, env=env, capture_output=True, timeout=RUN_TIMEOUT_S).returncode
        if code != -9:
            break
        kills += 1
    if code != 0:
        return {"state": "failed", "error": f"the plain consumer exited with {code}"}
    watch, _ = watch_setup.create(watch_setup.WatchSpec(
        name=WATCH_NAME, group=WATCH_NAME, topic=TOPIC, sink_table=TABLE, record_id="value", row_id="id",
        settle_seconds=0), actor="demo")
    report = watch_audit.check_watch(watch, settle_seconds=0)
    present = _ids_in_table()
    wanted: dict[int, list[int]] = {}
    for lost in report.lost_offsets:
        wanted.setdefault(lost["partition"], []).append(lost["offset"])
    lost_values = sorted(int(value) for _, value, *_ in kafka_admin.read_records(TOPIC, wanted).values())
    return {"state": "done", "watch": WATCH_NAME, "crash_batch": crash_batch, "kills": kills,
            "lost": report.lost, "duplicated": report.duplicated, "checked": report.checked,
            "lost_values": lost_values, "lost_offsets": report.lost_offsets,
            "missing_in_table": sorted(set(range(1, records + 1)) - present)}


def _ids_in_table() -> set[int]:
    conn = db.connect("tally-demo")
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql.SQL("SELECT DISTINCT id FROM {}").format(sql.Identifier(TABLE)))
            return {row[0] for row in cursor.fetchall()}
    finally:
        conn.rollback()
        conn.close()
