"""Benchmark of the dashboard's pages. Not run by CI.

    .venv/bin/python bench/bench_dashboard.py [--pipelines 50] [--partitions 12] [--repeat 30]

Uses its own database (default `tally_bench_dash`, created, migrated and filled if empty; dropped with
--drop): N pipelines of P partitions, each with positions, reconciliation results (some with findings),
a ledger of 200 batches per partition with a gap, an overlap and a rewind, 6 hours of lag snapshots at
one per minute (pipeline total and per partition), dead letters, runs and actions.
Then, in-process through Django's test client (no network), for each page: the median and p95 server
time over --repeat requests and the number of SQL queries. Targets: overview and pipeline page
< 150 ms median and < 25 queries; the live fragment < 50 ms.
"""
import argparse
import os
import platform
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench_database  # noqa: E402 - bench/ is on the path as the script's folder

BATCHES_PER_PARTITION = 200
BATCH = 500
SNAPSHOT_MINUTES = 6 * 60


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_dash")
    parser.add_argument("--drop", action="store_true", help="Drop the benchmark database at the end.")
    return parser.parse_args()


def fill(pipelines: int, partitions: int) -> None:
    from django.utils import timezone

    from consumers.models import (
        ActionLog,
        BatchLedger,
        ConsumerRun,
        DeadLetter,
        LagSnapshot,
        PartitionHealth,
        PartitionOffset,
        Pipeline,
        PipelineHealth,
    )

    if Pipeline.objects.count() == pipelines and PartitionOffset.objects.count() == pipelines * partitions:
        return
    Pipeline.objects.all().delete()
    now = timezone.now()
    end = BATCHES_PER_PARTITION * BATCH
    started = time.perf_counter()
    for i in range(pipelines):
        pipeline = Pipeline.objects.create(name=f"bench-{i:03d}", topic=f"topic-{i:03d}", sink_table=f"sink_{i:03d}")
        lost = 25 if i % 7 == 0 else 0
        PipelineHealth.objects.create(pipeline=pipeline, status="ERR" if lost else "OK", lost=lost,
                                      lag_records=partitions * 120, lag_seconds=3.5, records_per_second=900.0,
                                      checked_at=now)
        PartitionOffset.objects.bulk_create([PartitionOffset(pipeline=pipeline, partition=p, next_offset=end)
                                             for p in range(partitions)])
        PartitionHealth.objects.bulk_create([
            PartitionHealth(pipeline=pipeline, partition=p, verified_offset=end, log_start=0, high_watermark=end + 120,
                            next_offset=end, kafka_committed=end, lag_records=120, lag_seconds=3.5,
                            lost=lost if p == 0 else 0, checked_at=now,
                            findings=[{"kind": "lost", "start": 1000, "end": 1025, "count": 25}] if lost and p == 0
                            else [])
            for p in range(partitions)])
        ledger = []
        for p in range(partitions):
            for b in range(BATCHES_PER_PARTITION):
                first, last = b * BATCH, (b + 1) * BATCH
                if p == 0 and b == 2:
                    first += 25          # a gap
                if p == 1 and b == 3:
                    first -= 10          # an overlap
                ledger.append(BatchLedger(pipeline=pipeline, partition=p, first_offset=first, end_offset=last,
                                          records=last - first, rows_written=last - first, epoch=1,
                                          superseded_from=last - 100 if (p == 2 and b == 150) else None))
        BatchLedger.objects.bulk_create(ledger, batch_size=5000)
        snapshots = []
        for minute in range(SNAPSHOT_MINUTES):
            taken = now - timedelta(minutes=SNAPSHOT_MINUTES - minute)
            snapshots.append(LagSnapshot(pipeline=pipeline, group_id=pipeline.name, taken_at=taken,
                                         lag_records=partitions * (100 + minute % 40), lag_seconds=3.0,
                                         records_per_second=800.0 + minute % 50, resolution_seconds=60))
            snapshots += [LagSnapshot(pipeline=pipeline, group_id=pipeline.name, partition=p, taken_at=taken,
                                      lag_records=100 + minute % 40, lag_seconds=3.0, records_per_second=70.0,
                                      resolution_seconds=60) for p in range(partitions)]
        LagSnapshot.objects.bulk_create(snapshots, batch_size=5000)
        DeadLetter.objects.bulk_create([DeadLetter(pipeline=pipeline, partition=0, offset=o, value=b"oops",
                                                   error="BadRecord: value is not an integer") for o in range(30)])
        ConsumerRun.objects.bulk_create([ConsumerRun(pipeline=pipeline, epoch=e, host="worker", pid=100 + e,
                                                     assigned_partitions=list(range(partitions))) for e in range(3)])
        ActionLog.objects.bulk_create([ActionLog(pipeline=pipeline, action="restart", actor="bench",
                                                 result="done") for _ in range(10)])
    print(f"filled {pipelines} pipelines x {partitions} partitions in {time.perf_counter() - started:.1f} s")


def measure(client, url: str, repeat: int, **headers) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get(url, **headers)  # warm caches (templates, connection)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        response = client.get(url, **headers)
        times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    with CaptureQueriesContext(connection) as queries:
        client.get(url, **headers)
    times.sort()
    return {"median_ms": statistics.median(times), "p95_ms": times[int(len(times) * 0.95) - 1],
            "queries": len(queries), "bytes": len(response.content)}


def main():
    args = parse_args()
    bench_database.setup_django(args.database_url, fresh=False, debug=None)
    fill(args.pipelines, args.partitions)
    import django
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import setup_test_environment

    setup_test_environment()
    from django.conf import settings

    settings.ALLOWED_HOSTS = ["testserver"]
    from django.contrib.auth.models import Group

    from dashboard.roles import VIEWERS, setup_roles

    setup_roles()   # the pages answer a viewer; a user with no role gets a 403
    user, _ = get_user_model().objects.get_or_create(username="bench")
    user.groups.add(Group.objects.get(name=VIEWERS))
    client = Client()
    client.force_login(user)
    name = "bench-000"
    pages = {
        "overview (full page)": ("/", {}),
        "overview live fragment (htmx)": ("/", {"HTTP_HX_REQUEST": "true"}),
        "pipeline page (full)": (f"/pipelines/{name}/", {}),
        "pipeline live fragment (htmx)": (f"/pipelines/{name}/?fragment=live", {"HTTP_HX_REQUEST": "true"}),
        "API pipeline list": ("/api/pipelines/", {}),
        "API pipeline detail": (f"/api/pipelines/{name}/", {}),
        "/metrics": ("/metrics", {}),
    }
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"Django {django.get_version()}")
    print(f"{args.pipelines} pipelines x {args.partitions} partitions, {args.repeat} requests per page\n")
    print("| page | median ms | p95 ms | queries | response bytes |\n|---|---:|---:|---:|---:|")
    for label, (url, headers) in pages.items():
        result = measure(client, url, args.repeat, **headers)
        print(f"| {label} | {result['median_ms']:.1f} | {result['p95_ms']:.1f} | {result['queries']} | "
              f"{result['bytes']:,} |")
    if args.drop:
        bench_database.drop_database(args.database_url)


if __name__ == "__main__":
    main()
