"""Benchmark: the delivery audit of a watch on the PostgreSQL path. Not run by CI.

    /path/to/python bench/bench_watch.py [--records 1000000] [--partitions 2] [--lost 1000] [--lost-run] [--repeat 5]
                                         [--drop]

Uses its own database (default `tally_bench_watch`) and starts the embedded broker on a free port. Fills a
topic with the values 1..N (round-robin over the partitions), a team table `bench_watch_rows (id bigint)`
with one row per value (minus `--lost` values, scattered or with `--lost-run` one block of consecutive values, plus
as many duplicates), commits the group's offsets at the log end, and times:
  - the first check of a new watch: N newly committed records read from Kafka (read_committed), their ids
    COPYed into a temporary table and matched against the N-row table in one statement — with the time
    split into the Kafka read, the load and the match;
  - an idle check (nothing new committed since), `--repeat` times (median), with the process's shared admin
    client, then again with a new admin client and preflight each time (as before it was shared).
With `--spark`, the same data is then audited by a second watch forced onto Spark executors
(`spark_threshold=1`, consumers/reconciliation/watch_spark.py): the Spark session is started first (its
start-up timed apart), the two answers must be equal, and the Spark check's time is printed beside.
Targets (issue 33): 1,000,000 records < 10 s; idle < 50 ms; 10,000,000 on Spark local[2] < 3 min.
"""
import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench_database  # noqa: E402 - bench/ is on the path as the script's folder

TABLE = "bench_watch_rows"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--lost", type=int, default=1000, help="Values left out of the table (and as many doubled).")
    parser.add_argument("--lost-run", action="store_true",
                        help="The lost values are one block (a consumer that committed past records it never wrote).")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_watch")
    parser.add_argument("--drop", action="store_true", help="Drop the benchmark database at the end.")
    parser.add_argument("--spark", action="store_true", help="Also audit the same data on Spark and compare.")
    return parser.parse_args()


def produce(topic: str, records: int, partitions: int) -> None:
    from django.conf import settings
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, linger_ms=20,
                             batch_size=256 * 1024, acks=1)
    for i in range(records):
        producer.send(topic, str(i + 1).encode(), partition=i % partitions)
    producer.flush(timeout=300)
    producer.close()


def fill_table(records: int, lost: int, lost_run: bool = False) -> None:
    """ids 1..N without the first `lost` multiples of 997 (`lost_run`: without the `lost` ids after N/2), plus `lost`
    other ids twice."""
    from django.db import connection
    from psycopg2 import sql

    table = sql.Identifier(TABLE)
    with connection.cursor() as wrapper:
        cur = wrapper.cursor
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
        cur.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(table))
        if lost_run:
            cur.execute(sql.SQL("INSERT INTO {} SELECT g FROM generate_series(1, %s) g "
                                "WHERE g <= %s OR g > %s").format(table), [records, records // 2, records // 2 + lost])
        else:
            cur.execute(sql.SQL("INSERT INTO {} SELECT g FROM generate_series(1, %s) g "
                                "WHERE NOT (g %% 997 = 0 AND g <= 997 * %s)").format(table), [records, lost])
        cur.execute(sql.SQL("INSERT INTO {} SELECT g FROM generate_series(1, %s) g WHERE g %% 991 = 1 LIMIT %s"
                            ).format(table), [records, lost])
        cur.execute(sql.SQL("CREATE INDEX ON {} (id)").format(table))
        cur.execute(sql.SQL("ANALYZE {}").format(table))


def timed_check(watch, **kwargs):
    from consumers.kafka import ranges
    from consumers.reconciliation import watch_audit

    spent = {"kafka_read": 0.0}
    original = ranges.read_ranges

    def measured(*args, **kw):  # time the Kafka read inside the check (it calls back into the loader)
        started = time.perf_counter()
        inner = kw.get("on_records") or args[2]
        loading = [0.0]

        def on_records(partition, records):
            t = time.perf_counter()
            inner(partition, records)
            loading[0] += time.perf_counter() - t

        result = original(args[0], args[1], on_records)
        spent["kafka_read"] += time.perf_counter() - started - loading[0]
        spent["id_and_copy_buffer"] = loading[0]
        return result

    ranges.read_ranges = measured
    try:
        started = time.perf_counter()
        report = watch_audit.check_watch(watch, **kwargs)
        spent["total"] = time.perf_counter() - started
    finally:
        ranges.read_ranges = original
    return report, spent


def spark_check(pg_report, topic: str) -> None:
    """The same audit on Spark executors, by a second watch of the same group, topic and table."""
    from consumers.engine.spark_session import get_spark
    from consumers.operations import watch_setup
    from consumers.reconciliation import watch_audit

    started = time.perf_counter()
    spark = get_spark()
    print(f"Spark session ({spark.sparkContext.master}) started in {time.perf_counter() - started:.1f} s")
    watch, _ = watch_setup.create(watch_setup.WatchSpec(
        name="bench-spark", group="bench-group", topic=topic, sink_table=TABLE,
        record_id="value", row_id="id", settle_seconds=0))
    started = time.perf_counter()
    report = watch_audit.check_watch(watch, spark_threshold=1)
    took = time.perf_counter() - started
    assert not report.error, report.error
    same = (report.checked, report.lost, report.duplicated, report.lost_offsets, report.duplicated_offsets) == (
        pg_report.checked, pg_report.lost, pg_report.duplicated, pg_report.lost_offsets, pg_report.duplicated_offsets)
    assert same, "the Spark audit's answer differs from PostgreSQL's"
    print(f"first check on Spark: {report.checked} records, lost {report.lost}, duplicated {report.duplicated} "
          f"in {took:.2f} s (the same answer as PostgreSQL's path)")


def main():
    args = parse_args()
    load_at_start = os.getloadavg()   # other work shares the machine: say how busy it was
    from consumers.kafka import broker

    port = broker.free_port()
    process = broker.start_broker(port)
    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{port}"
    try:
        bench_database.setup_django(args.database_url, fresh=True)
        from consumers.kafka import admin
        from consumers.operations import watch_setup

        topic = "bench-watch"
        started = time.perf_counter()
        produce(topic, args.records, args.partitions)
        print(f"produced {args.records} records in {time.perf_counter() - started:.1f} s")
        fill_table(args.records, args.lost, args.lost_run)
        marks = admin.watermarks(topic)
        admin.commit_offsets("bench-group", topic, {p: m.high for p, m in marks.items()})
        watch, _ = watch_setup.create(watch_setup.WatchSpec(
            name="bench", group="bench-group", topic=topic, sink_table=TABLE, record_id="value", row_id="id",
            settle_seconds=0))
        report, spent = timed_check(watch, spark_threshold=0)   # PostgreSQL path, whatever the setting
        assert report.checked == args.records, report.checked
        match = spent["total"] - spent["kafka_read"] - spent["id_and_copy_buffer"]
        print(f"first check: {report.checked} records, lost {report.lost}, duplicated {report.duplicated} "
              f"in {spent['total']:.2f} s (Kafka read {spent['kafka_read']:.2f} s, ids + COPY buffer "
              f"{spent['id_and_copy_buffer']:.2f} s, COPY + match + store {match:.2f} s)")
        from django.db.models import Count, Sum

        from consumers.models import WatchFinding
        kept = WatchFinding.objects.filter(watch=watch).aggregate(rows=Count("pk"), findings=Sum("run_length"))
        print(f"findings kept: {kept['findings']} in {kept['rows']} rows (a row per run of consecutive offsets)")
        idle = []
        for _ in range(args.repeat):
            _, spent = timed_check(watch)
            idle.append(spent["total"] * 1000)
        print(f"idle check: median {statistics.median(idle):.1f} ms (min {min(idle):.1f}, max {max(idle):.1f}) "
              f"over {args.repeat}")
        from consumers.kafka import clusters

        fresh = []
        for _ in range(args.repeat):   # as before the shared admin client: a new one (and its bootstrap) per call
            clusters.close_shared_admins()
            clusters._passed.clear()
            _, spent = timed_check(watch)
            fresh.append(spent["total"] * 1000)
        print(f"idle check with a new admin client and preflight each time: median {statistics.median(fresh):.1f} ms "
              f"(min {min(fresh):.1f}, max {max(fresh):.1f}) over {args.repeat}")
        if args.spark:
            spark_check(report, topic)
        print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}")
        print("load average (1, 5, 15 min) at the start: {:.2f} {:.2f} {:.2f}; at the end: {:.2f} {:.2f} {:.2f}".format(
            *load_at_start, *os.getloadavg()))
    finally:
        from consumers.kafka import clusters

        clusters.close_shared_admins()   # before the broker goes: they would keep reconnecting to it
        broker.stop_broker(process)
        if args.drop:
            bench_database.drop_database(args.database_url)


if __name__ == "__main__":
    main()
