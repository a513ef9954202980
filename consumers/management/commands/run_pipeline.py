"""Run one pipeline in the foreground (no Celery) with its engine: kafka-python or Spark."""
import argparse
import json
import signal
import threading
from dataclasses import asdict

from django.conf import settings
from django.core.management.base import CommandError

from consumers.engine import gc_tuning
from consumers.engine.faults import POINTS, FaultInjector
from consumers.engine.lifecycle import UnknownPipeline
from consumers.engine.options import RunOptions, engine_for
from consumers.engine.processes import combined_busy_seconds, run_in_processes
from consumers.management.cli import TallyCommand, refused
from consumers.models import Engine, Pipeline


class Command(TallyCommand):
    help = "Run a pipeline in the foreground until stopped (SIGTERM/Ctrl-C), fenced or caught up."
    exit_codes = ("0 the run ended as asked (stopped, caught up, time limit), 1 it failed, was fenced or refused, "
                  "2 usage error")
    # A worker: restarted often (chaos, demo), and it must not depend on URL or admin modules loading.
    requires_system_checks = []
    engine_override = None  # run_spark_pipeline sets "spark"

    def add_arguments(self, parser):
        parser.add_argument("name", help="The pipeline's name.")
        if self.engine_override is None:
            parser.add_argument("--engine", choices=Engine.values, default=None,
                                help="Run with this engine instead of the pipeline's own.")
        parser.add_argument("--batch-size", type=int, default=None, help="Records per poll (default: the pipeline's).")
        parser.add_argument("--delay-ms", type=int, default=0, help="Sleep per record: simulates slow processing.")
        parser.add_argument("--stop-when-caught-up", action="store_true",
                            help="Exit 0 once every partition of the topic (also those other or dead members hold) "
                                 "has its stored position at the log end.")
        parser.add_argument("--max-seconds", type=float, default=None, help="Stop after this many seconds.")
        parser.add_argument("--crash-at", action="append", default=[], metavar="POINT[:PROBABILITY]",
                            help=f"Kill this process (SIGKILL) at a fault point; repeatable or comma-separated. "
                                 f"POINT@N/stop stops it (SIGSTOP) at the N-th pass instead, until SIGCONT. "
                                 f"Points: {', '.join(POINTS)}.")
        parser.add_argument("--crash-in-worker", action="store_true",
                            help="Spark: --crash-at kills the committing executor task's Python worker, not the driver "
                                 "(POINT@N counts batch attempts, task retries included; Spark retries the task).")
        parser.add_argument("--json", action="store_true", help="Print the run's result as JSON.")
        parser.add_argument("--processes", type=int, default=1,
                            help="Python engine: run the pipeline in this many processes at once, which split its "
                                 "partitions (one core each; see docs/benchmarks.md). Exits 1 if any of them fails.")
        parser.add_argument("--peers", type=int, default=0, help=argparse.SUPPRESS)  # set by --processes

    def run_from_argv(self, argv):
        # A process of its own (not call_command inside another program): its collector is tuned for runs.
        gc_tuning.tune_for_engine()
        super().run_from_argv(argv)

    def handle(self, *args, name, batch_size, delay_ms, stop_when_caught_up, max_seconds, crash_at, **options):
        if batch_size is not None and batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        if delay_ms < 0:
            raise CommandError("--delay-ms must not be negative.")
        if max_seconds is not None and not max_seconds > 0:   # `not >` also refuses nan
            raise CommandError("--max-seconds must be more than 0.")
        try:
            faults = FaultInjector.parse([spec for item in crash_at for spec in item.split(",") if spec],
                                         in_worker=options["crash_in_worker"])
        except ValueError as exc:
            raise CommandError(f"--crash-at: {exc}") from exc
        engine = self.engine_override or options.get("engine")
        if engine is None:
            engine = Pipeline.objects.filter(name=name).values_list("engine", flat=True).first() or Engine.PYTHON
        processes, peers = options["processes"], options["peers"]
        if processes < 1:
            raise CommandError("--processes must be at least 1.")
        if processes > settings.TALLY_MAX_RUNS_PER_PIPELINE:   # as many runs as a pipeline may have, no more
            raise CommandError(f"--processes is at most {settings.TALLY_MAX_RUNS_PER_PIPELINE} "
                               f"(TALLY_MAX_RUNS_PER_PIPELINE), got {processes}.")
        if processes > 1 or peers:
            if engine != Engine.PYTHON:
                raise CommandError("--processes is for the Python engine; Spark spreads a run over its executors.")
            if not Pipeline.objects.filter(name=name).exists():
                raise refused(f"No pipeline named {name!r}.")
        if processes > 1:
            return self._run_in_processes(name, processes, batch_size=batch_size, delay_ms=delay_ms,
                                          stop_when_caught_up=stop_when_caught_up, max_seconds=max_seconds,
                                          crash_at=crash_at, as_json=options["json"])
        stop = threading.Event()

        def request_stop(signum, frame):
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        try:
            result = engine_for(engine)(name, RunOptions(
                stop=stop, batch_size=batch_size, delay_ms=delay_ms, stop_when_caught_up=stop_when_caught_up,
                max_seconds=max_seconds, faults=faults, peers=peers or 0))
        except UnknownPipeline as exc:
            raise refused(str(exc)) from exc
        if options["json"]:
            self.stdout.write(json.dumps(asdict(result), default=str))
        summary = _summary(name, asdict(result))
        if not result.ok:
            raise CommandError(f"{summary}: {result.detail}")
        if not options["json"]:
            self.stdout.write(summary)

    def _run_in_processes(self, name, processes, *, batch_size, delay_ms, stop_when_caught_up, max_seconds,
                          crash_at, as_json):
        run_args = ["--engine", Engine.PYTHON, "--delay-ms", str(delay_ms)]
        run_args += ["--batch-size", str(batch_size)] if batch_size is not None else []
        run_args += ["--stop-when-caught-up"] if stop_when_caught_up else []
        run_args += ["--max-seconds", str(max_seconds)] if max_seconds is not None else []
        run_args += [arg for spec in crash_at for arg in ("--crash-at", spec)]
        outcomes = run_in_processes(name, processes, run_args)
        results = [outcome.result for outcome in outcomes if outcome.result]
        if as_json:
            self.stdout.write(json.dumps({"runs": results, "busy_seconds": combined_busy_seconds(results)}))
        else:
            for outcome in outcomes:
                self.stdout.write(_summary(name, outcome.result) if outcome.result
                                  else f"{name}: a process exited {outcome.exit_code} without a result")
        failed = [outcome for outcome in outcomes if outcome.exit_code != 0]
        if failed:
            raise CommandError(f"{len(failed)} of {processes} processes failed: "
                               + "; ".join(outcome.error or f"exit {outcome.exit_code}" for outcome in failed))


def _summary(name: str, result: dict) -> str:
    return (f"{name}: {result['reason']} after {result['records']} records in {result['batches']} batches "
            f"({result['rows_written']} rows, {result['dead_letters']} dead letters, "
            f"{result['skipped']} replays skipped)")
