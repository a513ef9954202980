"""Benchmark of reconciliation (consumers/reconciliation/reconcile.py) on a large sink. Not run by CI.

    .venv/bin/python bench/bench_reconcile.py [--rows 10000000] [--partitions 4] [--new-rows 1000000]

Uses its own database (default `tally_bench_recon`, created and migrated if missing; dropped with
--drop). Sink rows, ledger rows (one per 500-record batch, as the engine writes them) and positions are
generated in SQL, then:
  1. full re-verification of every row, exactly-once sink (unique provenance key): the cheap path;
  2. the same with one deleted row: the cheap check fails in one partition and findings are located there;
  3. incremental run over --new-rows new rows;
  4. a run with nothing new (median of 20), database part and, against an embedded broker, Kafka part;
  5. full re-verification of an at-least-once sink (plain index: distinct counts needed).
Kafka's facts come from a stand-in for 1-3 and 5 so that the numbers are the database's.
"""
import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from psycopg2 import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BATCH = 500          # the engine's default batch size: one ledger row per 500 records
TOPIC = "bench-recon"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--new-rows", type=int, default=1_000_000)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_recon")
    parser.add_argument("--drop", action="store_true", help="Drop the benchmark database at the end.")
    return parser.parse_args()


def setup_django(database_url: str):
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tally.settings")
    os.environ.setdefault("TALLY_DEVELOPMENT", "1")  # a checkout's bench is development, like manage.py
    import psycopg2

    url = urlparse(database_url)
    admin = psycopg2.connect(host=url.hostname, port=url.port or 5432, user=url.username or "postgres",
                             dbname="postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", [url.path.lstrip("/")])
        if not cur.fetchone():
            cur.execute(f'CREATE DATABASE "{url.path.lstrip("/")}"')  # bench-only, name from the command line
    admin.close()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


class StandInKafka:
    """Watermarks and committed offsets equal to the positions: a caught-up pipeline."""

    def __init__(self, positions):
        self.positions = positions

    def watermarks(self, topic):
        from consumers.kafka.admin import Watermarks

        return {p: Watermarks(0, n) for p, n in self.positions.items()}

    def committed_offsets(self, group_id, topic):
        return dict(self.positions)

    def record_timestamps(self, topic, offsets):
        return {p: None for p in offsets}


def timed(func, *args, **kwargs):
    start = time.perf_counter()
    result = func(*args, **kwargs)
    return result, (time.perf_counter() - start) * 1000


def named(cur, template: str, table: str) -> str:
    """`template` with {t} the sink table and {key}/{idx} its provenance indexes, quoted by psycopg2.sql."""
    return sql.SQL(template).format(t=sql.Identifier(table), key=sql.Identifier(f"{table}_provenance_key"),
                                    idx=sql.Identifier(f"{table}_provenance_idx")).as_string(cur.cursor)


def load(cur, table, partitions, start, end):
    """Rows [start, end) of every partition, and their ledger rows, as the commit protocol writes them."""
    for p in range(partitions):
        cur.execute(named(cur, "INSERT INTO {t} (id, source_topic, source_partition, source_offset) "
                                "SELECT o + 1, %s, %s, o FROM generate_series(%s::bigint, %s::bigint - 1) AS o",
                          table), [TOPIC, p, start, end])
        cur.execute("INSERT INTO consumers_batchledger (pipeline_id, partition, first_offset, end_offset, records, "
                    "rows_written, dead_letters, epoch, committed_at) SELECT %s, %s, f, LEAST(f + %s, %s), "
                    "LEAST(f + %s, %s) - f, LEAST(f + %s, %s) - f, 0, 1, now() "
                    "FROM generate_series(%s::bigint, %s::bigint - 1, %s) AS f",
                    [PIPELINE_ID, p, BATCH, end, BATCH, end, BATCH, end, start, end, BATCH])
    cur.execute("UPDATE consumers_partitionoffset SET next_offset = %s WHERE pipeline_id = %s", [end, PIPELINE_ID])


PIPELINE_ID = None


def produce(bootstrap, partitions, per_partition=100):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    for i in range(per_partition * partitions):
        producer.send(TOPIC, str(i).encode(), partition=i % partitions)
    producer.flush()
    producer.close()


def main():
    global PIPELINE_ID
    args = parse_args()
    setup_django(args.database_url)
    from django.db import connection

    from consumers.engine import sinks
    from consumers.engine.transforms import resolve
    from consumers.kafka import admin as kafka_admin
    from consumers.kafka import broker
    from consumers.models import DeliveryMode, Pipeline
    from consumers.reconciliation import reconcile

    per_partition = args.rows // args.partitions
    new_per_partition = args.new_rows // args.partitions
    Pipeline.objects.filter(name="bench-recon").delete()
    pipeline = Pipeline.objects.create(name="bench-recon", topic=TOPIC, sink_table="bench_recon_sink", epoch=1)
    PIPELINE_ID = pipeline.pk
    table = pipeline.sink_table
    print(f"loading {per_partition * args.partitions:,} rows in {args.partitions} partitions ...", flush=True)
    with connection.cursor() as cur:
        sinks.drop_sink_table(cur, table)
        sinks.ensure_sink_table(cur, table, resolve("int_value"), exactly_once=True)
        cur.execute(named(cur, "DROP INDEX {key}", table))  # load first, index after: much faster
        for p in range(args.partitions):
            cur.execute("INSERT INTO consumers_partitionoffset (pipeline_id, partition, next_offset, updated_at) "
                        "VALUES (%s, %s, 0, now())", [pipeline.pk, p])
        load(cur, table, args.partitions, 0, per_partition)
        cur.execute(named(cur, "CREATE UNIQUE INDEX {key} ON {t} (source_topic, source_partition, source_offset)",
                          table))
        cur.execute(named(cur, "VACUUM ANALYZE {t}", table))  # what autovacuum does after a bulk load
        cur.execute("ANALYZE consumers_batchledger")
    kafka = StandInKafka({p: per_partition for p in range(args.partitions)})
    results = {}

    report, ms = timed(reconcile.reconcile_pipeline, pipeline, full=True, kafka=kafka)
    assert report.exact and all(p.proven for p in report.partitions), report.as_json()
    results["full re-verification, exactly-once sink (cheap check proves every partition)"] = ms

    with connection.cursor() as cur:
        cur.execute(named(cur, "DELETE FROM {t} WHERE source_partition = 0 AND source_offset = %s", table),
                    [per_partition // 2])
    report, ms = timed(reconcile.reconcile_pipeline, pipeline, full=True, kafka=kafka)
    assert report.lost == 1, report.as_json()
    results["full re-verification with one lost row (findings located in one partition)"] = ms
    with connection.cursor() as cur:
        cur.execute(named(cur, "INSERT INTO {t} (id, source_topic, source_partition, source_offset) "
                                "VALUES (0, %s, 0, %s)", table), [TOPIC, per_partition // 2])
    reconcile.reconcile_pipeline(pipeline, full=True, kafka=kafka)

    with connection.cursor() as cur:
        load(cur, table, args.partitions, per_partition, per_partition + new_per_partition)
        cur.execute(named(cur, "VACUUM ANALYZE {t}", table))
    kafka.positions = {p: per_partition + new_per_partition for p in range(args.partitions)}
    report, ms = timed(reconcile.reconcile_pipeline, pipeline, kafka=kafka)
    assert report.exact and report.partitions[0].checked_from == per_partition, report.as_json()
    results[f"incremental, {new_per_partition * args.partitions:,} new rows"] = ms

    idle = [timed(reconcile.reconcile_pipeline, pipeline, kafka=kafka) for _ in range(20)]
    results["nothing new, whole run (stand-in Kafka), median of 20"] = statistics.median(ms for _, ms in idle)
    results["nothing new, database part, median of 20"] = statistics.median(r.db_ms for r, _ in idle)

    port = broker.free_port()
    process = broker.start_broker(port)
    try:
        from django.conf import settings
        from kafka.admin import KafkaAdminClient, NewTopic

        settings.KAFKA_BOOTSTRAP_SERVERS = f"127.0.0.1:{port}"
        admin = KafkaAdminClient(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS)
        admin.create_topics([NewTopic(TOPIC, args.partitions, 1)])
        admin.close()
        produce(settings.KAFKA_BOOTSTRAP_SERVERS, args.partitions)
        kafka_admin.watermarks(TOPIC)  # first metadata round trip
        real = [reconcile.reconcile_pipeline(pipeline) for _ in range(5)]
        results["nothing new, embedded broker: database part, median of 5"] = statistics.median(r.db_ms for r in real)
        results["nothing new, embedded broker: Kafka part, median of 5"] = statistics.median(r.kafka_ms for r in real)
        for name, call in (("committed_offsets", lambda: kafka_admin.committed_offsets(pipeline.group_id, TOPIC)),
                           ("watermarks", lambda: kafka_admin.watermarks(TOPIC))):
            results[f"  of which kafka_admin.{name}, median of 5"] = statistics.median(
                timed(call)[1] for _ in range(5))
    finally:
        broker.stop_broker(process)

    with connection.cursor() as cur:
        cur.execute(named(cur, "DROP INDEX {key}", table))
        cur.execute(named(cur, "CREATE INDEX {idx} ON {t} (source_topic, source_partition, source_offset)", table))
        cur.execute(named(cur, "VACUUM ANALYZE {t}", table))
    # The same rows read as an at-least-once pipeline's (an exactly-once sink without its unique key is an error).
    Pipeline.objects.filter(pk=pipeline.pk).update(delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    pipeline.refresh_from_db()
    kafka.positions = {p: per_partition + new_per_partition for p in range(args.partitions)}
    report, ms = timed(reconcile.reconcile_pipeline, pipeline, full=True, kafka=kafka)
    assert report.exact, report.as_json()
    total = (per_partition + new_per_partition) * args.partitions
    results[f"full re-verification, at-least-once sink (plain index), {total:,} rows"] = ms

    print_results(args, results)
    with connection.cursor() as cur:
        sinks.drop_sink_table(cur, table)
    pipeline.delete()
    if args.drop:
        connection.close()
        subprocess.run(["dropdb", "-h", "127.0.0.1", "-U", "postgres", urlparse(args.database_url).path.lstrip("/")],
                       check=False)


def print_results(args, results):
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SHOW server_version")
        pg = cur.fetchone()[0]
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"PostgreSQL {pg}; {args.rows:,} rows in {args.partitions} partitions, ledger batches of {BATCH}")
    print("| Measurement | Time |\n|---|---|")
    for name, ms in results.items():
        print(f"| {name} | {ms:,.1f} ms |")


if __name__ == "__main__":
    main()
