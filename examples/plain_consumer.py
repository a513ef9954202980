"""A plain kafka-python consumer that writes to PostgreSQL — the kind of consumer teams already run.

It is not Tally's: no ledger, no positions in the database, only a consumer group and a table. Tally
watches it from outside (`manage.py watch create ...`) and reports what it lost or duplicated.

    python examples/plain_consumer.py --topic nums --group nums-readers --table nums_rows \
        --order commit-then-write [--die-at-batch 3] [--keyed]

--order commit-then-write   commits the offsets, then writes the batch: a crash in between loses the batch
                            (at-most-once, the classic blog post's consumer);
--order write-then-commit   writes, then commits: a crash in between writes the batch again after the
                            restart (at-least-once: duplicates).
--keyed                     records are updates of an entity (key = its id, value JSON or null): the batch is
                            upserted into `id` (a tombstone deletes the row).
--die-at-batch N            SIGKILL itself between the two steps of its N-th batch (counted from 1), the way
                            the classic example kills its consumer.

Environment: KAFKA_BOOTSTRAP_SERVERS (default 127.0.0.1:9092), DATABASE_URL (postgres://...).
Rows: plain mode `id bigint, kafka_partition int, kafka_offset bigint` (one row per record, id = the value);
keyed mode `id text PRIMARY KEY, body text` (one row per key).
"""
import argparse
import json
import os
import signal
import sys
import time

import psycopg2
from kafka import KafkaConsumer
from psycopg2 import sql
from psycopg2.extras import execute_values

BATCH = 10   # the classic example's max_poll_records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--order", choices=["commit-then-write", "write-then-commit"], required=True)
    parser.add_argument("--keyed", action="store_true")
    parser.add_argument("--die-at-batch", type=int, default=0)
    parser.add_argument("--stop-when-idle", type=float, default=3.0,
                        help="Exit after this many seconds without a record once it holds partitions (0: never).")
    args = parser.parse_args(argv)

    db = psycopg2.connect(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    db.autocommit = True
    create_table(db, args.table, args.keyed)
    consumer = KafkaConsumer(
        args.topic, group_id=args.group, bootstrap_servers=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=BATCH,
        isolation_level="read_committed", session_timeout_ms=6000,
        # Static membership: a restarted process takes its partitions back at once instead of waiting for
        # the killed member's session to time out.
        group_instance_id=f"{args.group}-1")
    batches, idle_since = 0, None
    try:
        while True:
            polled = consumer.poll(timeout_ms=500)
            records = [r for batch in polled.values() for r in batch]
            if not records:
                if not consumer.assignment():
                    continue  # still joining the group
                idle_since = idle_since or time.monotonic()
                if args.stop_when_idle and time.monotonic() - idle_since > args.stop_when_idle:
                    return 0
                continue
            idle_since = None
            batches += 1
            if args.order == "commit-then-write":
                consumer.commit()
                die_if(batches == args.die_at_batch)
                write(db, args.table, records, args.keyed)
            else:
                write(db, args.table, records, args.keyed)
                die_if(batches == args.die_at_batch)
                consumer.commit()
    finally:
        consumer.close(autocommit=False)
        db.close()


def die_if(now: bool) -> None:
    if now:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def create_table(db, table: str, keyed: bool) -> None:
    body = "id text PRIMARY KEY, body text" if keyed else "id bigint, kafka_partition integer, kafka_offset bigint"
    with db.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (" + body + ")").format(sql.Identifier(table)))


def write(db, table: str, records, keyed: bool) -> None:
    with db.cursor() as cur:
        if not keyed:
            execute_values(cur, sql.SQL("INSERT INTO {} (id, kafka_partition, kafka_offset) VALUES %s").format(
                sql.Identifier(table)).as_string(cur), [(int(r.value), r.partition, r.offset) for r in records])
            return
        for r in records:  # in order: a later update of the same key wins
            key = r.key.decode()
            if r.value is None:
                cur.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(sql.Identifier(table)), [key])
            else:
                cur.execute(sql.SQL("INSERT INTO {} (id, body) VALUES (%s, %s) ON CONFLICT (id) DO UPDATE "
                                    "SET body = EXCLUDED.body").format(sql.Identifier(table)),
                            [key, json.dumps(json.loads(r.value))])


if __name__ == "__main__":
    sys.exit(main())
