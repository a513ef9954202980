"""`--transform json` and upsert, against their baselines, in one run:

  Part 1, the mapping: N records of 6-field JSON ({"id", "customer": {"name"}, "amount", "at", "meta": {...}})
    bare_json       a kafka-python consume loop that only json.loads every value (the ceiling)
    json_pipeline   run_pipeline, exactly-once, --transform json into orders(order_id bigint, customer text
                    [customer.name], amount numeric(12,2), ordered_at timestamptz [at], meta jsonb, channel text
                    [meta.source]): a nested path, a numeric, a timestamptz and a jsonb column
    json_pipeline_2p  the same pipeline in two processes (`run_pipeline --processes 2`), with --processes 2
    json_pipeline_rdkafka  the same pipeline, one process, with kafka_client = librdkafka (it fetches and decodes in
                    C threads, outside the GIL), with --rdkafka
  Part 2, keyed tables: M records with random keys out of 1,000,000 into tables that already hold 1,000,000 rows
    append          the json pipeline appending (one row per record)
    upsert          the same records with --upsert-key order_id (INSERT ... ON CONFLICT DO UPDATE), every key present
    then the upsert pipeline's reconciliation: its first pass, an idle pass, and the phantom scan an idle pass
    no longer makes

Usage (from the project root; starts its own embedded broker, uses database tally_bench_json):
  .venv/bin/python bench/bench_json.py [--records 200000] [--keyed-records 200000] [--keys 1000000]
        [--partitions 3] [--batch-size 20000] [--repeat 3] [--processes 2] [--rdkafka] [--json results.json]
Throughput is records / (first record received -> last record written). Each round runs every mode once, in a
rotated order; ratios are taken within a round and the median over rounds is reported, with the range.
"""
import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tally.settings")
os.environ.setdefault("TALLY_DEVELOPMENT", "1")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tally_bench_json")
os.environ.setdefault("KAFKA_SESSION_TIMEOUT_MS", "6000")

ORDERS_DDL = ("CREATE TABLE {} (order_id bigint NOT NULL{}, customer text, amount numeric(12,2), "
              "ordered_at timestamptz, meta jsonb, channel text, source_topic text NOT NULL, "
              "source_partition integer NOT NULL, source_offset bigint NOT NULL)")
MAPPING = {"order_id": "id", "customer": "customer.name", "ordered_at": "at", "channel": "meta.source"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keyed-records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--processes", type=int, default=0, help="also run the json pipeline in N processes")
    parser.add_argument("--rdkafka", action="store_true", help="also the json pipeline with the librdkafka client")
    parser.add_argument("--only", choices=["mapping", "keyed"], help="run one part")
    parser.add_argument("--json", metavar="PATH")
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
        # As `engine_host` and `run_pipeline` tune theirs; the bare loop runs in this process too, so it has the
        # same collector.
        from consumers.engine import gc_tuning
        gc_tuning.tune_for_engine()
        results = {}
        if args.only in (None, "mapping"):
            results["mapping"] = mapping_part(args)
        if args.only in (None, "keyed"):
            results["keyed"] = keyed_part(args)
    finally:
        broker.stop_broker(process)
    report(args, results)


def order(i: int, key: int) -> bytes:
    return json.dumps({"id": key, "customer": {"name": f"customer {key % 9973}", "tier": "gold"},
                       "amount": round((i % 100_000) / 7, 2), "at": f"2026-11-{1 + i % 28:02d}T12:{i % 60:02d}:00Z",
                       "meta": {"source": "web" if i % 3 else "app", "tags": ["a", "b"], "n": i}}).encode()


def produce(topic: str, values, partitions: int) -> None:
    from django.conf import settings
    from kafka import KafkaProducer
    from kafka.admin import NewTopic

    from consumers.kafka import admin as kafka_admin

    with kafka_admin.admin_session() as admin:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    producer = KafkaProducer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, linger_ms=20, batch_size=1 << 18,
                             acks=1)
    while len(producer.partitions_for(topic) or ()) < partitions:
        time.sleep(0.1)
    count = 0
    for i, (key, value) in enumerate(values):
        producer.send(topic, value, key=key, partition=i % partitions)
        count += 1
    producer.flush()
    producer.close()
    assert sum(kafka_admin.high_watermarks(topic).values()) == count


def bare_json(topic: str, records: int, batch_size: int) -> float:
    from django.conf import settings
    from kafka import KafkaConsumer, TopicPartition

    from consumers.kafka import admin as kafka_admin

    consumer = KafkaConsumer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, enable_auto_commit=False,
                             max_poll_records=batch_size)
    tps = [TopicPartition(topic, p) for p in kafka_admin.partitions_for(topic)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    loads, seen, first = json.loads, 0, None
    while seen < records:
        for batch in consumer.poll(timeout_ms=500).values():
            first = first or time.monotonic()
            for record in batch:
                loads(record.value)
                seen += 1
    seconds = time.monotonic() - first
    consumer.close()
    return seconds


def sql_execute(statement, *params) -> None:
    from consumers.engine import db

    conn = db.connect("tally-bench")
    with conn.cursor() as cursor:
        cursor.execute(statement, params or None)
    conn.commit()
    conn.close()


def fresh_table(table: str, unique_key: bool, fill_keys: int = 0) -> None:
    from psycopg2 import sql

    from consumers.engine import db

    conn = db.connect("tally-bench")
    with conn.cursor() as cursor:
        cursor.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        cursor.execute(sql.SQL(ORDERS_DDL.format("{}", " PRIMARY KEY" if unique_key else "")).format(
            sql.Identifier(table)))
        if not unique_key:
            cursor.execute(sql.SQL("ALTER TABLE {} ADD UNIQUE (source_topic, source_partition, source_offset)")
                           .format(sql.Identifier(table)))
        if fill_keys:
            cursor.execute(sql.SQL(
                "INSERT INTO {} SELECT k, 'customer ' || k, k %% 1000, now(), '{{\"n\": 1}}', 'web', 'seed', 0, k "
                "FROM generate_series(0, %s - 1) AS k").format(sql.Identifier(table)), [fill_keys])
            cursor.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
    conn.commit()
    conn.close()


def json_pipeline(name: str, topic: str, table: str, records: int, batch_size: int, upsert: bool = False,
                  processes: int = 0, kafka_client: str = "") -> float:
    from consumers.models import Pipeline

    Pipeline.objects.filter(name=name).delete()
    Pipeline.objects.create(name=name, topic=topic, sink_table=table, transform="json", json_map=MAPPING,
                            batch_size=batch_size, upsert_key=["order_id"] if upsert else [],
                            **({"kafka_client": kafka_client} if kafka_client else {}))
    if processes > 1:
        import subprocess

        from django.conf import settings

        env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=settings.KAFKA_BOOTSTRAP_SERVERS)
        done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "run_pipeline", name, "--processes",
                               str(processes), "--stop-when-caught-up", "--json"], env=env, cwd=ROOT,
                              capture_output=True, text=True, check=True)
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
        assert sum(run["records"] for run in outcome["runs"]) == records, outcome
        return outcome["busy_seconds"]
    from consumers.engine.python import run_pipeline

    result = run_pipeline(name, stop_when_caught_up=True)
    assert (result.reason, result.records, result.dead_letters) == ("caught_up", records, 0), result
    return result.busy_seconds


def rounds_of(args, modes: dict) -> list[dict]:
    names, rounds = list(modes), []
    for number in range(args.repeat):
        shift = number % len(names)
        measured = {}
        for mode in names[shift:] + names[:shift]:
            measured[mode] = modes[mode](number)
        rounds.append({"load_average": os.getloadavg()[0], "records_per_second": measured})
        print(f"round {number + 1}: " + ", ".join(f"{m} {measured[m]:,.0f}/s" for m in names)
              + f" (load {os.getloadavg()[0]:.1f})", flush=True)
    return rounds


def mapping_part(args) -> dict:
    topic = f"bench-json-{int(time.time())}"
    produce(topic, ((None, order(i, i)) for i in range(args.records)), args.partitions)
    table = "bench_json_orders"

    def pipeline(number, processes=0, kafka_client=""):
        fresh_table(table, unique_key=False)
        return args.records / json_pipeline(f"{topic}-r{number}-{processes}p{kafka_client[:3]}", topic, table,
                                            args.records, args.batch_size, processes=processes,
                                            kafka_client=kafka_client)

    modes = {"bare_json": lambda n: args.records / bare_json(topic, args.records, args.batch_size),
             "json_pipeline": pipeline}
    if args.processes > 1:
        modes[f"json_pipeline_{args.processes}p"] = lambda n: pipeline(n, args.processes)
    if args.rdkafka:
        modes["json_pipeline_rdkafka"] = lambda n: pipeline(n, kafka_client="librdkafka")
    return {"base": "bare_json", "rounds": rounds_of(args, modes)}


def keyed_part(args) -> dict:
    from psycopg2 import sql

    topic = f"bench-keyed-{int(time.time())}"
    rng = random.Random(29)
    keys = [rng.randrange(args.keys) for _ in range(args.keyed_records)]
    produce(topic, ((str(k).encode(), order(i, k)) for i, k in enumerate(keys)), args.partitions)
    print(f"filling two tables with {args.keys:,} keys ...", flush=True)
    fresh_table("bench_keyed_append", unique_key=False, fill_keys=args.keys)
    fresh_table("bench_keyed_upsert", unique_key=True, fill_keys=args.keys)

    def run(table, upsert):
        def mode(number):
            if not upsert:  # each round appends the same records again: the previous round's copies go first
                sql_execute(sql.SQL("DELETE FROM {} WHERE source_topic = %s").format(sql.Identifier(table)), topic)
            name = f"{topic}-r{number}-{'upsert' if upsert else 'append'}"
            return args.keyed_records / json_pipeline(name, topic, table, args.keyed_records, args.batch_size, upsert)
        return mode

    result = {"base": "append", "rounds": rounds_of(args, {"append": run("bench_keyed_append", False),
                                                           "upsert": run("bench_keyed_upsert", True)})}
    result["reconcile"] = idle_reconcile(f"{topic}-r{args.repeat - 1}-upsert", "bench_keyed_upsert")
    print(f"reconcile of the upsert pipeline: {result['reconcile']}", flush=True)
    return result


def idle_reconcile(name: str, table: str) -> dict:
    """An upsert pipeline's reconciliation: the first pass (the new range read from Kafka, its keys looked up),
    then an idle pass, beside what each idle pass cost before it skipped the phantom query (a scan of the table,
    which has no provenance index)."""
    from psycopg2 import sql

    from consumers.engine import db
    from consumers.models import Pipeline
    from consumers.reconciliation.reconcile import reconcile_pipeline

    pipeline = Pipeline.objects.get(name=name)
    started = time.perf_counter()
    first = reconcile_pipeline(pipeline)
    first_ms = (time.perf_counter() - started) * 1000
    idle_ms = []
    for _ in range(5):
        started = time.perf_counter()
        idle = reconcile_pipeline(pipeline)
        idle_ms.append((time.perf_counter() - started) * 1000)
    conn = db.connect("tally-bench")
    scan_ms = []
    with conn.cursor() as cursor:
        for _ in range(5):
            started = time.perf_counter()
            cursor.execute(sql.SQL("SELECT count(*) FROM {} WHERE source_topic = %s AND source_partition = 0 "
                                   "AND source_offset >= %s").format(sql.Identifier(table)), [pipeline.topic, 1 << 40])
            cursor.fetchone()
            scan_ms.append((time.perf_counter() - started) * 1000)
    conn.close()
    assert first.lost == 0 and idle.lost == 0, (first.as_json(), idle.as_json())
    return {"first_pass_ms": round(first_ms, 1), "idle_pass_ms": round(statistics.median(idle_ms), 1),
            "phantom_scan_ms": round(statistics.median(scan_ms), 1), "table_rows": table_rows(table)}


def table_rows(table: str) -> int:
    from psycopg2 import sql

    from consumers.engine import db

    conn = db.connect("tally-bench")
    with conn.cursor() as cursor:
        cursor.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        count = cursor.fetchone()[0]
    conn.close()
    return count


def report(args, results: dict) -> None:
    import django
    import kafka
    import psycopg2

    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}; Python "
               f"{platform.python_version()}, kafka-python {kafka.__version__}, psycopg2 "
               f"{psycopg2.__version__.split()[0]}, Django {django.get_version()}, embedded Tansu broker")
    print(f"\n{machine}")
    summary = {}
    for part, result in results.items():
        base, rounds = result["base"], result["rounds"]
        loads = [r["load_average"] for r in rounds]
        print(f"\n{part}: {len(rounds)} rounds, load average {min(loads):.1f}-{max(loads):.1f}\n"
              f"| mode | records/s (median) | ÷ {base}, median of rounds | range |\n|---|---:|---:|---|")
        for mode in rounds[0]["records_per_second"]:
            speeds = [r["records_per_second"][mode] for r in rounds]
            ratios = [r["records_per_second"][mode] / r["records_per_second"][base] for r in rounds]
            summary[f"{part}.{mode}"] = {"records_per_second": statistics.median(speeds),
                                         "ratio": statistics.median(ratios), "range": [min(ratios), max(ratios)]}
            print(f"| {mode} | {statistics.median(speeds):,.0f} | {statistics.median(ratios):.2f}× | "
                  f"{min(ratios):.2f}–{max(ratios):.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "date": time.strftime("%Y-%m-%d %H:%M"),
                                               "args": vars(args), "summary": summary, "results": results},
                                              indent=2))


if __name__ == "__main__":
    main()
