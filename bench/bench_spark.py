"""Spark benchmarks, all in one run (one process, one SparkSession, one embedded broker):

  engines    the Spark engine vs the Python engine (exactly-once, int_value) on the same N records:
             steady throughput = records after the first batch / (last batch commit - first batch commit),
             total = all records / (run start -> last commit); and Spark's fixed costs: SparkSession start,
             first (cold) and later (warm) query start -> first batch committed
  triggers   the Spark engine at several micro-batch sizes (the fixed cost per micro-batch)
  topic check  the topic check of M records (default 10,000,000) against a table of about M rows, on SPARK_MASTER
             (default here local[2]); checks the counts it finds against what was planted

Usage (from the project root; uses database tally_bench_spark):
  .venv/bin/python bench/bench_spark.py [--records 200000] [--check-records 10000000] [--skip-topic-check]
                                        [--skip-engines] [--triggers 5000,20000]
"""
import argparse
import multiprocessing
import os
import platform
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tally.settings")
os.environ.setdefault("TALLY_DEVELOPMENT", "1")  # a checkout's bench is development, like manage.py
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tally_bench_spark")
os.environ.setdefault("SPARK_MASTER", "local[2]")
os.environ.setdefault("SPARK_DRIVER_MEMORY", "2g")
os.environ.setdefault("KAFKA_SESSION_TIMEOUT_MS", "6000")

PYTHON_BATCH = 5000     # the Python engine's poll size in bench/bench_engine.py
LOST_EVERY = 100_003    # topic check: every key divisible by this is never written ...
DUPLICATED_EVERY = 250_007  # ... and every key divisible by this is written twice


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--check-records", type=int, default=10_000_000)
    parser.add_argument("--check-partitions", type=int, default=4)
    parser.add_argument("--triggers", default="5000,20000", help="extra Spark micro-batch sizes to measure")
    parser.add_argument("--skip-topic-check", action="store_true")
    parser.add_argument("--skip-engines", action="store_true")
    args = parser.parse_args()

    import django
    from django.core.management import call_command

    from consumers.kafka import broker

    port = broker.free_port()
    process = broker.start_broker(port)
    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{port}"
    try:
        django.setup()
        call_command("ensure_database", verbosity=0)
        call_command("migrate", verbosity=0, interactive=False)
        print(machine(), flush=True)
        if not args.skip_engines:
            engines(args)
        if not args.skip_topic_check:
            topic_check(args)
    finally:
        broker.stop_broker(process)


def machine() -> str:
    import pyspark
    from django.conf import settings

    java = os.popen("java -version 2>&1 | head -1").read().strip()
    load = os.getloadavg()
    return (f"machine: {platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"PySpark {pyspark.__version__}, {java}, SPARK_MASTER={settings.SPARK_MASTER}, "
            f"driver memory {settings.SPARK_DRIVER_MEMORY}, load average {load[0]:.1f}")


# --- producing -------------------------------------------------------------------------------------------
def _produce_partitions(bootstrap, topic, partitions, total, count):
    """One producer process: values v (1..total) with (v - 1) % count in `partitions`."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=100, batch_size=1 << 20,
                             max_request_size=16 << 20, acks=1)
    for partition in partitions:
        for value in range(partition + 1, total + 1, count):
            producer.send(topic, str(value).encode(), partition=partition)
    producer.flush()
    producer.close()


def produce(topic, total, count, processes=2) -> float:
    """Values 1..total round-robin over `count` partitions, with one producer process per core (kafka-python's
    send() is CPU-bound at about 70k records/s per process). Returns seconds."""
    from django.conf import settings
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS)
    admin.create_topics([NewTopic(topic, count, 1)])
    admin.close()
    started = time.monotonic()
    groups = [list(range(count))[i::processes] for i in range(processes)]
    workers = [multiprocessing.get_context("spawn").Process(
        target=_produce_partitions, args=(settings.KAFKA_BOOTSTRAP_SERVERS, topic, group, total, count))
        for group in groups if group]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
        assert worker.exitcode == 0, f"a producer process failed ({worker.exitcode})"
    return time.monotonic() - started


# --- engines ---------------------------------------------------------------------------------------------
def make_pipeline(name, topic, engine):
    from django.db import connection

    from consumers.engine import sinks
    from consumers.engine.transforms import resolve
    from consumers.models import Pipeline

    pipeline = Pipeline.objects.create(name=name, topic=topic, sink_table=name.replace("-", "_"), engine=engine,
                                       epoch=1)
    with connection.cursor() as cur:
        sinks.ensure_sink_table(cur, pipeline.sink_table, resolve("int_value"), True)
    return pipeline


def drop_pipeline(pipeline):
    from django.db import connection

    from consumers.engine import sinks

    with connection.cursor() as cur:
        sinks.drop_sink_table(cur, pipeline.sink_table)
    pipeline.delete()


def timed_run(pipeline, run, **kwargs) -> dict:
    from django.db.models import Max, Min

    from consumers.models import BatchLedger

    started = time.time()
    result = run(pipeline.name, stop_when_caught_up=True, **kwargs)
    assert result.reason == "caught_up", result
    ledger = BatchLedger.objects.filter(pipeline=pipeline)
    span = ledger.aggregate(first=Min("committed_at"), last=Max("committed_at"))
    first = ledger.order_by("committed_at").first()
    first_at, last_at = span["first"].timestamp(), span["last"].timestamp()
    steady = (result.records - first.records) / max(last_at - first_at, 1e-9)
    return {"records": result.records, "batches": result.batches, "startup": first_at - started,
            "steady": steady, "total": result.records / (last_at - started), "seconds": last_at - started}


def engines(args) -> None:
    from consumers.engine import spark as spark_engine
    from consumers.engine.python import run_pipeline as python_run
    from consumers.engine.spark_session import get_spark

    tag = uuid.uuid4().hex[:6]
    topic = f"bench-spark-{tag}"
    seconds = produce(topic, args.records, args.partitions)
    print(f"produced {args.records:,} records to {args.partitions} partitions in {seconds:.1f} s", flush=True)

    started = time.monotonic()
    get_spark()
    print(f"SparkSession start: {time.monotonic() - started:.1f} s", flush=True)
    small = f"bench-spark-small-{tag}"
    produce(small, 1000, args.partitions, processes=1)
    for label in ("cold", "warm"):
        pipeline = make_pipeline(f"bench-spark-{label}-{tag}", small, "spark")
        run = timed_run(pipeline, spark_engine.run_pipeline)
        print(f"Spark query start -> first batch committed ({label}): {run['startup']:.2f} s", flush=True)
        drop_pipeline(pipeline)

    python = make_pipeline(f"bench-python-{tag}", topic, "python")
    py = timed_run(python, python_run, batch_size=PYTHON_BATCH)
    drop_pipeline(python)
    spark = make_pipeline(f"bench-spark-{tag}", topic, "spark")
    sp = timed_run(spark, spark_engine.run_pipeline)
    drop_pipeline(spark)
    print(f"python engine (batch {PYTHON_BATCH}): steady {py['steady']:,.0f} rec/s, total {py['total']:,.0f} rec/s "
          f"({py['batches']} batches, start-up {py['startup']:.2f} s)", flush=True)
    print(f"spark engine (trigger {spark_engine.MIN_RECORDS_PER_TRIGGER}): steady {sp['steady']:,.0f} rec/s, "
          f"total {sp['total']:,.0f} rec/s ({sp['batches']} batches, start-up {sp['startup']:.2f} s)", flush=True)
    print(f"ratio spark/python: steady {sp['steady'] / py['steady']:.2f}x, total {sp['total'] / py['total']:.2f}x",
          flush=True)
    for size in [int(s) for s in args.triggers.split(",") if s]:
        pipeline = make_pipeline(f"bench-spark-t{size}-{tag}", topic, "spark")
        run = timed_run(pipeline, spark_engine.run_pipeline, batch_size=size)
        drop_pipeline(pipeline)
        per_batch = run["seconds"] / run["batches"]
        print(f"spark engine, trigger {size}: steady {run['steady']:,.0f} rec/s, total {run['total']:,.0f} rec/s, "
              f"{run['batches']} batches, {per_batch:.2f} s per batch", flush=True)


# --- topic check -----------------------------------------------------------------------------------------------
def topic_check(args) -> None:
    from django.db import connection

    from consumers.engine.spark_session import get_spark
    from consumers.kafka import admin as kafka_admin
    from consumers.reconciliation import topic_check as spark_topic_check

    total = args.check_records
    topic = f"bench-topic-check-{uuid.uuid4().hex[:6]}"
    seconds = produce(topic, total, args.check_partitions)
    print(f"produced {total:,} records to {args.check_partitions} partitions in {seconds:.1f} s "
          f"({total / seconds:,.0f} records/s)", flush=True)
    highs = kafka_admin.high_watermarks(topic)
    assert sum(highs.values()) == total, highs
    kafka_admin.commit_offsets("bench-topic-check-group", topic, highs)
    table = "bench_topic_check_sink"
    started = time.monotonic()
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS bench_topic_check_sink")
        cur.execute("CREATE TABLE bench_topic_check_sink (id bigint NOT NULL)")
        cur.execute("INSERT INTO bench_topic_check_sink SELECT g FROM generate_series(1, %s) g WHERE g %% %s <> 0",
                    [total, LOST_EVERY])
        cur.execute("INSERT INTO bench_topic_check_sink SELECT g FROM generate_series(1, %s) g WHERE g %% %s = 0",
                    [total, DUPLICATED_EVERY])
    print(f"table of {total:,} keys written in {time.monotonic() - started:.1f} s", flush=True)
    get_spark()
    started = time.monotonic()
    report = spark_topic_check.check_topic(topic, "bench-topic-check-group", table, "id", "int_value")
    seconds = time.monotonic() - started
    lost, duplicated = total // LOST_EVERY, total // DUPLICATED_EVERY
    assert report["missing_count"] == lost, report["missing_count"]
    assert report["duplicated_count"] == duplicated and report["records_read"] == total, report
    print(f"topic check of {total:,} records: {seconds:.1f} s ({total / seconds:,.0f} records/s); found "
          f"{report['missing_count']} missing, {report['duplicated_count']} duplicated (as planted)", flush=True)
    with connection.cursor() as cur:
        cur.execute("DROP TABLE bench_topic_check_sink")


if __name__ == "__main__":
    main()
