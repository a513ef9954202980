"""Where the demo's time goes: run the classic demo (all pipelines, Spark included) and print, per
pipeline, the timeline of its processes (start, crash, done: seconds since the run began) and the totals.

Usage (from the project root; uses the database of DATABASE_URL and the broker of KAFKA_BOOTSTRAP_SERVERS):
  .venv/bin/python bench/bench_demo.py [--records 100] [--probability 0.2] [--seeds 1,2,3]
      [--pipelines nums-spark-exactly-once] [--spark-restarts]   # restart the Spark driver per crash
  .venv/bin/python bench/bench_demo.py --spark-breakdown   # one Spark process: Django, JVM + session,
                                                           # query start, micro-batches of the demo size
"""
import argparse
import os
import sys
import time
from pathlib import Path

STARTED = time.monotonic()
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tally.settings")

import django  # noqa: E402

django.setup()
print(f"Python + Django start: {time.monotonic() - STARTED:.1f} s")

from consumers.demo.classic import DEMO_BATCH_SIZE, run_classic_demo, seed_demo  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument("--probability", type=float, default=0.2)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--pipelines", default="", help="Comma-separated demo pipelines (default: all).")
    parser.add_argument("--spark-restarts", action="store_true", help="Kill the Spark driver, not its worker.")
    parser.add_argument("--spark-breakdown", action="store_true")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if args.spark_breakdown:
        spark_breakdown(args.records)
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


def spark_breakdown(records: int) -> None:
    """What one Spark demo process spends its time on (Django is already set up here: see the first line)."""
    from consumers.engine.spark import run_pipeline
    from consumers.engine.spark_session import get_spark

    seed_demo(records=records, reset=True)
    started = time.monotonic()
    get_spark()
    session = time.monotonic()
    print(f"JVM start + SparkSession: {session - started:.1f} s")
    result = run_pipeline("nums-spark-exactly-once", batch_size=DEMO_BATCH_SIZE, stop_when_caught_up=True)
    print(f"query start + {result.batches} micro-batches of {DEMO_BATCH_SIZE} + caught-up check: "
          f"{time.monotonic() - session:.1f} s (busy {result.busy_seconds:.1f} s)")


if __name__ == "__main__":
    main()
