"""Run one pipeline on the Spark engine in the foreground (no Celery): `run_spark_pipeline NAME`.

SIGTERM/SIGINT stop it cleanly after the batch in flight; SIGKILL is what chaos tests use.
"""
import json
import signal
import threading
from dataclasses import asdict

from django.core.management.base import BaseCommand, CommandError

from consumers.faults import FaultInjector
from consumers.models import Pipeline


class Command(BaseCommand):
    help = "Run a pipeline on Spark Structured Streaming in the foreground."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--batch-size", type=int, default=None, help="Records per micro-batch at most.")
        parser.add_argument("--delay-ms", type=int, default=0, help="Sleep after each micro-batch (demos).")
        parser.add_argument("--stop-when-caught-up", action="store_true")
        parser.add_argument("--max-seconds", type=float, default=None)
        parser.add_argument("--crash-at", action="append", default=[], metavar="POINT[:PROBABILITY]")
        parser.add_argument("--json", action="store_true", help="Print the run's result as JSON.")

    def handle(self, *args, name, batch_size, delay_ms, stop_when_caught_up, max_seconds, crash_at, **options):
        from consumers.spark.engine import run_pipeline

        if not Pipeline.objects.filter(name=name).exists():
            raise CommandError(f"No pipeline named {name!r}.")
        try:
            faults = FaultInjector.parse(crash_at)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        result = run_pipeline(name, stop=stop, batch_size=batch_size, delay_ms=delay_ms,
                              stop_when_caught_up=stop_when_caught_up, max_seconds=max_seconds, faults=faults)
        if options["json"]:
            self.stdout.write(json.dumps(asdict(result)))
        else:
            self.stdout.write(f"{name}: {result.reason} after {result.seconds:.1f} s, {result.records} records, "
                              f"{result.rows} rows in {result.batches} batches; positions {result.positions}")
        if result.reason == "failed":
            raise CommandError(result.error or "the run failed")
