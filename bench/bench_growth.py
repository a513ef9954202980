"""Growth benchmark: N days of P pipelines, then compaction. Not run by CI.

    /path/to/python bench/bench_growth.py [--pipelines 10] [--days 30] [--rate 1.0] [--partitions 3] [--drop]

Uses its own database (default `tally_bench_growth`). Writes, for each pipeline, `days * 86400 * rate` ledger rows
as the commit protocol writes them (one row per committed batch, batches round-robin over the partitions,
contiguous positions, 100 records a batch, the pipelines' commits interleaved in time as on a live installation),
in bulk SQL (see `fill` for what is bulk and what is written on every index), with an everyday history on top: a
restart every day (a new epoch) and a batch with a dead letter every hour. The state after reconciliation has
verified everything (positions, marks, ledger summaries). Then measures, with DEBUG off: the database and ledger
size, the pipeline page and its API, trace of one record, the reconcile idle pass and the alert pass; compacts
the ledger (everything older than TALLY_LEDGER_KEEP_DAYS = 7), reclaims the space (VACUUM FULL of the ledger) and
measures again. Reports rows and bytes per pipeline per day after compaction.

The full size (10 pipelines, 30 days, 1 batch/s: 25,920,000 rows) needs ~10 GB and about 20 minutes of fill on a
2-core machine (most of it building the GiST range index); `--rate` scales it down (0.1: 2,592,000 rows) with the
same shape. A fill interrupted after it finished is reused by the next run on the same database.
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


# One row per batch, every pipeline's batch b in one statement, in commit order (b, then pipeline): the ids
# interleave across pipelines as the engine's commits do. Batch b goes to partition b % P as its (b // P)-th batch;
# it is committed at base + b / rate, so the newest is a moment ago.
_LEDGER_SQL = (
    "INSERT INTO consumers_batchledger (pipeline_id, partition, first_offset, end_offset, records, rows_written, "
    "dead_letters, epoch, committed_at, note, batches) "
    "SELECT pipelines.id, b %% %(parts)s, (b / %(parts)s) * %(batch)s, (b / %(parts)s + 1) * %(batch)s, %(batch)s, "
    "%(batch)s - (b %% %(per_hour)s = 0)::int, (b %% %(per_hour)s = 0)::int, 1 + b / %(per_day)s, "
    "%(base)s::timestamptz + make_interval(secs => b / %(rate)s), '', 1 "
    "FROM generate_series(%(low)s, %(high)s - 1) AS b, unnest(%(pipelines)s::bigint[]) "
    "WITH ORDINALITY AS pipelines(id, n) ORDER BY b, pipelines.n")
RECENT_DAYS = 1       # written with every index in place, as the engine writes it
OLD_STEP_DAYS = 1     # batches of history per statement when written without indexes
RECENT_STEP_S = 60    # seconds of commits per statement in the recent part


def _write(cur, pipelines: list[int], args, base, low: int, high: int, step: int) -> None:
    params = {"parts": args.partitions, "batch": BATCH, "per_hour": max(1, int(3600 * args.rate)),
              "per_day": max(1, int(86400 * args.rate)), "base": base, "rate": args.rate, "pipelines": pipelines}
    for first in range(low, high, step):
        cur.execute(_LEDGER_SQL, {**params, "low": first, "high": min(first + step, high)})


def fill(args) -> dict[str, dict[int, int]]:
    """The ledger of every pipeline, then its positions and reconciliation marks; {name: {partition: end}}.

    Fast and still the engine's write shape where it is measured: the history older than RECENT_DAYS is written
    in day-long statements into the ledger without its secondary indexes and without the foreign-key trigger
    (every row names an existing pipeline), the indexes are then built (CREATE INDEX, from the model's own
    definitions), and the last RECENT_DAYS are written on top of every index, in commit order, one statement per
    RECENT_STEP_S seconds of commits. The rows are the same either way; only how the history's index pages were
    built differs (a built index is denser than one grown by inserts: the 'before' sizes are slightly low)."""
    from datetime import timedelta

    from django.db import connection, transaction
    from django.utils import timezone

    from consumers.engine import sinks
    from consumers.engine.transforms import resolve
    from consumers.models import BatchLedger, PartitionHealth, PartitionOffset, Pipeline, PipelineHealth

    batches = int(args.days * 86400 * args.rate)
    names = [f"growth-{i:02d}" for i in range(args.pipelines)]
    done = Pipeline.objects.filter(name__in=names, health__isnull=False)
    if done.count() == args.pipelines and BatchLedger.objects.count() == batches * args.pipelines:
        return {p.name: dict(p.offsets.values_list("partition", "next_offset")) for p in done}
    with connection.cursor() as cur:   # an interrupted fill: start again (TRUNCATE: no slow delete of millions)
        cur.execute("TRUNCATE consumers_batchledger, consumers_ledgersummary")
    Pipeline.objects.filter(name__in=names).delete()
    pipelines = [Pipeline.objects.create(name=name, topic=name, sink_table=name.replace("-", "_") + "_sink",
                                         epoch=args.days, desired_state="running").pk for name in names]
    with connection.cursor() as cur:   # empty sink tables: the idle pass checks them, as on a live installation
        for pipeline in Pipeline.objects.filter(pk__in=pipelines):
            sinks.ensure_sink_table(cur, pipeline.sink_table, resolve(pipeline.transform), True)
    base = timezone.now() - timedelta(seconds=args.days * 86400)
    recent = max(0, batches - int(RECENT_DAYS * 86400 * args.rate))
    indexes = BatchLedger._meta.indexes
    started = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute("SET synchronous_commit = off")
        cur.execute("SET maintenance_work_mem = '512MB'")
        cur.execute("SET work_mem = '256MB'")   # the commit-order sort of a day of batches
        with connection.schema_editor(atomic=False) as editor:
            for index in indexes:
                editor.remove_index(BatchLedger, index)
        cur.execute("SET session_replication_role = replica")   # no FK trigger per row (bulk history only)
        _write(cur, pipelines, args, base, 0, recent, int(OLD_STEP_DAYS * 86400 * args.rate))
        cur.execute("SET session_replication_role = DEFAULT")
        print(f"  history: {recent * args.pipelines:,} rows in {time.perf_counter() - started:.0f} s", flush=True)
        started = time.perf_counter()
        with connection.schema_editor(atomic=False) as editor:
            for index in indexes:
                editor.add_index(BatchLedger, index)
        print(f"  indexes built in {time.perf_counter() - started:.0f} s", flush=True)
        started = time.perf_counter()
        _write(cur, pipelines, args, base, recent, batches, max(1, int(RECENT_STEP_S * args.rate)))
        print(f"  last {RECENT_DAYS} day(s): {(batches - recent) * args.pipelines:,} rows on every index in "
              f"{time.perf_counter() - started:.0f} s", flush=True)
        cur.execute("SELECT pipeline_id, partition, max(end_offset), max(id) FROM consumers_batchledger "
                    "GROUP BY pipeline_id, partition")
        found = cur.fetchall()
        cur.execute("ANALYZE consumers_batchledger")
        cur.execute("SET synchronous_commit = DEFAULT")
    now = timezone.now()
    with transaction.atomic():
        PartitionOffset.objects.bulk_create([PartitionOffset(pipeline_id=pk, partition=p, next_offset=e)
                                             for pk, p, e, _ in found])
        PartitionHealth.objects.bulk_create([
            PartitionHealth(pipeline_id=pk, partition=p, verified_offset=e, verified_ledger_id=newest, log_start=0,
                            high_watermark=e, next_offset=e, kafka_committed=e, lag_records=0, lag_seconds=0.0,
                            checked_at=now) for pk, p, e, newest in found])
        PipelineHealth.objects.bulk_create([PipelineHealth(pipeline_id=pk, status="OK", lag_records=0,
                                                           lag_seconds=0.0, checked_at=now) for pk in pipelines])
    by_pk = dict(zip(pipelines, names, strict=True))
    ends_by_pipeline = {name: {} for name in names}
    for pk, p, e, _ in found:
        ends_by_pipeline[by_pk[pk]][p] = e
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


def split_at(cutoff) -> tuple[int, int, float]:
    """(rows committed before `cutoff`: the compacted history, rows of the kept-whole window, days of history).
    Counted, not derived from the settings: the window starts where compaction's clock put it."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FILTER (WHERE committed_at < %s), count(*) FILTER (WHERE committed_at >= %s), "
                    "extract(epoch FROM %s - min(COALESCE(first_committed_at, committed_at))) / 86400 "
                    "FROM consumers_batchledger", [cutoff, cutoff, cutoff])
        history, window, days = cur.fetchone()
    return history, window, float(days)


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


def vacuum_full(database_url: str, since, wait_s: float = 600) -> float:
    """Give the space compaction freed back (on a connection of its own: VACUUM runs outside a transaction);
    returns the seconds spent waiting for it to be able to. A transaction open anywhere on the server since
    before compaction ended (other databases count: a snapshot's horizon is the oldest running transaction id
    of the whole server) keeps every merged row 'recently dead', and VACUUM FULL would copy them all: so
    Django's connections are closed, and the vacuum waits (at most wait_s) until no such transaction is left."""
    import psycopg2
    from django.db import connections

    connections.close_all()
    url = urlparse(database_url)
    conn = psycopg2.connect(host=url.hostname, port=url.port or 5432, user=url.username or "postgres",
                            dbname=url.path.lstrip("/"))
    conn.autocommit = True
    started = time.monotonic()
    with conn.cursor() as cur:
        while time.monotonic() - started < wait_s:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND xact_start < %s "
                        "AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)", [since])
            if not cur.fetchone()[0]:
                break
            time.sleep(1)   # a bench, not a test: other sessions' transactions end on their own time
        waited = time.monotonic() - started
        cur.execute("VACUUM FULL ANALYZE consumers_batchledger")
    conn.close()
    return waited


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main():
    args = parse_args()
    setup_django(args.database_url)
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.utils import timezone

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
    compacted_at = timezone.now()
    report = compaction.compact_all(now=compacted_at)
    compact_s = time.perf_counter() - started
    waited = vacuum_full(args.database_url, timezone.now())
    print(f"VACUUM FULL after {waited:.0f} s waiting for older transactions on the server", flush=True)
    after = sizes()
    history_rows, window_rows, history_days = split_at(compacted_at - compaction.keep_whole_for())
    timings_after = measure(client, ends, args.repeat)

    days_kept = settings.TALLY_LEDGER_KEEP_DAYS
    per_pipeline_rows = after["rows"] / args.pipelines
    bytes_per_row = after["ledger"] / max(after["rows"], 1)
    window_rows /= args.pipelines
    compacted_rows_per_day = history_rows / args.pipelines / max(history_days, 1e-9)
    print(f"\ncompaction: {report.rows_merged:,} rows merged into {report.runs:,} in {report.steps:,} steps, "
          f"{compact_s:.0f} s ({report.rows_merged / max(compact_s, 1e-9):,.0f} rows/s)")
    print("\n| | before compaction | after compaction |\n|---|---:|---:|")
    print(f"| ledger rows | {before['rows']:,} | {after['rows']:,} |")
    print(f"| ledger table + indexes | {mib(before['ledger'])} | {mib(after['ledger'])} |")
    print(f"| database | {mib(before['database'])} | {mib(after['database'])} |")
    for name in timings_before:
        print(f"| {name} (median ms) | {timings_before[name]:.1f} | {timings_after[name]:.1f} |")
    print(f"\nper pipeline after compaction: {per_pipeline_rows:,.0f} rows ({window_rows:,.0f} of the last "
          f"{days_kept} days kept whole, {history_rows / args.pipelines:,.0f} for {history_days:.2f} days of "
          f"compacted history); compacted history grows by {compacted_rows_per_day:,.1f} rows a day "
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
