"""Benchmark of alert evaluation and email delivery. Not run by CI.

    .venv/bin/python bench/bench_alerts.py [--pipelines 500] [--partitions 12] [--incident-share 0.1]

Uses its own database (default `tally_bench_alerts`, created and migrated; its alert tables are emptied
each run; dropped with --drop): N pipelines of P partitions with reconciliation results, a share of them
with lost records, all with a live consumer, and the default global rules. Measures, in one process:
  1. the first evaluation (opens an alert and queues one email per incident pipeline),
  2. a steady-state evaluation (same facts: nothing changes, nothing is queued),
  3. the delivery of the queued emails to a local aiosmtpd server (one SMTP connection per email),
  4. the resolving evaluation after every incident cleared,
with SQL query counts. Target: a steady-state evaluation of 500 pipelines well under the 30 s beat interval.
"""
import argparse
import os
import platform
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--incident-share", type=float, default=0.1)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/tally_bench_alerts")
    parser.add_argument("--drop", action="store_true", help="Drop the benchmark database at the end.")
    return parser.parse_args()


def setup_django(database_url: str):
    import psycopg2
    from psycopg2 import sql

    os.environ["DATABASE_URL"] = database_url
    os.environ["EMAIL_HOST"] = "127.0.0.1"  # the SMTP backend, not the DEBUG console backend
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tally.settings")
    os.environ.setdefault("TALLY_DEVELOPMENT", "1")  # a checkout's bench is development, like manage.py
    url = urlparse(database_url)
    admin = psycopg2.connect(host=url.hostname, port=url.port or 5432, user=url.username or "postgres",
                             dbname="postgres", connect_timeout=10)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", [url.path.lstrip("/")])
        if not cur.fetchone():
            cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(url.path.lstrip("/"))))
    admin.close()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def fill(pipelines: int, partitions: int, incident_share: float) -> list:
    from django.utils import timezone

    from alerts.defaults import ensure_default_rules
    from alerts.models import Alert, Mute
    from consumers.models import ConsumerRun, PartitionHealth, Pipeline, PipelineHealth

    Alert.objects.all().delete()
    Mute.objects.all().delete()
    Pipeline.objects.all().delete()
    ensure_default_rules()
    now = timezone.now()
    incidents = []
    every = max(1, round(1 / incident_share)) if incident_share > 0 else pipelines + 1
    for n in range(pipelines):
        pipeline = Pipeline.objects.create(name=f"bench-{n:04d}", topic=f"t{n}", sink_table=f"s{n}",
                                           desired_state="running")
        ConsumerRun.objects.create(pipeline=pipeline, epoch=1, host="bench", pid=n + 1, state="running",
                                   heartbeat_at=now + timezone.timedelta(hours=1))
        lost = n % every == 0
        PartitionHealth.objects.bulk_create([
            PartitionHealth(pipeline=pipeline, partition=p, next_offset=1000, high_watermark=1000, lag_records=0,
                            lost=10 if lost and p == 0 else 0,
                            findings=[{"kind": "lost", "start": 100, "end": 110, "count": 10}] if lost and p == 0
                            else [], checked_at=now)
            for p in range(partitions)])
        PipelineHealth.objects.create(pipeline=pipeline, lost=10 if lost else 0, checked_at=now)
        if lost:
            incidents.append(pipeline.pk)
    return incidents


def timed(label, function, *args, **kwargs):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    connection.queries_log.clear()  # the log keeps 9000 queries; counts are per step
    with CaptureQueriesContext(connection) as queries:
        started = time.perf_counter()
        result = function(*args, **kwargs)
        seconds = time.perf_counter() - started
    print(f"{label:<34} {seconds * 1000:9.0f} ms  {len(queries):6d} queries")
    return result, seconds


def main():
    args = parse_args()
    setup_django(args.database_url)
    from aiosmtpd.controller import Controller
    from django.conf import settings
    from django.utils import timezone

    from alerts.evaluate import evaluate_all
    from alerts.outbox import deliver_due
    from consumers.kafka.broker import free_port
    from consumers.models import PartitionHealth, PipelineHealth

    class Sink:
        received = 0

        async def handle_DATA(self, server, session, envelope):
            Sink.received += 1
            return "250 OK"

    port = free_port()
    controller = Controller(Sink(), hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.ALERT_RECIPIENTS = ["oncall@example.com"]

    started = time.perf_counter()
    incidents = fill(args.pipelines, args.partitions, args.incident_share)
    print(f"filled {args.pipelines} pipelines x {args.partitions} partitions, {len(incidents)} with lost records "
          f"in {time.perf_counter() - started:.1f} s")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{platform.platform()}")
    now = timezone.now()
    report, first = timed("evaluate: first (alerts open)", evaluate_all, now=now)
    _, steady = timed("evaluate: steady state", evaluate_all, now=now + timezone.timedelta(seconds=30))
    sent, deliver_s = timed("deliver: emails to SMTP", deliver_due, now=now + timezone.timedelta(seconds=30),
                            limit=10_000)
    PartitionHealth.objects.filter(pipeline_id__in=incidents).update(lost=0, findings=[])
    PipelineHealth.objects.filter(pipeline_id__in=incidents).update(lost=0)
    resolved, _ = timed("evaluate: resolving", evaluate_all, now=now + timezone.timedelta(seconds=60))
    timed("deliver: resolve emails", deliver_due, now=now + timezone.timedelta(seconds=60), limit=10_000)
    controller.stop()
    print(f"fired {len(report.fired)}, resolved {len(resolved.resolved)}, SMTP received {Sink.received}")
    print(f"steady state per pipeline: {steady / args.pipelines * 1000:.2f} ms; "
          f"first/steady ratio {first / steady:.1f}; emails per second {sent['sent'] / deliver_s:.0f}")
    if args.drop:
        from django.db import connection

        connection.close()
        import psycopg2
        from psycopg2 import sql

        url = urlparse(args.database_url)
        admin = psycopg2.connect(host=url.hostname, port=url.port or 5432, user=url.username or "postgres",
                                 dbname="postgres", connect_timeout=10)
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(url.path.lstrip("/"))))
        admin.close()


if __name__ == "__main__":
    main()
