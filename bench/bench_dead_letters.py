"""Benchmark of discarding dead letters in calls of up to MAX_PER_CALL ids. Not run by CI.

    .venv/bin/python bench/bench_dead_letters.py [--sizes 100,250,500,1000] [--repeat 5]

Uses its own database (default `tally_bench_dead_letters`, created and migrated; its pipeline is made anew each
run and deleted at the end). For each size N it writes N pending dead letters and times one audited discard of
all N ids (`consumers.operations.dead_letters.discard`), median of --repeat runs, with its SQL query count. The
time per letter should not grow with N: an operator's "discard all matching" of 100,000 letters makes 100 such
calls, each holding its letters' row locks until it commits.
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

from bench.bench_alerts import setup_django  # noqa: E402 (after the path: run as a script from the checkout)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,250,500,1000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_dead_letters")
    return parser.parse_args()


def letters(pipeline, count: int) -> list[int]:
    from consumers.models import DeadLetter

    DeadLetter.objects.filter(pipeline=pipeline).delete()
    made = DeadLetter.objects.bulk_create([DeadLetter(pipeline=pipeline, partition=0, offset=o, value=b"v",
                                                      error="BadRecord: bench") for o in range(count)])
    return [letter.pk for letter in made]


def main():
    args = parse_args()
    setup_django(args.database_url)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from consumers.models import Pipeline
    from consumers.operations import dead_letters

    Pipeline.objects.filter(name="bench-dead-letters").delete()
    pipeline = Pipeline.objects.create(name="bench-dead-letters", topic="bench-dead-letters",
                                       sink_table="bench_dead_letters_sink")
    print(f"# {platform.node()} · Python {platform.python_version()} · load average {os.getloadavg()[0]:.2f}")
    print("| ids in the call | median | per letter | SQL queries |")
    print("|---:|---:|---:|---:|")
    for size in (int(s) for s in args.sizes.split(",")):
        if size > dead_letters.MAX_PER_CALL:
            sys.exit(f"--sizes: at most {dead_letters.MAX_PER_CALL} ids per call")
        seconds = []
        for _ in range(args.repeat):
            ids = letters(pipeline, size)
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                result = dead_letters.discard(pipeline, ids, "bench", actor="bench")
                seconds.append(time.perf_counter() - started)
            assert result.counts == {"discarded": size}, result.counts
        median = statistics.median(seconds)
        print(f"| {size:,} | {median * 1000:.0f} ms | {median / size * 1e6:.0f} µs | {len(queries)} |")
    pipeline.delete()


if __name__ == "__main__":
    main()
