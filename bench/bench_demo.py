"""Where the demo's time goes: run the classic demo (all pipelines, Spark included) and print, per
pipeline, the timeline of its processes (start, crash, done: seconds since the run began) and the totals.

Usage (from the project root; uses the database of DATABASE_URL and the broker of KAFKA_BOOTSTRAP_SERVERS):
  .venv/bin/python bench/bench_demo.py [--records 100] [--probability 0.2] [--seeds 1,2,3]
      [--pipelines nums-spark-exactly-once] [--spark-restarts]   # restart the Spark driver per crash
  .venv/bin/python bench/bench_demo.py --spark-breakdown [--crash-at mid-write@4]   # the Spark pipeline
      alone, on a cold driver then warm: JVM + session, query start, each micro-batch, worker crashes
"""
import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    # Set up here, not on import: the demo's fork server imports this module again in each child it forks.
    started = time.monotonic()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tally.settings")
    os.environ.setdefault("TALLY_DEVELOPMENT", "1")  # a checkout's bench is development, like manage.py
    import django

    django.setup()
    print(f"Python + Django start: {time.monotonic() - started:.1f} s")
    from consumers.demo.classic import run_classic_demo

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument("--probability", type=float, default=0.2)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--pipelines", default="", help="Comma-separated demo pipelines (default: all).")
    parser.add_argument("--spark-restarts", action="store_true", help="Kill the Spark driver, not its worker.")
    parser.add_argument("--spark-breakdown", action="store_true")
    parser.add_argument("--crash-at", default="mid-write@4", help="--spark-breakdown: worker crashes.")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if args.spark_breakdown:
        spark_breakdown(args.records, args.crash_at)
        return
    for seed in [int(s) for s in args.seeds.split(",")]:
        started = time.monotonic()
        result = run_classic_demo(records=args.records, crash_probability=args.probability, seed=seed,
                                  pipelines=args.pipelines.split(",") if args.pipelines else None,
                                  spark_kills_workers=not args.spark_restarts)
        total = time.monotonic() - started
        print(f"seed {seed}: {total:.1f} s in all")
        for name, outcome in result.items():
            events = " ".join(f"{t:.1f}:{e}" for t, e in outcome["timeline"])
            lost = len(outcome.get("missing", []))
            doubled = sum(c - 1 for c in outcome.get("duplicated", {}).values())
            print(f"  {name:26} {outcome['state']:5} crashes {outcome['restarts']:2} rows {outcome.get('rows')!s:4} "
                  f"lost {lost:3} dup {doubled:3} seed+reset {outcome['seed_s']} s | {events}")


def spark_breakdown(records: int, crash_at: str) -> None:
    """What the Spark demo pipeline spends its time on, on a cold driver and then on the same driver warm:
    JVM + session, then per run the query start and each micro-batch (Spark's own durations), with the
    crashes of `crash_at` (executor workers killed, as in the demo). Django is set up: see the first line."""
    from pyspark.sql.streaming import StreamingQueryListener

    from consumers.demo.classic import DEMO_BATCH_SIZE, seed_demo
    from consumers.engine.faults import FaultInjector
    from consumers.engine.spark import run_pipeline
    from consumers.engine.spark_session import get_spark

    started = time.monotonic()

    def say(what):
        print(f"{time.monotonic() - started:7.1f} s  {what}", flush=True)

    class Batches(StreamingQueryListener):
        def onQueryStarted(self, event):
            say("query started")

        def onQueryProgress(self, event):
            p = event.progress
            say(f"micro-batch {p.batchId}: {p.numInputRows} records, {p.durationMs['triggerExecution']} ms "
                f"(of which addBatch, the executors' commit: {p.durationMs.get('addBatch', 0)} ms)")

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            pass

    get_spark().streams.addListener(Batches())
    say("JVM start + SparkSession")
    for driver in ("cold", "warm"):
        seed_demo(records=records, reset=True)
        say(f"seeded ({driver} driver)")
        result = run_pipeline("nums-spark-exactly-once", batch_size=DEMO_BATCH_SIZE, stop_when_caught_up=True,
                              faults=FaultInjector.parse(crash_at, in_worker=True))
        say(f"{driver} driver: {result.reason}, {result.records} records in {result.batches} micro-batches")


if __name__ == "__main__":
    main()
