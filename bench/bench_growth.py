"""Growth benchmark: N days of P pipelines, then compaction. Not run by CI.

    /path/to/python bench/bench_growth.py [--pipelines 10] [--days 30] [--rate 1.0] [--partitions 3] [--drop]

Uses its own database (default `tally_bench_growth`). Writes, for each pipeline, `days * 86400 * rate` ledger rows
as the commit protocol writes them (one row per committed batch, batches round-robin over the partitions,
contiguous positions, 100 records a batch), in bulk SQL, with an everyday history on top: a restart every day (a
new epoch) and a batch with a dead letter every hour. The state after reconciliation has verified everything
(positions, marks, ledger summaries). Then measures, with DEBUG off: the database and ledger size, the pipeline
page and its API, trace of one record, the reconcile idle pass and the alert pass; compacts the ledger
(everything older than TALLY_LEDGER_KEEP_DAYS = 7), reclaims the space (VACUUM FULL of the ledger) and measures
again. Reports rows and bytes per pipeline per day after compaction.

The full size (10 pipelines, 30 days, 1 batch/s: 25,920,000 rows) needs ~10 GB and long bulk writes; `--rate`
scales it down (0.1: 2,592,000 rows) with the same shape, and the report extrapolates.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.bench_history import FakeKafka, admin_connection, setup_django  # noqa: E402

BATCH = 100


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", type=int, default=10)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--rate", type=float, default=1.0, help="Batches per second per pipeline.")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_growth")
    parser.add_argument("--drop", action="store_true")
    return parser.parse_args()


def fill(args) -> dict[str, dict[int, int]]:
    from django.db import connection
    from django.utils import timezone

    from consumers.models import PartitionHealth, PartitionOffset, Pipeline, PipelineHealth

    batches = int(args.days * 86400 * args.rate)
    per_hour = max(1, int(3600 * args.rate))
    per_day = max(1, int(86400 * args.rate))
    ends_by_pipeline = {}
    for i in range(args.pipelines):
        started = time.perf_counter()
        name = f"growth-{i:02d}"
        done = Pipeline.objects.filter(name=name, health__isnull=False).first()
        if done is not None and done.ledger.count() == batches:   # filled by an earlier, interrupted run
            ends_by_pipeline[name] = dict(done.offsets.values_list("partition", "next_offset"))
            continue
        Pipeline.objects.filter(name=name).delete()
        pipeline = Pipeline.objects.create(name=f"growth-{i:02d}", topic=f"growth-{i:02d}",
                                           sink_table=f"growth_sink_{i:02d}", epoch=args.days, desired_state="running")
        with connection.cursor() as cur:
            # Batch b goes to partition b % P as its (b // P)-th batch; committed at now - days + b / rate.
            cur.execute(
                "INSERT INTO consumers_batchledger (pipeline_id, partition, first_offset, end_offset, records, "
                "rows_written, dead_letters, epoch, committed_at, note, batches) "
                "SELECT %(pipeline)s, b %% %(parts)s, (b / %(parts)s) * %(batch)s, (b / %(parts)s + 1) * %(batch)s, "
                "%(batch)s, %(batch)s - (b %% %(per_hour)s = 0)::int, (b %% %(per_hour)s = 0)::int, "
                "1 + b / %(per_day)s, now() - make_interval(secs => %(span)s - b / %(rate)s), '', 1 "
                "FROM generate_series(0, %(n)s - 1) AS b ORDER BY b",
                {"pipeline": pipeline.pk, "parts": args.partitions, "batch": BATCH, "per_hour": per_hour,
                 "per_day": per_day, "span": args.days * 86400, "rate": args.rate, "n": batches})
            cur.execute("SELECT partition, max(end_offset), max(id) FROM consumers_batchledger WHERE pipeline_id = %s "
                        "GROUP BY partition", [pipeline.pk])
            found = {p: (end, newest) for p, end, newest in cur.fetchall()}
        now = timezone.now()
        PartitionOffset.objects.bulk_create([PartitionOffset(pipeline=pipeline, partition=p, next_offset=e)
                                             for p, (e, _) in found.items()])
        PartitionHealth.objects.bulk_create([
            PartitionHealth(pipeline=pipeline, partition=p, verified_offset=e, verified_ledger_id=newest,
                            log_start=0, high_watermark=e, next_offset=e, kafka_committed=e, lag_records=0,
                            lag_seconds=0.0, checked_at=now) for p, (e, newest) in found.items()])
        PipelineHealth.objects.create(pipeline=pipeline, status="OK", lag_records=0, lag_seconds=0.0, checked_at=now)
        ends_by_pipeline[pipeline.name] = {p: e for p, (e, _) in found.items()}
        print(f"  {pipeline.name}: {batches:,} ledger rows in {time.perf_counter() - started:.1f} s", flush=True)
    with connection.cursor() as cur:
        cur.execute("ANALYZE consumers_batchledger")
    return ends_by_pipeline


def summaries() -> float:
    from consumers.models import Pipeline
    from consumers.reconciliation import ledger_summary

    started = time.perf_counter()
    for pipeline in Pipeline.objects.all():
        while ledger_summary.refresh(pipeline.pk):
            pass
    return time.perf_counter() - started


def sizes() -> dict:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_database_size(current_database()), pg_total_relation_size('consumers_batchledger'), "
                    "(SELECT count(*) FROM consumers_batchledger)")
        database, ledger, rows = cur.fetchone()
    return {"database": database, "ledger": ledger, "rows": rows}


def median_ms(func, repeat: int) -> float:
    func()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure(client, ends_by_pipeline: dict, repeat: int) -> dict:
    from unittest import mock

    from alerts.evaluate import evaluate_all
    from consumers.models import Pipeline
    from consumers.reconciliation import reconcile, trace

    name = sorted(ends_by_pipeline)[0]
    pipeline = Pipeline.objects.get(name=name)
    kafka = FakeKafka(ends_by_pipeline[name])
    middle = ends_by_pipeline[name][0] // 3 + 17   # in the compacted part of the history

    def get(url):
        return lambda: client.get(url).status_code == 200 or sys.exit(f"{url} failed")

    def trace_one():
        with mock.patch.object(trace, "kafka_admin", kafka):
            assert trace.trace(pipeline, 0, middle).batches

    def reconcile_all():
        for other in Pipeline.objects.all():
            reconcile.reconcile_pipeline(other, kafka=FakeKafka(ends_by_pipeline[other.name]))

    return {"pipeline page": median_ms(get(f"/pipelines/{name}/"), repeat),
            "pipeline API": median_ms(get(f"/api/pipelines/{name}/"), repeat),
            "overview": median_ms(get("/"), repeat),
            "trace of one record": median_ms(trace_one, repeat),
            "reconcile idle pass, one pipeline": median_ms(lambda: reconcile.reconcile_pipeline(pipeline, kafka=kafka),
                                                           repeat),
            "reconcile idle pass, all pipelines": median_ms(reconcile_all, max(3, repeat // 3)),
            "alert pass, all pipelines": median_ms(evaluate_all, repeat)}


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main():
    args = parse_args()
    setup_django(args.database_url)
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment

    from consumers.reconciliation import compaction

    setup_test_environment()
    settings.ALLOWED_HOSTS = ["testserver"]
    settings.DEBUG = False
    user, _ = get_user_model().objects.get_or_create(username="bench", defaults={"is_superuser": True,
                                                                                  "is_staff": True})
    client = Client()
    client.force_login(user)
    print(f"{args.pipelines} pipelines x {args.days} days x {args.rate} batch/s, {args.partitions} partitions each")
    started = time.perf_counter()
    ends = fill(args)
    print(f"filled in {time.perf_counter() - started:.0f} s; ledger summaries folded in {summaries():.0f} s")
    before = sizes()
    timings_before = measure(client, ends, args.repeat)
    started = time.perf_counter()
    report = compaction.compact_all()
    compact_s = time.perf_counter() - started
    connection.ensure_connection()
    old_autocommit = connection.get_autocommit()
    connection.set_autocommit(True)
    with connection.cursor() as cur:
        cur.execute("VACUUM FULL ANALYZE consumers_batchledger")
    connection.set_autocommit(old_autocommit)
    after = sizes()
    timings_after = measure(client, ends, args.repeat)

    days_kept = settings.TALLY_LEDGER_KEEP_DAYS
    per_pipeline_rows = after["rows"] / args.pipelines
    bytes_per_row = after["ledger"] / max(after["rows"], 1)
    window_rows = days_kept * 86400 * args.rate
    compacted_rows_per_day = (per_pipeline_rows - window_rows) / max(args.days - days_kept, 1)
    print(f"\ncompaction: {report.rows_merged:,} rows merged into {report.runs:,} in {report.steps:,} steps, "
          f"{compact_s:.0f} s ({report.rows_merged / max(compact_s, 1e-9):,.0f} rows/s)")
    print("\n| | before compaction | after compaction |\n|---|---:|---:|")
    print(f"| ledger rows | {before['rows']:,} | {after['rows']:,} |")
    print(f"| ledger table + indexes | {mib(before['ledger'])} | {mib(after['ledger'])} |")
    print(f"| database | {mib(before['database'])} | {mib(after['database'])} |")
    for name in timings_before:
        print(f"| {name} (median ms) | {timings_before[name]:.1f} | {timings_after[name]:.1f} |")
    print(f"\nper pipeline after compaction: {per_pipeline_rows:,.0f} rows ({window_rows:,.0f} of the last "
          f"{days_kept} days kept whole); compacted history grows by {compacted_rows_per_day:,.1f} rows a day "
          f"(~{compacted_rows_per_day * bytes_per_row / 1024:,.1f} KiB/day at {bytes_per_row:.0f} bytes per row "
          f"with indexes); the window holds {window_rows * bytes_per_row / 2**20:,.1f} MiB")
    if args.drop:
        from django.db import connections
        from psycopg2 import sql

        connections.close_all()
        url = urlparse(args.database_url)
        admin = admin_connection(url)
        with admin.cursor() as cur:
            cur.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(url.path.lstrip("/"))))
        admin.close()


if __name__ == "__main__":
    main()
