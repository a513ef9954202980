"""Run one pipeline in the foreground with the kafka-python engine (no Celery)."""
import signal
import threading

from django.core.management.base import BaseCommand, CommandError

from consumers.engine import UnknownPipeline, run_pipeline
from consumers.faults import POINTS, FaultInjector


class Command(BaseCommand):
    help = "Run a pipeline in the foreground until stopped (SIGTERM/Ctrl-C), fenced or caught up."
    # A worker: restarted often (chaos, demo), and it must not depend on URL or admin modules loading.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("name", help="The pipeline's name.")
        parser.add_argument("--batch-size", type=int, default=None, help="Records per poll (default: the pipeline's).")
        parser.add_argument("--delay-ms", type=int, default=0, help="Sleep per record: simulates slow processing.")
        parser.add_argument("--stop-when-caught-up", action="store_true",
                            help="Exit 0 once every assigned partition's lag is 0.")
        parser.add_argument("--max-seconds", type=float, default=None, help="Stop after this many seconds.")
        parser.add_argument("--crash-at", action="append", default=[], metavar="POINT[:PROBABILITY]",
                            help=f"Kill this process (SIGKILL) at a fault point; repeatable or comma-separated. "
                                 f"Points: {', '.join(POINTS)}.")

    def handle(self, *args, name, batch_size, delay_ms, stop_when_caught_up, max_seconds, crash_at, **options):
        if batch_size is not None and batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        if delay_ms < 0:
            raise CommandError("--delay-ms must not be negative.")
        try:
            faults = FaultInjector.parse([spec for item in crash_at for spec in item.split(",") if spec])
        except ValueError as exc:
            raise CommandError(f"--crash-at: {exc}") from exc
        stop = threading.Event()

        def request_stop(signum, frame):
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        try:
            result = run_pipeline(name, stop=stop, batch_size=batch_size, delay_ms=delay_ms,
                                  stop_when_caught_up=stop_when_caught_up, max_seconds=max_seconds, faults=faults)
        except UnknownPipeline as exc:
            raise CommandError(str(exc)) from exc
        summary = (f"{name}: {result.reason} after {result.records} records in {result.batches} batches "
                   f"({result.rows_written} rows, {result.dead_letters} dead letters, "
                   f"{result.skipped} replays skipped)")
        if not result.ok:
            raise CommandError(f"{summary}: {result.detail}")
        self.stdout.write(summary)
