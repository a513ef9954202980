"""Pipelines in the production worker (docker-compose.yml's `worker` command), all in one run:

  cores   two exactly-once pipelines on two topics of N records each, started with `pipeline start` in one worker,
          against two bare kafka-python consumers in two processes reading the same records; with the worker's
          engine host processes (the default) and with TALLY_ENGINE_PROCESSES=0 (runs in the worker's threads)
  idle    K idle pipelines started in one worker: time until all hold their partitions, resident memory of the
          worker and its engine hosts, CPU over IDLE_SECONDS, and one idle `run_pipeline` process for comparison

Usage (from the project root; starts its own embedded broker, uses database tally_bench_worker and REDIS_URL):
  .venv/bin/python bench/bench_worker.py [--records 200000] [--idle 20] [--skip-cores] [--skip-idle]
The pipelines' time is from their first to their last batch commit (the ledger's commit times, both
pipelines together; and the slower pipeline's own span); the bare consumers' from the first record either
received to the last either read.
"""
import argparse
import json
import os
import platform
import shlex
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
        if not args.skip_cores:
            results["cores"] = cores(args)
        if not args.skip_idle:
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
        environment = dict(os.environ, TALLY_PIPELINE_QUEUE=self.queue, **env)
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
    from consumers.models import ConsumerRun
    from consumers.operations import actions

    pipelines = [fresh_pipeline(make_topic("idle", 10, partitions=1), 500) for _ in range(args.idle)]
    worker = Worker()
    try:
        base_rss = worker.rss_mib()
        started = time.monotonic()
        for pipeline in pipelines:
            actions.start(pipeline.name)
        wait(lambda: all(caught_up(p) for p in pipelines), 600, "every idle pipeline to start and catch up")
        start_s = time.monotonic() - started
        live = ConsumerRun.objects.filter(pipeline__in=pipelines, ended_at__isnull=True)
        wait(lambda: live.count() == len(pipelines),
             60, "one live run per pipeline")
        time.sleep(5)   # let start-up settle before measuring the idle cost
        cpu_before, wall_before = worker.cpu_seconds(), time.monotonic()
        time.sleep(IDLE_SECONDS)
        cpu = (worker.cpu_seconds() - cpu_before) / (time.monotonic() - wall_before)
        rss = worker.rss_mib()
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


if __name__ == "__main__":
    main()
