"""How long a run of the kafka-python engine waits before its first record, per delivery mode and way of starting:

  fresh           the pipeline's first run (a consumer group nobody used)
  after-stop      a new run after the previous one stopped cleanly (SIGTERM: it commits and closes its consumer)
  after-sigkill   a new run after the previous one was killed (SIGKILL: it left nothing behind but its session)

Each run is `manage.py run_pipeline NAME` in its own process, as a worker runs it. The time counted is from the
run's start (its ConsumerRun row, written before the consumer is made) to the database transaction of its
first batch with records (its ledger row), so process start-up is not counted. Records are produced before
each run starts, so a run that has its partitions finds records at once.

No run joins a Kafka consumer group (consumers/engine/shares.py); the classic modes resume from the group's
committed offsets, exactly-once from the database.

Usage (from the project root; starts its own embedded broker, uses DATABASE_URL or database tally_bench):
  .venv/bin/python bench/bench_restart.py [--rounds 3] [--partitions 3] [--modes exactly_once,at_least_once]
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tally.settings")
os.environ.setdefault("TALLY_DEVELOPMENT", "1")  # a checkout's bench is development, like manage.py
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tally_bench")
os.environ.setdefault("KAFKA_SESSION_TIMEOUT_MS", "6000")

RECORDS_PER_ROUND = 300
WAIT_S = 60.0   # one run's first record: far above any join, so a hang shows as a failure, not a number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="fresh / after-stop / after-sigkill runs of each")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--modes", default="exactly_once,at_least_once,at_most_once",
                        help="comma-separated delivery modes")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]

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
        times = {(mode, scenario): [] for mode in modes for scenario in ("fresh", "after-stop", "after-sigkill")}
        for _ in range(args.rounds):
            for mode in modes:
                for scenario, seconds in one_round(args.partitions, mode).items():
                    times[(mode, scenario)].append(seconds)
                    print(f"{mode:>14} {scenario:>14}: {seconds:6.2f} s", flush=True)
    finally:
        broker.stop_broker(process)
    print(f"\nsession_timeout_ms {os.environ['KAFKA_SESSION_TIMEOUT_MS']}, {args.partitions} partitions, "
          f"{args.rounds} rounds; run start -> first record (median, min-max):")
    print(f"  load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for (mode, scenario), values in times.items():
        print(f"  {mode:>14} {scenario:>14}: {statistics.median(values):5.2f} s  ({min(values):.2f}-{max(values):.2f})")


def one_round(partitions: int, mode: str) -> dict[str, float]:
    from consumers.engine import db, sinks
    from consumers.models import DeliveryMode
    from tests.pipelines import create_pipeline

    name = f"restart-{uuid.uuid4().hex[:8]}"
    table = name.replace("-", "_")
    create_topic(name, partitions)
    pipeline = create_pipeline(name, name, table, "int_value", DeliveryMode(mode))
    try:
        out = {}
        produce(name, partitions)
        child = start_run(name)
        out["fresh"] = first_record_seconds(pipeline, child)
        stop(child, signal.SIGTERM)
        produce(name, partitions)
        child = start_run(name)
        out["after-stop"] = first_record_seconds(pipeline, child)
        wait_caught_up(pipeline)
        stop(child, signal.SIGKILL)
        produce(name, partitions)
        child = start_run(name)
        out["after-sigkill"] = first_record_seconds(pipeline, child)
        stop(child, signal.SIGTERM)
        return out
    finally:
        pipeline.delete()
        conn = db.connect("tally-bench")
        with conn.cursor() as cursor:
            sinks.drop_sink_table(cursor, table)
        conn.commit()
        conn.close()


def create_topic(topic: str, partitions: int) -> None:
    from kafka.admin import NewTopic

    from consumers.kafka import admin as kafka_admin

    with kafka_admin.admin_session() as admin:
        admin.create_topics([NewTopic(topic, partitions, 1)])


def produce(topic: str, partitions: int) -> None:
    from django.conf import settings
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, acks=1)
    while len(producer.partitions_for(topic) or ()) < partitions:
        time.sleep(0.1)
    for i in range(RECORDS_PER_ROUND):
        producer.send(topic, str(i).encode(), partition=i % partitions)
    producer.flush()
    producer.close()


def start_run(name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "run_pipeline", name], cwd=ROOT,
                            env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def first_record_seconds(pipeline, child: subprocess.Popen) -> float:
    """From the newest run's start to its first ledger row with records."""
    from consumers.models import BatchLedger, ConsumerRun

    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"run_pipeline exited with {child.returncode} before its first record")
        run = ConsumerRun.objects.filter(pipeline=pipeline, pid=child.pid).first()
        if run is not None:
            first = (BatchLedger.objects.filter(pipeline=pipeline, records__gt=0, committed_at__gte=run.started_at)
                     .order_by("committed_at").values_list("committed_at", flat=True).first())
            if first is not None:
                return (first - run.started_at).total_seconds()
        time.sleep(0.02)
    raise RuntimeError(f"no record within {WAIT_S} s")


def wait_caught_up(pipeline) -> None:
    from consumers.engine.caught_up import topic_caught_up

    deadline = time.monotonic() + WAIT_S
    while not topic_caught_up(pipeline).done:
        if time.monotonic() > deadline:
            raise RuntimeError(f"not caught up within {WAIT_S} s")
        time.sleep(0.05)


def stop(child: subprocess.Popen, signum: int) -> None:
    child.send_signal(signum)
    child.wait(timeout=WAIT_S)


if __name__ == "__main__":
    main()
