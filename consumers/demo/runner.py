"""The demo's pipelines run side by side, killed where their crash schedules say and started again.

- kafka-python pipelines: one `run_pipeline` process per crash, forked from a fork server with Django
  loaded (consumers/demo/forks.py). A process kills itself (SIGKILL) at its `--crash-at POINT@N` fault,
  the runner starts the next one, and the last runs until caught up.
- the Spark pipeline: one run for the whole demo, in a thread of this process, on this process's
  SparkSession. Its crashes SIGKILL the Python worker of the executor task that is committing (Spark
  retries the task, consumers/engine/spark_commit.py), never the driver: the JVM, the session and the
  query stay up through the crashes, and the session stays up after the run, so the next demo run starts
  on a warm driver (in a Celery worker, the worker's). `spark_kills_workers=False` runs it as processes
  killed at the driver instead, to measure what a JVM start per crash costs.

A run that ends cleanly is "done" only when it caught up with the topic (the run's reason, which a process
reports with `run_pipeline --json`). One stopped before that (a SIGTERM from outside, a worker shutting down) is
"interrupted": the values it had not read yet are not lost, so its sink is not judged against 1..N.

Each pipeline's status (state, restarts, timeline, error, and its sink's counts once it is done) goes to
`progress` whenever it changes.
"""
import json
import logging
import threading
import time
from collections.abc import Callable

from consumers.demo.forks import ForkedCommand
from consumers.demo.schedule import process_specs
from consumers.engine.faults import FaultInjector
from consumers.models import Engine

log = logging.getLogger("tally.demo")

# A pipeline run that fails (not a scheduled crash) is started again this many times.
MAX_FAILED_STARTS = 2
SESSION_READY = "Spark session ready"
# How long a stopped Spark run may take to stop its query and end its run row.
SPARK_STOP_WAIT_S = 60.0
# The run's end reason (consumers/models EndReason) that finishes a demo pipeline: every run is started with
# --stop-when-caught-up. Any other clean end (stopped by a signal) leaves it "interrupted".
FINISHED_REASON = "caught_up"


class _SparkInProcess:
    """The Spark pipeline on this process's SparkSession, in a thread; crashes kill executor workers only."""

    def __init__(self, name: str, batch_size: int, crash_spec: str):
        self.stop = threading.Event()
        self.deaths = 0
        self.events: list[str] = []   # milestones for the timeline, taken by the runner
        self.result = None
        self.error = ""
        self.thread = threading.Thread(target=self._run, args=(name, batch_size, crash_spec), daemon=True,
                                       name=f"tally-demo-{name}")
        self.thread.start()

    def _run(self, name: str, batch_size: int, crash_spec: str) -> None:
        from django.db import connection

        from consumers.engine.spark import run_pipeline
        from consumers.engine.spark_session import get_spark

        try:
            get_spark()   # cold: a JVM and a session (tens of seconds); warm: at once
            self.events.append(SESSION_READY)
            self.result = run_pipeline(name, stop=self.stop, batch_size=batch_size, stop_when_caught_up=True,
                                       faults=FaultInjector.parse(crash_spec, in_worker=True),
                                       on_worker_death=self._died)
        except Exception as exc:  # reported on the card like a failed process
            log.exception("Spark demo run of %s failed", name)
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()   # this thread's own database connection

    def _died(self) -> None:
        self.deaths += 1

    def poll(self) -> int | None:
        if self.thread.is_alive():
            return None
        return 0 if self.result is not None and self.result.ok else 1

    def output(self) -> str:
        if self.error or self.result is None:
            return self.error
        return f"{self.result.reason}: {self.result.detail}"

    def reason(self) -> str:
        return str(self.result.reason) if self.result is not None else ""

    def worker_deaths(self) -> int:
        return self.deaths

    def take_events(self) -> list[str]:
        taken, self.events = self.events, []
        return taken

    def end(self) -> None:
        self.stop.set()
        self.thread.join(timeout=SPARK_STOP_WAIT_S)


class DemoRunner:
    """Runs the demo pipelines side by side, restarts them after crashes, and counts each sink (`count`:
    sink table -> {rows, distinct, missing, duplicated}) as soon as its pipeline is done."""

    def __init__(self, demos, schedules, batch_size: int, count: Callable[[str], dict],
                 progress: Callable[[dict], None] | None, spark_kills_workers: bool = True):
        self.demos, self.batch_size, self.count = demos, batch_size, count
        self.in_process = {demo.name: demo.engine == Engine.SPARK and spark_kills_workers for demo in demos}
        # In process: one run whose workers die where the schedule says; processes: one per crash.
        self.specs = {demo.name: ([",".join(f"{c.point}@{c.attempt + 1}" for c in schedules[demo.name])]
                                  if self.in_process[demo.name] else process_specs(schedules[demo.name]))
                      for demo in demos}
        self.deaths: dict[str, int] = {}
        self.progress = progress
        self.started = time.monotonic()
        self.status = {demo.name: {"delivery_mode": demo.delivery_mode, "state": "starting", "restarts": 0,
                                   "crashes": [{"attempt": c.attempt + 1, "point": c.point, "classic": c.classic}
                                               for c in schedules[demo.name]],
                                   "timeline": [], "error": "", "failed_starts": 0} for demo in demos}
        self.runs: dict[str, ForkedCommand | _SparkInProcess] = {}

    def run(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        try:
            for demo in self.demos:
                self._start(demo)
            self._report()
            while self.runs:
                if time.monotonic() > deadline:
                    for name in list(self.runs):
                        self._finish(name, "timed_out", f"still running after {timeout_s:.0f} s")
                    break
                for demo in self.demos:
                    if demo.name in self.runs:
                        self._check(demo)
                time.sleep(0.1)
        finally:
            for name in list(self.runs):
                self._finish(name, "failed", "interrupted")
        return self.status

    def _check(self, demo) -> None:
        run = self.runs[demo.name]
        code = run.poll()
        status = self.status[demo.name]
        if isinstance(run, _SparkInProcess):
            for event in run.take_events():
                self._mark(demo.name, event)
            self._count_worker_deaths(demo.name, run.worker_deaths())
        if code is None:
            return
        if code == 0 and _reason(run) == FINISHED_REASON:
            self._finish(demo.name, "done")
            status.update(self.count(demo.sink_table))
        elif code == 0:
            # Ended cleanly before it caught up (stopped by a signal): what it has not read yet is not lost, so
            # the sink is not judged against 1..N. What it wrote is counted, duplicates included.
            why = _reason(run) or "no result"
            self._finish(demo.name, "interrupted", f"stopped before it caught up ({why}): the values it did not "
                                                   "read yet are not lost")
            counts = self.count(demo.sink_table)
            status.update(rows=counts["rows"], distinct=counts["distinct"], duplicated=counts["duplicated"])
        elif code == -9:   # SIGKILL from a fault point: the crash the demo is about
            self.runs.pop(demo.name).end()
            status["restarts"] += 1
            self._mark(demo.name, "crashed")
            self._start(demo)
        elif status["failed_starts"] < MAX_FAILED_STARTS:
            # Not a scheduled crash: e.g. Spark's Python worker not connecting back in time on a loaded
            # machine. Positions live in PostgreSQL and Kafka, so starting again is safe; the error stays.
            status["failed_starts"] += 1
            status["error"] = _last_line(run.output())
            self.runs.pop(demo.name).end()
            self._mark(demo.name, "failed, started again")
            self._start(demo)
        else:
            self._finish(demo.name, "failed", run.output()[-2000:])
        self._report()

    def _start(self, demo) -> None:
        status = self.status[demo.name]
        specs = self.specs[demo.name]
        spec = specs[status["restarts"]] if status["restarts"] < len(specs) else ""
        self.deaths[demo.name] = 0
        if self.in_process[demo.name]:
            self.runs[demo.name] = _SparkInProcess(demo.name, self.batch_size, spec)
        else:
            # --json: the run's result (its end reason) is the last line of the output (_reason).
            command = [demo.command, demo.name, "--batch-size", str(self.batch_size), "--stop-when-caught-up",
                       "--json"]
            if spec:
                command += ["--crash-at", spec]
            self.runs[demo.name] = ForkedCommand(command)
        status["state"] = "running"
        self._mark(demo.name, "started")

    def _count_worker_deaths(self, name: str, died: int) -> None:
        """A Spark worker that died committing is a crash too."""
        if died == self.deaths[name]:
            return
        for _ in range(died - self.deaths[name]):
            self.status[name]["restarts"] += 1
            self._mark(name, "worker died")
        self.deaths[name] = died
        self._report()

    def _finish(self, name: str, state: str, error: str = "") -> None:
        self.runs.pop(name).end()
        self.status[name].update(state=state, error=error)
        self._mark(name, state)

    def _mark(self, name: str, event: str) -> None:
        """Seconds since the run began: where the time goes (process and JVM starts, crashes, the end)."""
        self.status[name]["timeline"].append([round(time.monotonic() - self.started, 2), event])
        if event not in ("started", SESSION_READY):
            self.status[name]["elapsed_s"] = round(time.monotonic() - self.started, 2)

    def _report(self) -> None:
        if self.progress:
            self.progress({name: dict(s) for name, s in self.status.items()})


def _reason(run) -> str:
    """Why a run that exited 0 ended: the Spark thread's result, or the `--json` result a process printed."""
    if isinstance(run, _SparkInProcess):
        return run.reason()
    for line in reversed(run.output().splitlines()):
        if line.startswith("{"):
            try:
                result = json.loads(line)
            except ValueError:
                continue
            if isinstance(result, dict) and "reason" in result:
                return str(result["reason"])
    return ""


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:500] if lines else ""
