"""Benchmark: one pipeline with a long history. Not run by CI.

    /path/to/python bench/bench_history.py [--batches 3000000] [--partitions 3] [--repeat 15] [--explain]
        [--compact] [--drop]
    /path/to/python bench/bench_history.py --entries 200000 [--batches 3000]

Uses its own database (default `tally_bench_history`). Fills one exactly-once pipeline with `--batches` ledger
rows as the commit protocol writes them (one row per committed batch and partition, contiguous positions,
committed 10 batches a second, one epoch), in bulk SQL (`INSERT ... SELECT generate_series`), with its
positions and a reconciliation mark at the end (the state after beat has verified everything). Then times,
in-process through Django's test client with DEBUG off:
  - the pipeline page and its JSON API;
  - trace of one record in the middle of the history (the database half: Kafka is a stand-in);
  - the reconcile idle pass (nothing new since the last run; Kafka is a stand-in);
  - the alert pass (every default rule on every pipeline).
`--explain` prints EXPLAIN ANALYZE of every statement slower than 20 ms. `--compact` compacts the ledger
(consumers/reconciliation/compaction.py, the whole history: TALLY_LEDGER_KEEP_DAYS
= 0 here) and measures again. Targets with 3,000,000 rows: page and API
< 300 ms, trace < 100 ms, reconcile idle pass < 50 ms.

`--entries N` measures the history lists instead of the ledger: it fills N action-log entries (a quarter of
them the pipeline's, the rest without a pipeline as group resets and watches leave them, one in 10,000 a
deleted pipeline's deletion), N runs of the pipeline and N of its dead letters, in bulk SQL, then times (median
of 10) the action log page, the action log API, the pipeline's recent dead letters (dashboard.status) and the
admin's runs list, with the history indexes (migrations 0027 and 0028) and without them: they are dropped in a
transaction that is rolled back, so both are measured on the same data.
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

import bench_database  # noqa: E402 - bench/ is on the path as the script's folder

BATCH = 100              # records per batch
BATCHES_PER_SECOND = 10  # across the pipeline's partitions
NAME = "history"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=3_000_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--compact", action="store_true")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_history")
    parser.add_argument("--drop", action="store_true", help="Drop the benchmark database at the end.")
    parser.add_argument("--entries", type=int, default=0,
                        help="Measure the history lists over N action-log entries, runs and dead letters.")
    return parser.parse_args()


class FakeKafka:
    """The Kafka facts reconciliation and trace read: the log ends where the pipeline stands (caught up)."""

    def __init__(self, ends):
        self.ends = ends

    def watermarks(self, topic, partitions=None, cluster=None):
        from consumers.kafka.admin import Watermarks
        return {p: Watermarks(0, e) for p, e in self.ends.items() if partitions is None or p in partitions}

    def committed_offsets(self, group_id, topic, partitions=None, cluster=None):
        return dict(self.ends)

    def record_timestamps(self, topic, offsets, cluster=None):
        return {}

    def partitions_for(self, topic, cluster=None):
        return sorted(self.ends)

    def read_record(self, topic, partition, offset, cluster=None):
        return None

    @property
    def KafkaAdminError(self):  # noqa: N802 - the admin module's name for it
        from consumers.kafka.admin import KafkaAdminError
        return KafkaAdminError


def fill(batches: int, partitions: int) -> dict[int, int]:
    """The pipeline, its sink table, ledger, positions and reconciliation marks; {partition: next_offset}."""
    from django.db import connection
    from django.utils import timezone

    from consumers.engine import sinks
    from consumers.engine.transforms import resolve
    from consumers.models import PartitionHealth, PartitionOffset, Pipeline, PipelineHealth

    per_partition = batches // partitions
    ends = {p: per_partition * BATCH for p in range(partitions)}
    pipeline = Pipeline.objects.filter(name=NAME).first()
    if pipeline is not None and pipeline.ledger.count() >= per_partition * partitions * 0.5:
        return dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))
    Pipeline.objects.filter(name=NAME).delete()
    pipeline = Pipeline.objects.create(name=NAME, topic="history", sink_table="history_sink", epoch=1,
                                       desired_state="running")
    started = time.perf_counter()
    with connection.cursor() as cur:
        sinks.ensure_sink_table(cur, pipeline.sink_table, resolve(pipeline.transform), True)
        # One row per batch and partition, in commit order: batch b of partition p is committed at
        # now - (span - b * partitions / rate), so the newest batch is a moment ago.
        span = per_partition * partitions / BATCHES_PER_SECOND
        cur.execute(
            "INSERT INTO consumers_batchledger (pipeline_id, partition, first_offset, end_offset, records, "
            "rows_written, dead_letters, epoch, committed_at, note) "
            "SELECT %s, p, b * %s, (b + 1) * %s, %s, %s, 0, 1, "
            "now() - make_interval(secs => %s - (b * %s + p)::float8 / %s), '' "
            "FROM generate_series(0, %s - 1) AS b, generate_series(0, %s - 1) AS p ORDER BY b, p",
            [pipeline.pk, BATCH, BATCH, BATCH, BATCH, span, partitions, BATCHES_PER_SECOND, per_partition,
             partitions])
        cur.execute("SELECT partition, max(id) FROM consumers_batchledger WHERE pipeline_id = %s GROUP BY partition",
                    [pipeline.pk])
        newest = dict(cur.fetchall())
        cur.execute("ANALYZE consumers_batchledger")
    now = timezone.now()
    PartitionOffset.objects.bulk_create([PartitionOffset(pipeline=pipeline, partition=p, next_offset=e)
                                         for p, e in ends.items()])
    PartitionHealth.objects.bulk_create([
        PartitionHealth(pipeline=pipeline, partition=p, verified_offset=e, verified_ledger_id=newest[p], log_start=0,
                        high_watermark=e, next_offset=e, kafka_committed=e, lag_records=0, lag_seconds=0.0,
                        checked_at=now) for p, e in ends.items()])
    PipelineHealth.objects.create(pipeline=pipeline, status="OK", lag_records=0, lag_seconds=0.0, checked_at=now)
    print(f"filled {per_partition * partitions:,} ledger rows in {time.perf_counter() - started:.1f} s")
    return ends


def timed(func, repeat: int) -> dict:
    func()  # warm caches (templates, plans, connection)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return {"median_ms": statistics.median(times), "max_ms": times[-1]}


class SlowStatements:
    """Collects statements slower than `threshold_ms` (a Django execute wrapper), to EXPLAIN them afterwards."""

    def __init__(self, threshold_ms=20.0):
        self.threshold_ms, self.found = threshold_ms, {}

    def __call__(self, execute, statement, params, many, context):
        start = time.perf_counter()
        result = execute(statement, params, many, context)
        ms = (time.perf_counter() - start) * 1000
        if ms > self.threshold_ms and statement.lstrip().upper().startswith(("SELECT", "WITH")):
            self.found.setdefault(statement, (ms, params))
        return result


def explain(slow: SlowStatements) -> None:
    from django.db import connection

    for statement, (ms, params) in slow.found.items():
        print(f"\n--- {ms:.0f} ms: {statement[:300]}")
        with connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, params)
            print("\n".join(row[0] for row in cur.fetchall()))


def measure_all(client, ends: dict, repeat: int, label: str) -> dict:
    from unittest import mock

    from alerts.evaluate import evaluate_all
    from consumers.models import Pipeline
    from consumers.reconciliation import reconcile, trace

    kafka = FakeKafka(ends)
    pipeline = Pipeline.objects.get(name=NAME)
    middle = ends[0] // 2 + 17

    def get(url):
        def call():
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)
        return call

    def trace_one():
        with mock.patch.object(trace, "kafka_admin", kafka):
            result = trace.trace(pipeline, 0, middle)
        assert result.batches, "the traced offset has a ledger batch"

    results = {
        "pipeline page": timed(get(f"/pipelines/{NAME}/"), repeat),
        "pipeline API": timed(get(f"/api/pipelines/{NAME}/"), repeat),
        "trace of one record": timed(trace_one, repeat),
        "reconcile idle pass": timed(lambda: reconcile.reconcile_pipeline(pipeline, kafka=kafka), repeat),
        "alert pass": timed(evaluate_all, repeat),
    }
    print(f"\n{label}\n| operation | median ms | max ms |\n|---|---:|---:|")
    for name, result in results.items():
        print(f"| {name} | {result['median_ms']:.1f} | {result['max_ms']:.1f} |")
    return results


def catch_up() -> None:
    """The ledger summary as reconciliation keeps it: folded up to the newest row (a first fold of a ledger
    written before summaries existed takes several reconciliation runs; timed here once)."""
    from consumers.models import Pipeline
    from consumers.reconciliation import ledger_summary

    pipeline = Pipeline.objects.get(name=NAME)
    started, folded, steps = time.perf_counter(), 0, 0
    while (step := ledger_summary.refresh(pipeline.pk)):
        folded, steps = folded + step, steps + 1
    if folded:
        print(f"ledger summary: {folded:,} rows folded in {steps} steps, {time.perf_counter() - started:.1f} s")


def ledger_size() -> tuple[int, int]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT count(*), pg_total_relation_size('consumers_batchledger') FROM consumers_batchledger")
        return cur.fetchone()


HISTORY_INDEXES = ["action_created_idx", "action_deleted_pipeline_idx", "run_started_idx", "dead_letter_recent_idx"]
HISTORY_TABLES = ["consumers_actionlog", "consumers_consumerrun", "consumers_deadletter"]


def fill_history(entries: int, partitions: int) -> None:
    """`entries` action-log entries, runs and dead letters of the pipeline, one a second back from now (kept
    from an earlier run when there are as many)."""
    from django.db import connection
    from psycopg2 import sql

    from consumers.models import ActionLog, ConsumerRun, DeadLetter, Pipeline

    pipeline = Pipeline.objects.get(name=NAME)
    if (ActionLog.objects.count() == entries and ConsumerRun.objects.filter(pipeline=pipeline).count() == entries
            and DeadLetter.objects.filter(pipeline=pipeline).count() == entries):
        return
    started = time.perf_counter()
    ActionLog.objects.all().delete()
    ConsumerRun.objects.filter(pipeline=pipeline).delete()
    DeadLetter.objects.filter(pipeline=pipeline).delete()
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO consumers_actionlog (pipeline_id, group_id, action, actor, params, dry_run, offsets_before, "
            "offsets_after, result, message, created_at, finished_at) "
            "SELECT CASE WHEN i %% 4 = 0 THEN %s END, CASE WHEN i %% 4 = 0 THEN '' ELSE 'group-' || (i %% 50) END, "
            "CASE WHEN i %% 10000 = 1 THEN 'delete' WHEN i %% 4 = 0 THEN 'rewind' ELSE 'reset_group' END, 'bench', "
            "CASE WHEN i %% 10000 = 1 THEN jsonb_build_object('pipeline', 'gone-' || i) ELSE '{}'::jsonb END, "
            "false, '{}', '{}', 'done', '', now() - make_interval(secs => i), now() - make_interval(secs => i) "
            "FROM generate_series(1, %s) AS i", [pipeline.pk, entries])
        cur.execute(
            "INSERT INTO consumers_consumerrun (pipeline_id, epoch, host, pid, task_id, engine, state, "
            "assigned_partitions, claimed_partitions, records_processed, started_at, heartbeat_at, ended_at, "
            "end_reason) "
            "SELECT %s, 1, 'bench', i, '', 'python', 'stopped', '[]', '[]', 1000, now() - make_interval(secs => i), "
            "now() - make_interval(secs => i) + interval '0.5 s', now() - make_interval(secs => i) + interval "
            "'0.5 s', 'stopped by bench' FROM generate_series(1, %s) AS i", [pipeline.pk, entries])
        cur.execute(
            "INSERT INTO consumers_deadletter (pipeline_id, partition, \"offset\", key, value, error, created_at) "
            "SELECT %s, i %% %s, i, NULL, convert_to('{\"id\": ' || i || '}', 'UTF8'), 'bad record', "
            "now() - make_interval(secs => i) FROM generate_series(1, %s) AS i", [pipeline.pk, partitions, entries])
        for table in HISTORY_TABLES:
            cur.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))
    print(f"filled {entries:,} action-log entries, runs and dead letters in {time.perf_counter() - started:.1f} s")


def measure_history(client, repeat: int, label: str) -> dict:
    from consumers.models import Pipeline
    from dashboard import status

    pipeline = Pipeline.objects.get(name=NAME)

    def get(url):
        def call():
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)
        return call

    results = {
        "action log page": timed(get("/action-log/"), repeat),
        "action log API": timed(get("/api/action-log"), repeat),
        "a pipeline's recent dead letters": timed(lambda: status.recent_dead_letters(pipeline), repeat),
        "admin runs list": timed(get("/admin/consumers/consumerrun/"), repeat),
    }
    print(f"\n{label}\n| operation | median ms | max ms |\n|---|---:|---:|")
    for name, result in results.items():
        print(f"| {name} | {result['median_ms']:.1f} | {result['max_ms']:.1f} |")
    return results


def measure_history_both(client, repeat: int, entries: int) -> None:
    """With the history indexes, then without them on the same data: dropped inside a transaction that is
    rolled back, so the database keeps them."""
    from django.db import connection, transaction
    from psycopg2 import sql

    measure_history(client, repeat, f"{entries:,} entries, runs and dead letters: with the history indexes")

    class Rollback(Exception):
        pass

    try:
        with transaction.atomic():
            with connection.cursor() as cur:
                for index in HISTORY_INDEXES:
                    cur.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(index)))
            measure_history(client, repeat, f"{entries:,} entries, runs and dead letters: without them")
            raise Rollback
    except Rollback:
        pass
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_indexes WHERE indexname = ANY(%s)", [HISTORY_INDEXES])
        assert cur.fetchone()[0] == len(HISTORY_INDEXES), "the history indexes are back"


def main():
    args = parse_args()
    bench_database.setup_django(args.database_url, fresh=False)
    ends = fill(args.batches, args.partitions)
    import django
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment

    setup_test_environment()
    settings.ALLOWED_HOSTS = ["testserver"]
    settings.DEBUG = False
    user, _ = get_user_model().objects.get_or_create(username="bench", defaults={"is_superuser": True,
                                                                                  "is_staff": True})
    client = Client()
    client.force_login(user)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"Django {django.get_version()}")
    if args.entries:
        fill_history(args.entries, args.partitions)
        measure_history_both(client, 10, args.entries)
        if args.drop:
            bench_database.drop_database(args.database_url)
        return
    rows, size = ledger_size()
    print(f"ledger: {rows:,} rows, {size / 2**20:.0f} MiB (table and indexes)")
    catch_up()
    slow = SlowStatements()
    with connection.execute_wrapper(slow):
        measure_all(client, ends, args.repeat, f"{rows:,} ledger rows")
    if args.explain:
        explain(slow)
    if args.compact:
        from consumers.reconciliation import compaction

        settings.TALLY_LEDGER_KEEP_DAYS = 0   # the whole history is older than the window here
        started = time.perf_counter()
        report = compaction.compact_all()
        print(f"\ncompacted in {time.perf_counter() - started:.1f} s: {report.as_json()}")
        connection.set_autocommit(True)
        with connection.cursor() as cur:
            cur.execute("VACUUM FULL ANALYZE consumers_batchledger")
        rows, size = ledger_size()
        print(f"ledger: {rows:,} rows, {size / 2**20:.1f} MiB (table and indexes)")
        measure_all(client, ends, args.repeat, f"after compaction: {rows:,} ledger rows")
    if args.drop:
        bench_database.drop_database(args.database_url)


if __name__ == "__main__":
    main()
