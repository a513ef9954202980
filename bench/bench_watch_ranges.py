"""Benchmark: the query of a watch's page and API that reads its newest ranges, after a long history. Not run by CI.

    /path/to/python bench/bench_watch_ranges.py [--ranges 300000] [--partitions 3] [--repeat 5] [--drop]

Uses its own database (default `tally_bench_watch_ranges`, migrated afresh). Seeds one watch with `--ranges` ranges,
as a watch with a finding at every 30 s check keeps them (ranges with findings are never merged): one lost record per
range, the ranges of each check 30 s after the last one's, dealt over the partitions. Then runs EXPLAIN ANALYZE of
the query the page and the API issue (WatchRange.objects.filter(watch=...).newest()[:RANGES_SHOWN]), `--repeat`
times (median execution time), first without the index `watch_range_newest_idx` (as before migration 0021), then
with it, and prints the plan's nodes of each.

Then, on the same data, times (median of `--repeat`) the readers of the watch's findings: the first 1,000 lost
offsets (the page, the API, each check's report) and the alert pass's view of the watch with the lost rule,
as they read now (consumers/reconciliation/watch_listing.py: no further than they show) and as they read before
(every range with a finding). Last, the retention of the watch's history (watch_history.apply) with
TALLY_RETAIN_WATCH_HISTORY_DAYS set to half the seeded history, and the readers again.
"""
import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench_database  # noqa: E402 - bench/ is on the path as the script's folder

INDEX = "watch_range_newest_idx"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranges", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_watch_ranges")
    parser.add_argument("--drop", action="store_true", help="Drop the benchmark database at the end.")
    return parser.parse_args()


def seed(ranges: int, partitions: int):
    """One watch and its history: range i is partition i % P, offsets [10k, 10k + 10) of its partition (k = i // P),
    one lost record, checked at check i // P (30 s apart)."""
    from django.db import connection

    from consumers.models import Watch

    watch = Watch.objects.create(name="long-history", group_id="team", topic="orders", sink_table="orders",
                                 record_id="value", row_id="id")
    with connection.cursor() as cur:
        cur.execute("""
            INSERT INTO consumers_watchrange (watch_id, partition, start, "end", records, ignored, superseded,
                unreadable, lost, duplicated, phantom, lost_offsets, duplicated_offsets, phantom_offsets, note,
                engine, checked_at)
            SELECT %s, i %% %s, (i / %s) * 10, (i / %s) * 10 + 10, 10, 0, 0, 0, 1, 0, 0,
                   jsonb_build_array((i / %s) * 10), '[]', '[]', '', 'postgres',
                   now() - make_interval(secs => 30 * (%s - i / %s))
            FROM generate_series(0, %s - 1) i""",
                    [watch.pk, partitions, partitions, partitions, partitions, ranges // partitions + 1, partitions,
                     ranges])
        cur.execute("ANALYZE consumers_watchrange")
    return watch


def page_query(watch) -> str:
    from django.db import connection

    from consumers.models import RANGES_SHOWN, WatchRange

    query, params = WatchRange.objects.filter(watch=watch).newest()[:RANGES_SHOWN].query.sql_with_params()
    with connection.cursor() as cur:
        return cur.cursor.mogrify(query, params).decode()


def explain(query: str, repeat: int) -> tuple[float, list[str]]:
    """The median execution time (ms) of `repeat` EXPLAIN ANALYZE runs, and the plan's node lines of the last."""
    from django.db import connection

    times, plan = [], []
    with connection.cursor() as cur:
        for _ in range(repeat):
            cur.execute(f"EXPLAIN (ANALYZE, BUFFERS) {query}")
            lines = [row[0] for row in cur.fetchall()]
            times.append(float(next(line for line in lines if line.startswith("Execution Time")).split()[2]))
            plan = [line.strip() for line in lines if "->" in line or line.startswith(("Limit", "Index", "Sort"))]
    return statistics.median(times), plan


def median_ms(function, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def every_range_read(watch):
    """The readers before: every range with a finding of the watch, read and walked."""
    from consumers.models import WatchRange

    return sum(len(r.lost_offsets) for r in WatchRange.objects.filter(watch=watch).exclude(lost=0, duplicated=0,
                                                                                            phantom=0))


def time_readers(watch, repeat: int) -> dict[str, float]:
    from alerts.models import AlertRule, RuleKind
    from alerts.rules import WatchView, check
    from consumers.reconciliation import watch_listing

    rule = AlertRule(name="lost", kind=RuleKind.LOST)
    return {"first 1,000 lost offsets": median_ms(lambda: watch_listing.listed_offsets(watch), repeat),
            "alert view + lost rule": median_ms(lambda: check(rule, WatchView.load_all([watch], now())[watch.pk]),
                                                repeat),
            "every range with a finding (before)": median_ms(lambda: every_range_read(watch), repeat)}


def now():
    from django.utils import timezone

    return timezone.now()


def seed_totals(watch):
    """The partitions' rows with the totals the ranges count, as the checks kept them."""
    from django.db.models import Count, Max, Sum

    from consumers.models import WatchPartition, WatchRange

    for row in WatchRange.objects.filter(watch=watch).values("partition").annotate(
            n=Count("id"), lost=Sum("lost"), end=Max("end")):
        WatchPartition.objects.create(watch=watch, partition=row["partition"], start_offset=0,
                                      settled_offset=row["end"], committed=row["end"], checked=10 * row["n"],
                                      lost=row["lost"])


def main():
    args = parse_args()
    bench_database.setup_django(args.database_url, fresh=True)
    from django.db import connection

    from consumers.models import WatchRange

    watch = seed(args.ranges, args.partitions)
    query = page_query(watch)
    index = next(i for i in WatchRange._meta.indexes if i.name == INDEX)
    with connection.schema_editor() as editor:
        editor.remove_index(WatchRange, index)
    before = explain(query, args.repeat)
    with connection.schema_editor() as editor:
        editor.add_index(WatchRange, index)
    with connection.cursor() as cur:
        cur.execute("ANALYZE consumers_watchrange")
    after = explain(query, args.repeat)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM consumers_watchrange WHERE watch_id = %s", [watch.pk])
        count = cur.fetchone()[0]
        cur.execute("SELECT version()")
        version = cur.fetchone()[0].split(" on ")[0]
    print(f"{version}; load average {os.getloadavg()[0]:.1f}; {count:,} ranges of one watch, "
          f"{args.partitions} partitions; median of {args.repeat} EXPLAIN ANALYZE")
    for label, (ms, plan) in (("without " + INDEX, before), ("with " + INDEX, after)):
        print(f"\n{label}: {ms:.3f} ms")
        for line in plan:
            print("   ", line)

    from django.conf import settings

    from consumers.reconciliation import watch_history

    seed_totals(watch)
    print(f"\nreaders of the watch's findings, median of {args.repeat}:")
    for label, ms in time_readers(watch, args.repeat).items():
        print(f"    {label}: {ms:.1f} ms")
    oldest = WatchRange.objects.filter(watch=watch).order_by("checked_at").values_list("checked_at", flat=True)[0]
    days = (now() - oldest) / timedelta(days=1)
    settings.TALLY_RETAIN_WATCH_HISTORY_DAYS = max(1, round(days / 2))
    started = time.perf_counter()
    folded = watch_history.apply()["watch_ranges"]
    print(f"\nretention at {settings.TALLY_RETAIN_WATCH_HISTORY_DAYS} days of {days:.1f}: {folded:,} ranges folded "
          f"in {time.perf_counter() - started:.1f} s; "
          f"{WatchRange.objects.filter(watch=watch).count():,} ranges left")
    for label, ms in time_readers(watch, args.repeat).items():
        print(f"    {label}: {ms:.1f} ms")
    if args.drop:
        bench_database.drop_database(args.database_url)


if __name__ == "__main__":
    main()
