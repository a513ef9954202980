"""Run one pipeline on the Spark engine in the foreground (no Celery): `run_spark_pipeline NAME`.

SIGTERM/SIGINT stop it cleanly after the batch in flight; SIGKILL is what chaos tests use.
"""
import json
import signal
import threading
from dataclasses import asdict

from django.core.management.base import BaseCommand, CommandError

from consumers.engine import UnknownPipeline
from consumers.faults import FaultInjector


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

        try:
            faults = FaultInjector.parse([spec for item in crash_at for spec in item.split(",") if spec])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        try:
            result = run_pipeline(name, stop=stop, batch_size=batch_size, delay_ms=delay_ms,
                                  stop_when_caught_up=stop_when_caught_up, max_seconds=max_seconds, faults=faults)
        except UnknownPipeline as exc:
            raise CommandError(str(exc)) from exc
        if options["json"]:
            self.stdout.write(json.dumps(asdict(result)))
        else:
            self.stdout.write(f"{name}: {result.reason} after {result.records} records in {result.batches} batches "
                              f"({result.rows_written} rows, {result.dead_letters} dead letters, "
                              f"{result.skipped} replays skipped)")
        if not result.ok:
            raise CommandError(f"{result.reason}: {result.detail}")
