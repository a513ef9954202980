"""Pipelines in the production worker (docker-compose.yml's `worker` command), all in one run:

  cores   two exactly-once pipelines on two topics of N records each, started with `pipeline start` in one worker,
          against two bare kafka-python consumers in two processes reading the same records; with the worker's
          engine host processes (the default) and with TALLY_ENGINE_PROCESSES=0 (runs in the worker's threads)
  idle    K idle pipelines started in one worker: time until all hold their partitions, resident memory of the
          worker and its engine hosts, CPU over IDLE_SECONDS, and one idle `run_pipeline` process for comparison
  scale   (--scale, alone) issue 32's hundreds: N exactly-once pipelines and W watches on small topics, created
          through the audited doors, N started in one worker; start time, memory, idle CPU, produce-to-commit
          latency, the overview page, one reconcile pass, one watch check pass and one alert pass, each against
          its target. It first removes the pipelines and watches this bench made in earlier runs (their topics
          died with their broker, and their rows would weigh on the passes measured).

Usage (from the project root; starts its own embedded broker, uses database tally_bench_worker and REDIS_URL):
  .venv/bin/python bench/bench_worker.py [--records 200000] [--idle 20] [--skip-cores] [--skip-idle]
  .venv/bin/python bench/bench_worker.py --scale [--pipelines 200] [--watches 200] [--json PATH]
The pipelines' time is from their first to their last batch commit (the ledger's commit times, both
pipelines together; and the slower pipeline's own span); the bare consumers' from the first record either
received to the last either read.
"""
import argparse
import collections
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tally.settings")
os.environ.setdefault("TALLY_DEVELOPMENT", "1")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tally_bench_worker")
os.environ.setdefault("KAFKA_SESSION_TIMEOUT_MS", "6000")

IDLE_SECONDS = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--idle", type=int, default=20, help="idle pipelines in one worker")
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument("--skip-cores", action="store_true")
    parser.add_argument("--skip-idle", action="store_true")
    parser.add_argument("--scale", action="store_true", help="only the scale mode (issue 32's targets)")
    parser.add_argument("--pipelines", type=int, default=200, help="--scale: exactly-once pipelines")
    parser.add_argument("--watches", type=int, default=200, help="--scale: watches")
    parser.add_argument("--bare", metavar="TOPIC", help=argparse.SUPPRESS)   # the bare consumer's own process
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if args.bare:
        return bare_consumer(args.bare, args.records)

    import django
    from django.core.management import call_command

    from consumers.kafka import broker

    port = broker.free_port()
    process = broker.start_broker(port)
    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{port}"
    results = {"machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    try:
        django.setup()
        call_command("ensure_database", verbosity=0)
        call_command("migrate", verbosity=0, interactive=False)
        if args.scale:
            results["scale"] = scale(args)
        if not (args.skip_cores or args.scale):
            results["cores"] = cores(args)
        if not (args.skip_idle or args.scale):
            results["idle"] = idle(args)
    finally:
        broker.stop_broker(process)
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


# --- the worker ---------------------------------------------------------------------------------------------
def compose_worker() -> tuple[list[str], dict]:
    import yaml

    service = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["worker"]
    return shlex.split(service["command"]), {k: str(v) for k, v in service["environment"].items()}


class Worker:
    """The compose worker command, against this bench's broker, database and Redis."""

    def __init__(self, **env):
        from django.conf import settings

        from tally.celery import app

        command, compose_env = compose_worker()
        self.queue = compose_env["TALLY_PIPELINE_QUEUE"]
        settings.TALLY_PIPELINE_QUEUE = self.queue
        # The compose worker's engine client and parking, unless this bench's own environment names them.
        own = {key: str(compose_env.get(key, "")) for key in ("TALLY_KAFKA_CLIENT", "TALLY_PARK_IDLE_SECONDS")}
        environment = {**own, **os.environ, "TALLY_PIPELINE_QUEUE": self.queue, **env}
        self.park_idle_s = int(environment.get("TALLY_PARK_IDLE_SECONDS") or 0)
        self.log = open(ROOT / "var" / f"bench-worker-{uuid.uuid4().hex[:6]}.log", "wb")
        self.process = subprocess.Popen([sys.executable, "-m", *command, "-n", f"bench-{uuid.uuid4().hex[:6]}@%h",
                                         "--without-mingle", "--without-gossip"], cwd=ROOT, env=environment,
                                        stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not app.control.ping(timeout=0.5):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"the worker did not start: see {self.log.name}")

    def processes(self):
        import psutil

        root = psutil.Process(self.process.pid)
        return [root, *root.children(recursive=True)]

    def rss_mib(self) -> float:
        return sum(p.memory_info().rss for p in self.processes()) / 2**20

    def cpu_seconds(self) -> float:
        return sum(sum(p.cpu_times()[:2]) for p in self.processes())

    def stop(self) -> None:
        import signal

        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def fresh_pipeline(topic: str, batch_size: int):
    from consumers.engine import db, sinks
    from tests.pipelines import create_pipeline

    table = f"bench_{topic}".replace("-", "_")[:63]
    conn = db.connect("tally-bench")
    with conn.cursor() as cursor:
        sinks.drop_sink_table(cursor, table)
    conn.commit()
    conn.close()
    return create_pipeline(topic, topic, table, "int_value", "exactly_once", batch_size=batch_size)


def make_topic(prefix: str, records: int, partitions: int = 2) -> str:
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_engine import produce

    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    produce(topic, records, partitions, "int")
    return topic


def wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return result


def caught_up(pipeline) -> bool:
    from consumers.kafka import admin as kafka_admin

    return dict(pipeline.offsets.values_list("partition", "next_offset")) == kafka_admin.high_watermarks(pipeline.topic)


# --- cores ----------------------------------------------------------------------------------------------------
def bare_consumer(topic: str, records: int) -> None:
    import django

    django.setup()
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_engine import _reader

    consumer = _reader(topic, 2000)
    seen, first = 0, None
    while seen < records:
        for batch in consumer.poll(timeout_ms=500).values():
            first = first or time.time()
            for record in batch:
                seen += record.value is not None
    print(json.dumps({"first": first, "last": time.time()}))


def two_bare_consumers(topics: list[str], records: int) -> float:
    children = [subprocess.Popen([sys.executable, __file__, "--bare", topic, "--records", str(records)],
                                 stdout=subprocess.PIPE, text=True, env=os.environ) for topic in topics]
    spans = [json.loads(child.communicate()[0].strip().splitlines()[-1]) for child in children]
    return max(s["last"] for s in spans) - min(s["first"] for s in spans)


def two_pipelines_in_a_worker(topics: list[str], batch_size: int, **env) -> float:
    from django.db.models import Max, Min

    from consumers.models import BatchLedger
    from consumers.operations import actions

    pipelines = [fresh_pipeline(topic, batch_size) for topic in topics]
    worker = Worker(**env)
    try:
        for pipeline in pipelines:
            actions.start(pipeline.name)
        for pipeline in pipelines:
            wait(lambda p=pipeline: caught_up(p), 600, f"{pipeline.name} to catch up")
        spans = [BatchLedger.objects.filter(pipeline=pipeline, records__gt=0).aggregate(
            Min("committed_at"), Max("committed_at")) for pipeline in pipelines]
        for pipeline in pipelines:
            actions.stop(pipeline.name)
    finally:
        worker.stop()
    together = max(s["committed_at__max"] for s in spans) - min(s["committed_at__min"] for s in spans)
    each = max(s["committed_at__max"] - s["committed_at__min"] for s in spans)
    return together.total_seconds(), each.total_seconds()


def cores(args) -> dict:
    rounds = []
    for variant, env in (("engine hosts (default)", {}), ("worker threads (TALLY_ENGINE_PROCESSES=0)",
                                                          {"TALLY_ENGINE_PROCESSES": "0"})):
        topics = [make_topic("cores", args.records) for _ in range(2)]
        bare = two_bare_consumers(topics, args.records)
        worker, slowest = two_pipelines_in_a_worker(topics, args.batch_size, **env)
        row = {"variant": variant, "records_per_topic": args.records, "bare_two_processes_s": round(bare, 2),
               "worker_s": round(worker, 2), "ratio": round(worker / bare, 2),
               "slowest_pipeline_s": round(slowest, 2), "slowest_ratio": round(slowest / bare, 2),
               "worker_records_per_s": round(2 * args.records / worker),
               "load": round(os.getloadavg()[0], 1)}
        print(row, flush=True)
        rounds.append(row)
    return {"rounds": rounds}


# --- idle -----------------------------------------------------------------------------------------------------
def idle(args) -> dict:
    from consumers.operations import actions

    pipelines = [fresh_pipeline(make_topic("idle", 10, partitions=1), 500) for _ in range(args.idle)]
    worker = Worker()
    try:
        base_rss = worker.rss_mib()
        start_s = start_all(pipelines, records=10)
        cpu, rss = idle_cost(worker)
        hosts = len(worker.processes()) - 1
        for pipeline in pipelines:
            actions.stop(pipeline.name)
    finally:
        worker.stop()
    single = idle_run_pipeline_process(pipelines[0].name)
    result = {"pipelines": len(pipelines), "start_all_s": round(start_s, 1), "worker_rss_mib": round(rss),
              "worker_rss_before_runs_mib": round(base_rss), "engine_hosts": hosts,
              "rss_per_run_mib": round((rss - base_rss) / len(pipelines), 1),
              "idle_cpu_percent_of_a_core": round(100 * cpu, 1),
              "idle_cpu_percent_per_run": round(100 * cpu / len(pipelines), 2),
              "one_run_pipeline_process_rss_mib": round(single, 1)}
    print(result, flush=True)
    return result


def start_all(pipelines, records: int) -> float:
    """`pipeline start` each, then the seconds until every one has a live run holding its partition and has
    stored its position at the end of its topic (one partition of `records` records)."""
    from consumers.operations import actions

    started = time.monotonic()
    for pipeline in pipelines:
        actions.start(pipeline.name)
    wait(lambda: all_started(pipelines, records), 600, "every pipeline to start and catch up")
    return time.monotonic() - started


def all_started(pipelines, records: int) -> bool:
    # The database only: asking Kafka for each topic's end on every poll would load the machine more than the
    # runs being measured (a new probe consumer per topic).
    from consumers.models import ConsumerRun, PartitionOffset

    caught_up = PartitionOffset.objects.filter(pipeline__in=pipelines, next_offset=records).count()
    holding = ConsumerRun.objects.filter(pipeline__in=pipelines, ended_at__isnull=True).exclude(
        assigned_partitions=[]).values("pipeline").distinct().count()
    return caught_up == holding == len(pipelines)


def idle_cost(worker) -> tuple[float, float]:
    """CPU (a share of one core) over IDLE_SECONDS and resident MiB, of the worker and its engine hosts."""
    # Let start-up settle (and idle runs park, as the compose worker's do) before measuring the idle cost.
    time.sleep(5 + worker.park_idle_s)
    cpu_before, wall_before = worker.cpu_seconds(), time.monotonic()
    time.sleep(IDLE_SECONDS)
    cpu = (worker.cpu_seconds() - cpu_before) / (time.monotonic() - wall_before)
    return cpu, worker.rss_mib()


def idle_run_pipeline_process(name: str) -> float:
    """Resident memory of one idle `run_pipeline` process (the process-per-run design)."""
    import psutil

    from consumers.operations import actions

    actions.start(name)
    actions.stop(name)   # desired state back to stopped; the foreground run below joins the epoch it finds
    from consumers.models import Pipeline

    Pipeline.objects.filter(name=name).update(desired_state="running")
    child = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "run_pipeline", name, "--max-seconds", "30"],
                             cwd=ROOT, env=os.environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from consumers.models import ConsumerRun

        wait(lambda: ConsumerRun.objects.filter(pipeline__name=name, pid=child.pid).exclude(
            assigned_partitions=[]).exists(), 60, "the run_pipeline process to hold its partition")
        time.sleep(3)
        return psutil.Process(child.pid).memory_info().rss / 2**20
    finally:
        child.terminate()
        child.wait()


# --- scale ----------------------------------------------------------------------------------------------------
# Issue 32's targets for 200 pipelines and 200 watches in one worker: each measured value must stay below.
TARGETS = {"start_all_s": 60, "worker_rss_mib": 2048, "idle_cpu_percent_of_a_core": 10,
           "produce_to_commit_p95_s": 2, "overview_page_median_ms": 200, "reconcile_pass_s": 5,
           "watch_check_pass_s": 5, "alert_pass_s": 5}
SMALL_TOPIC_RECORDS = 5
LATENCY_SAMPLES = 50   # pipelines given one more record each, spaced over LATENCY_SPREAD_S
LATENCY_SPREAD_S = 10
PAGE_REQUESTS = 10
BENCH_PREFIXES = ("scale-", "idle-", "cores-")   # the names of what this bench creates


def scale(args) -> dict:
    from consumers.operations import actions

    clear_earlier_runs()
    made = time.monotonic()
    pipelines = [audited_pipeline(topic) for topic in small_topics("scale-p", args.pipelines)]
    for topic in small_topics("scale-w", args.watches):
        audited_watch(topic)
    setup_s = time.monotonic() - made
    worker = Worker()
    try:
        measured = {"start_all_s": start_all(pipelines, SMALL_TOPIC_RECORDS)}
        cpu, rss = idle_cost(worker)
        measured.update(worker_rss_mib=rss, idle_cpu_percent_of_a_core=100 * cpu)
        hosts = len(worker.processes()) - 1
        sampled = random.sample(pipelines, min(LATENCY_SAMPLES, len(pipelines)))
        measured.update(latency_summary(commit_latencies(produce_spaced(sampled))))
        measured.update(overview_page_ms())
        passes, outcomes = periodic_passes()
        measured.update(passes)
        for pipeline in pipelines:
            actions.stop(pipeline.name)
    finally:
        worker.stop()
    result = {"pipelines": len(pipelines), "watches": args.watches, "engine_hosts": hosts,
              "setup_s": round(setup_s, 1), "measured": {k: round(v, 3) for k, v in measured.items()},
              "targets": against_targets(measured), "passes_found": outcomes}
    print(result, flush=True)
    return result


def clear_earlier_runs() -> None:
    """Remove the pipelines and watches this bench made before, with their tables: their topics died with
    their broker, and they would weigh on the passes measured."""
    from django.db import connection
    from django.db.models import Q

    from consumers.engine import sinks
    from consumers.models import Pipeline, Watch

    named = Q()
    for prefix in BENCH_PREFIXES:
        named |= Q(name__startswith=prefix)
    pipelines, watches = Pipeline.objects.filter(named), Watch.objects.filter(named)
    with connection.cursor() as wrapper:
        for table in [*pipelines.values_list("sink_table", flat=True), *watches.values_list("sink_table", flat=True)]:
            sinks.drop_sink_table(wrapper.cursor, table)
    pipelines.delete()
    watches.delete()


def small_topics(prefix: str, count: int) -> list[str]:
    """`count` topics of one partition holding the values 1..SMALL_TOPIC_RECORDS, from one producer."""
    from django.conf import settings
    from kafka import KafkaProducer
    from kafka.admin import NewTopic

    from consumers.kafka import admin as kafka_admin

    topics = [f"{prefix}{i:03d}" for i in range(count)]
    with kafka_admin.admin_session() as admin:
        for first in range(0, count, 50):   # a few requests, each well inside the broker's request timeout
            admin.create_topics([NewTopic(topic, 1, 1) for topic in topics[first:first + 50]])
    producer = KafkaProducer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, linger_ms=20)
    for topic in topics:
        for value in range(1, SMALL_TOPIC_RECORDS + 1):
            producer.send(topic, str(value).encode())
    producer.flush()
    producer.close()
    return topics


def audited_pipeline(topic: str):
    """An exactly-once pipeline made through the product's door (validated, audited), with its sink table."""
    from consumers.operations import pipeline_setup

    spec = pipeline_setup.PipelineSpec(name=topic, topic=topic, sink_table=f"bench_{topic}".replace("-", "_"),
                                       create_table=True)
    return pipeline_setup.create(spec, actor="bench")


def audited_watch(topic: str):
    """A watch of a group Tally does not run, left as a healthy consumer leaves it: every record has its row in
    the team's table (id = the record's value) and the group committed the topic's end."""
    from django.db import connection
    from psycopg2 import sql

    from consumers.kafka import admin as kafka_admin
    from consumers.operations import watch_setup

    table, group = f"team_{topic}".replace("-", "_"), f"team-{topic}"
    with connection.cursor() as wrapper:
        wrapper.cursor.execute(sql.SQL("DROP TABLE IF EXISTS {0}; CREATE TABLE {0} (id bigint)").format(
            sql.Identifier(table)))
        wrapper.cursor.execute(sql.SQL("INSERT INTO {} SELECT generate_series(1, %s)").format(sql.Identifier(table)),
                               [SMALL_TOPIC_RECORDS])
    kafka_admin.commit_offsets(group, topic, {0: SMALL_TOPIC_RECORDS})
    spec = watch_setup.WatchSpec(name=topic, group=group, topic=topic, sink_table=table, record_id="value",
                                 row_id="id", settle_seconds=0)
    return watch_setup.create(spec, actor="bench")[0]


def produce_spaced(pipelines) -> dict[int, tuple[int, float]]:
    """One more record to each pipeline's topic, spaced over LATENCY_SPREAD_S: {pipeline id: (offset, produced
    at)}, the time being the record's own timestamp (set by the producer, on this machine's clock)."""
    from django.conf import settings
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, acks="all")
    produced = {}
    for pipeline in pipelines:
        sent = producer.send(pipeline.topic, b"1").get(timeout=10)
        produced[pipeline.pk] = (sent.offset, sent.timestamp / 1000)
        time.sleep(LATENCY_SPREAD_S / len(pipelines))
    producer.close()
    return produced


def commit_latencies(produced: dict[int, tuple[int, float]]) -> list[float]:
    """Seconds from each record produced to the commit of the batch holding it (its ledger row's committed_at:
    the commit transaction's start, on the database's clock, this machine's)."""
    from consumers.models import BatchLedger

    def committed() -> dict | None:
        rows = BatchLedger.objects.filter(pipeline_id__in=produced).values_list(
            "pipeline_id", "first_offset", "end_offset", "committed_at")
        at = {pk: committed_at for pk, first, end, committed_at in rows if first <= produced[pk][0] < end}
        return at if len(at) == len(produced) else None

    at = wait(committed, 120, "every record produced to be committed")
    return [at[pk].timestamp() - produced_at for pk, (_, produced_at) in produced.items()]


def latency_summary(latencies: list[float]) -> dict:
    # quantiles(n=20)'s last cut point is the 95th percentile; it needs two values at least.
    p95 = statistics.quantiles(latencies, n=20, method="inclusive")[-1] if len(latencies) > 1 else latencies[0]
    return {"produce_to_commit_p50_s": statistics.median(latencies), "produce_to_commit_p95_s": p95,
            "produce_to_commit_max_s": max(latencies), "latency_samples": len(latencies)}


def overview_page_ms() -> dict:
    """The overview page ('/') through Django's test client, signed in as a viewer, in this process: the median
    and the slowest of PAGE_REQUESTS requests, after one that warms templates and connections."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client

    from dashboard.roles import VIEWERS, setup_roles

    setup_roles()
    user, _ = get_user_model().objects.get_or_create(username="bench-viewer")
    user.groups.add(Group.objects.get(name=VIEWERS))
    client = Client()
    client.force_login(user)
    client.get("/").getvalue()
    times = []
    for _ in range(PAGE_REQUESTS):
        started = time.perf_counter()
        response = client.get("/")
        response.getvalue()   # a streamed page is only rendered as it is read
        times.append(1000 * (time.perf_counter() - started))
        if response.status_code != 200:
            raise RuntimeError(f"the overview page answered {response.status_code}")
    return {"overview_page_median_ms": statistics.median(times), "overview_page_max_ms": max(times)}


def periodic_passes() -> tuple[dict, dict]:
    """One reconcile pass, one watch check pass and one alert pass, each its periodic task's body run here;
    with what each found (all exact and OK is expected: nothing was lost)."""
    from alerts.tasks import evaluate_alerts_task
    from consumers.tasks.reconciliation import check_watches_task, reconcile_all_task

    seconds, found = {}, {}
    for name, task in (("reconcile_pass_s", reconcile_all_task), ("watch_check_pass_s", check_watches_task),
                       ("alert_pass_s", evaluate_alerts_task)):
        # Twice: the first pass audits everything new since the pipelines and watches were made (the whole of
        # their short history); the second is the periodic pass of a steady worker, which the target is about.
        for label in (name.replace("_s", "_first_s"), name):
            started = time.monotonic()
            outcome = task()
            seconds[label] = time.monotonic() - started
        found[name] = summary_of(outcome)
    return seconds, found


def summary_of(outcome: dict) -> dict:
    """A task's result without its per-pipeline or per-watch maps, which only say `OK` N times."""
    counts = {k: v for k, v in outcome.items() if not isinstance(v, dict | list)}
    if "statuses" in outcome:
        counts["statuses"] = dict(collections.Counter(outcome["statuses"].values()))
    for name in ("not_exact", "findings"):
        if name in outcome:
            counts[name] = outcome[name]
    return counts


def against_targets(measured: dict) -> dict:
    return {name: {"measured": round(measured[name], 3), "target": f"< {limit}", "met": measured[name] < limit}
            for name, limit in TARGETS.items()}


if __name__ == "__main__":
    main()
