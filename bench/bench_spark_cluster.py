"""Scale-out of the Spark engine on a real standalone cluster: the same pipeline over the same records on
1 worker x 1 core, then on 2 workers x 1 core (each a fresh master and workers from the pyspark wheel, as
tests/spark_cluster.py starts them), exactly-once, `int_value`, the executors committing.

For each cluster: steady throughput (records after the first micro-batch / first -> last commit, from the
ledger), total (all records / run start -> last commit), records/s per executor core, and where the CPU went
during the run, from psutil: CPU seconds of the broker, PostgreSQL backends of the bench database, the
executors (JVMs and their Python workers), the driver (this process and its JVM), other PostgreSQL backends,
and everything else on the machine (other people's work), each as cores busy on average.

Usage (from the project root; uses database tally_bench_spark):
  .venv/bin/python bench/bench_spark_cluster.py [--records 600000] [--partitions 4] [--json out.json]
"""
import argparse
import json
import os
import platform
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tally.settings")
os.environ.setdefault("TALLY_DEVELOPMENT", "1")  # a checkout's bench is development, like manage.py
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tally_bench_spark")
os.environ.setdefault("KAFKA_SESSION_TIMEOUT_MS", "6000")  # real Kafka refuses less

CLUSTERS = ((1, 1), (2, 1))   # (workers, cores per worker)
SAMPLE_S = 0.5                # CPU sampling period: short runs still get a dozen samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--trigger", type=int, default=None, help="records per micro-batch (engine default)")
    parser.add_argument("--json", help="also write the results here")
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
        results = run(args, process.pid)
    finally:
        broker.stop_broker(process)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def run(args, broker_pid: int) -> dict:
    from bench_spark import drop_pipeline, make_pipeline, produce
    from django.conf import settings

    from consumers.engine.spark_session import get_spark, stop_spark
    from tests.spark_cluster import StandaloneCluster

    tag = uuid.uuid4().hex[:6]
    topic, small = f"bench-cluster-{tag}", f"bench-cluster-warm-{tag}"
    seconds = produce(topic, args.records, args.partitions)
    produce(small, 2000, args.partitions, processes=1)
    print(machine(), flush=True)
    print(f"produced {args.records:,} records to {args.partitions} partitions in {seconds:.1f} s", flush=True)
    results = {"machine": machine(), "records": args.records, "partitions": args.partitions, "runs": []}
    for workers, cores in CLUSTERS:
        with StandaloneCluster(workers=workers, cores=cores, name=f"bench{workers}x{cores}") as cluster:
            stop_spark(shutdown_jvm=True)
            settings.SPARK_MASTER = cluster.master
            get_spark()
            warm = make_pipeline(f"bench-warm-{workers}-{tag}", small, "spark")
            timed(warm)  # the first query of a session pays for Python workers and planning: not measured
            drop_pipeline(warm)
            pipeline = make_pipeline(f"bench-cluster-{workers}x{cores}-{tag}", topic, "spark")
            with CpuMeter(broker_pid, cluster, settings.DATABASES["default"]["NAME"]) as meter:
                outcome = timed(pipeline, batch_size=args.trigger)
            drop_pipeline(pipeline)
            stop_spark(shutdown_jvm=True)
        executor_cores = workers * cores
        row = {"workers": workers, "cores_per_worker": cores, **outcome,
               "per_core": outcome["steady"] / executor_cores, "cpu_cores_busy": meter.cores_busy,
               "load_average": meter.load_average}
        results["runs"].append(row)
        print(f"{workers} worker(s) x {cores} core: steady {row['steady']:,.0f} rec/s, total {row['total']:,.0f} "
              f"rec/s, {row['per_core']:,.0f} rec/s per executor core, {row['batches']} micro-batches", flush=True)
        print("  CPU (cores busy on average): " + ", ".join(
            f"{group} {busy:.2f}" for group, busy in meter.cores_busy.items()), flush=True)
    one, two = results["runs"]
    results["ratio_steady"] = two["steady"] / one["steady"]
    results["ratio_total"] = two["total"] / one["total"]
    print(f"ratio 2 workers / 1 worker: steady {results['ratio_steady']:.2f}x, total {results['ratio_total']:.2f}x",
          flush=True)
    return results


def timed(pipeline, **kwargs) -> dict:
    from consumers.engine import spark as engine
    from consumers.models import BatchLedger

    started = time.time()
    result = engine.run_pipeline(pipeline.name, stop_when_caught_up=True, **kwargs)
    assert result.reason == "caught_up", result
    # Each micro-batch commits one ledger row per partition (on the executors): a partition's first row is
    # its slice of the first micro-batch. Steady = what came after the first micro-batch, from its last commit.
    rows = list(BatchLedger.objects.filter(pipeline=pipeline).order_by("partition", "first_offset")
                .values_list("partition", "records", "committed_at"))
    firsts = {}
    for partition, records, committed_at in rows:
        firsts.setdefault(partition, (records, committed_at.timestamp()))
    first_batch_end = max(at for _, at in firsts.values())
    last_at = max(committed_at.timestamp() for _, _, committed_at in rows)
    after_first = result.records - sum(records for records, _ in firsts.values())
    return {"records": result.records, "batches": result.batches, "seconds": last_at - started,
            "steady": after_first / max(last_at - first_batch_end, 1e-9),
            "total": result.records / (last_at - started)}


class CpuMeter:
    """CPU seconds per group of processes while the block runs, from psutil (sampled, so processes that come
    and go, like Spark's Python workers, are counted while they live)."""

    def __init__(self, broker_pid: int, cluster, database: str):
        self.broker_pid, self.cluster, self.database = broker_pid, cluster, database
        self.first: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()

    def __enter__(self):
        import psutil

        self.started_at = time.monotonic()
        self.machine_start = psutil.cpu_times()
        self._sample(initial=True)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        import psutil

        self._stop.set()
        self._thread.join()
        self._sample()
        wall = time.monotonic() - self.started_at
        busy: dict[str, float] = {}
        for pid, (group, cpu) in self.last.items():
            busy[group] = busy.get(group, 0.0) + cpu - self.first.get(pid, 0.0)
        end = psutil.cpu_times()
        idle = (end.idle + end.iowait) - (self.machine_start.idle + self.machine_start.iowait)
        self.cores_busy = {group: round(seconds / wall, 2) for group, seconds in sorted(busy.items())}
        self.cores_busy["machine (all)"] = round((os.cpu_count() * wall - idle) / wall, 2)
        self.load_average = round(os.getloadavg()[0], 1)

    def _loop(self):
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def _sample(self, initial: bool = False) -> None:
        import psutil

        groups = self._groups()
        for process in psutil.process_iter(["pid", "cmdline", "cpu_times", "create_time"]):
            try:
                times = process.info["cpu_times"]
                if times is None:
                    continue
                cpu = times.user + times.system
                pid = process.info["pid"]
                group = groups.get(pid) or self._classify(process.info["cmdline"] or [])
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if initial:
                self.first[pid] = cpu
            self.last[pid] = (group, cpu)

    def _groups(self) -> dict[int, str]:
        import psutil

        groups = {}
        roots = {"broker": [self.broker_pid], "executors": self.cluster.executor_pids(),
                 "spark master+workers": [p.pid for p in self.cluster.processes], "driver": [os.getpid()]}
        for group, pids in roots.items():
            for pid in pids:
                try:
                    family = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
                except psutil.NoSuchProcess:
                    continue
                for member in family:
                    groups.setdefault(member.pid, group)
        return groups

    def _classify(self, cmdline: list[str]) -> str:
        text = " ".join(cmdline)
        if text.startswith("postgres:"):
            return "postgresql (bench db)" if f" {self.database} " in text else "postgresql (other)"
        return "other processes"


def machine() -> str:
    import pyspark

    java = os.popen("java -version 2>&1 | head -1").read().strip()
    return (f"{platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}, PySpark "
            f"{pyspark.__version__}, {java}, load average {os.getloadavg()[0]:.1f}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


if __name__ == "__main__":
    main()
