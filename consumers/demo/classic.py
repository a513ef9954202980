"""The classic example (a blog post's experiment): topic `nums` holds "1".."100", a consumer polls 10
records at a time and is killed now and then. Committing to Kafka before writing ends with fewer than 100
rows (the post: 91); writing before committing ends with duplicates; Tally's exactly-once pipeline ends
with every value exactly once.

`seed_demo` creates the topic and one pipeline per delivery mode; `run_classic_demo` runs each pipeline
as a `run_pipeline` subprocess that kills itself at its mode's classic fault point, restarts it until it
exits cleanly, and reads the sinks row by row.

--reset: the embedded broker cannot delete records, so the topic is deleted and created again (its
offsets start at 0 again) and any Kafka offsets the demo groups still hold for it are set back to 0; the
demo pipelines are deleted with all their state (offsets, ledger, runs, health) and created again.
"""
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from django.conf import settings
from django.db import connection, transaction
from kafka import KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError
from psycopg2 import sql

from consumers.engine import db, sinks
from consumers.engine.faults import POINTS
from consumers.engine.pipelines import create_pipeline
from consumers.kafka import admin as kafka_admin
from consumers.models import DeliveryMode, Engine, Pipeline

log = logging.getLogger("tally.demo")

DEMO_TOPIC = "nums"
DEMO_BATCH_SIZE = 10            # the blog post's max_poll_records
TOPIC_TIMEOUT_S = 15.0


class DemoError(RuntimeError):
    pass


@dataclass(frozen=True)
class DemoPipeline:
    name: str                     # also the consumer group id
    delivery_mode: str
    sink_table: str
    crash_points: tuple[str, ...]  # where run_classic_demo kills this pipeline's process
    engine: str = Engine.PYTHON
    command: str = "run_pipeline"  # the management command that runs it (same options as run_pipeline)


# Add a pipeline here and seed_demo / run_classic_demo pick it up.
DEMO_PIPELINES: list[DemoPipeline] = [
    DemoPipeline("nums-at-most-once", DeliveryMode.AT_MOST_ONCE, "demo_nums_at_most_once", ("after-kafka-commit",)),
    DemoPipeline("nums-at-least-once", DeliveryMode.AT_LEAST_ONCE, "demo_nums_at_least_once", ("after-db-commit",)),
    DemoPipeline("nums-exactly-once", DeliveryMode.EXACTLY_ONCE, "demo_nums_exactly_once", POINTS),
    DemoPipeline("nums-spark-exactly-once", DeliveryMode.EXACTLY_ONCE, "demo_nums_spark_exactly_once", POINTS,
                 engine=Engine.SPARK, command="run_spark_pipeline"),
]


# --- seeding ---------------------------------------------------------------------------------------
def seed_demo(records: int = 100, partitions: int = 1, reset: bool = False) -> dict:
    """Create topic `nums` with "1".."records" (spread round-robin over the partitions) and the demo
    pipelines. Safe to re-run; `reset` starts over (see the module docstring)."""
    if records < 1 or partitions < 1:
        raise DemoError("records and partitions must be at least 1.")
    if reset:
        _reset()
    produced = _ensure_topic(records, partitions)
    pipelines = [create_pipeline(demo.name, DEMO_TOPIC, demo.sink_table, "int_value", demo.delivery_mode,
                                 exist_ok=True, group_id=demo.name, batch_size=DEMO_BATCH_SIZE, engine=demo.engine)
                 for demo in DEMO_PIPELINES]
    return {"topic": DEMO_TOPIC, "records": records, "partitions": partitions, "produced": produced,
            "pipelines": [p.name for p in pipelines]}


def _reset() -> None:
    """Kafka first, then the database in one transaction: if the broker refuses (the topic cannot be
    deleted), nothing in the database has changed and DemoError says why; if the database part fails,
    it rolls back whole, and the pipelines' stored positions -- now ahead of the recreated topic's end --
    are reported as "position ahead of log end", never read silently."""
    names = [demo.name for demo in DEMO_PIPELINES]
    # The demo's consumer groups: their committed offsets, and any membership a killed engine left
    # behind (on the embedded broker such a group can stay stuck in a rebalance). Errors are returned.
    failed = {g: e for g, e in kafka_admin.delete_groups(names).items() if e != "OK"}
    if failed:
        log.warning("Could not delete demo consumer groups: %s", failed)
    try:
        with kafka_admin.admin_session() as admin:
            if DEMO_TOPIC in admin.list_topics():
                admin.delete_topics([DEMO_TOPIC], timeout_ms=int(TOPIC_TIMEOUT_S * 1000))
                _wait_until(lambda: DEMO_TOPIC not in admin.list_topics(), "the old topic to disappear")
    except Exception as exc:  # the broker refused or is unreachable: stop before touching the database
        raise DemoError(f"Could not delete topic {DEMO_TOPIC!r} ({type(exc).__name__}: {exc}); "
                        f"nothing was reset.") from exc
    # Deleting a pipeline fences its running engines (the commit and the heartbeat find no pipeline).
    with transaction.atomic(), connection.cursor() as cursor:
        Pipeline.objects.filter(name__in=names).delete()
        for demo in DEMO_PIPELINES:
            sinks.drop_sink_table(cursor.cursor, demo.sink_table)


def _ensure_topic(records: int, partitions: int) -> int:
    """Create and fill the topic if needed; returns the number of records produced now."""
    with kafka_admin.admin_session() as admin:
        if DEMO_TOPIC not in admin.list_topics():
            def create():
                try:
                    admin.create_topics([NewTopic(DEMO_TOPIC, partitions, 1)])
                except TopicAlreadyExistsError:
                    pass   # real Kafka deletes topics asynchronously; created by now or soon
                return True
            _wait_until(create, "the topic to be created")
    existing = _wait_until(lambda: _try(kafka_admin.partitions_for, DEMO_TOPIC), "the topic's metadata")
    if len(existing) != partitions:
        raise DemoError(f"Topic {DEMO_TOPIC!r} has {len(existing)} partitions, not {partitions}: "
                        f"run seed_demo --reset to start over.")
    held = sum(w.high - w.log_start for w in kafka_admin.watermarks(DEMO_TOPIC).values())
    if held == records:
        return 0
    if held:
        raise DemoError(f"Topic {DEMO_TOPIC!r} holds {held} records, not {records}: run seed_demo --reset "
                        f"to start over.")
    _produce(records, partitions)
    _forget_old_group_offsets(partitions)
    return records


def _produce(records: int, partitions: int) -> None:
    producer = KafkaProducer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, acks="all", linger_ms=5,
                             request_timeout_ms=settings.KAFKA_REQUEST_TIMEOUT_MS)
    try:
        _wait_until(lambda: len(producer.partitions_for(DEMO_TOPIC) or ()) == partitions, "producer metadata")
        for value in range(1, records + 1):
            producer.send(DEMO_TOPIC, str(value).encode(), partition=(value - 1) % partitions)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)


def _forget_old_group_offsets(partitions: int) -> None:
    """A recreated topic starts at offset 0 again; Kafka offsets a demo group committed for the old one
    would make the classic modes skip records (the embedded broker drops them with the topic)."""
    for demo in DEMO_PIPELINES:
        committed = kafka_admin.committed_offsets(demo.name, DEMO_TOPIC, list(range(partitions)))
        if any(offset for offset in committed.values()):
            kafka_admin.commit_offsets(demo.name, DEMO_TOPIC, {p: 0 for p in range(partitions)})


def _try(function, *args):
    try:
        return function(*args)
    except (kafka_admin.KafkaAdminError, UnknownTopicOrPartitionError):
        return None


def _wait_until(check: Callable, what: str, timeout_s: float = TOPIC_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise DemoError(f"Timed out after {timeout_s:.0f} s waiting for {what}.")
        time.sleep(0.2)


# --- the run with crashes --------------------------------------------------------------------------
def run_classic_demo(records: int = 100, crash_probability: float = 0.2, max_restarts: int = 30,
                     progress: Callable[[dict], None] | None = None, *, partitions: int = 1,
                     timeout_s: float = 600.0, env: dict | None = None, pipelines: list[str] | None = None) -> dict:
    """Seed from scratch, then run every demo pipeline as a subprocess that kills itself (SIGKILL) at its
    mode's classic fault points (a batch crashes with `crash_probability`), restarting it after each
    crash until it exits 0.
    After `max_restarts` crashes a pipeline runs once more without faults, so each one finishes. All
    pipelines run at once; `timeout_s` bounds the whole run. `progress(status)` gets the per-pipeline
    status dict whenever it changes. `pipelines` limits the run to these demo pipelines (default: all).

    Returns {pipeline name: {delivery_mode, state, restarts, rows, distinct, missing (sorted list),
    duplicated ({value: count}), error}}; state is done, failed or timed_out."""
    if not 0.0 <= crash_probability <= 1.0:
        raise DemoError("crash_probability must be within [0, 1].")
    selected = [demo for demo in DEMO_PIPELINES if pipelines is None or demo.name in pipelines]
    unknown = set(pipelines or ()) - {demo.name for demo in selected}
    if unknown:
        raise DemoError(f"Not demo pipelines: {', '.join(sorted(unknown))}.")
    seed_demo(records=records, partitions=partitions, reset=True)
    runner = _DemoRunner(selected, crash_probability, max_restarts, progress, _subprocess_env(env))
    status = runner.run(timeout_s)
    for demo in selected:
        status[demo.name].update(count_sink(demo.sink_table, records))
    if progress:
        progress(status)
    return status


def crash_spec(points: tuple[str, ...], probability: float) -> str:
    """--crash-at for `points` such that a batch crashes with `probability` in total, whatever the number
    of points (so every mode gets about the same number of crashes): 1 - (1 - p_point) ** n = p."""
    per_point = 1 - (1 - probability) ** (1 / len(points))
    return ",".join(f"{point}:{per_point:.4f}" for point in points)


def count_sink(table: str, records: int) -> dict:
    """Row-by-row view of a demo sink: which of 1..records are missing, which are there more than once."""
    conn = db.connect("tally-demo")
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql.SQL("SELECT id, count(*) FROM {} GROUP BY id").format(sql.Identifier(table)))
            counts = dict(cursor.fetchall())
        conn.rollback()
    finally:
        conn.close()
    return {"rows": sum(counts.values()), "distinct": len(counts),
            "missing": [v for v in range(1, records + 1) if v not in counts],
            "duplicated": {v: c for v, c in sorted(counts.items()) if c > 1}}


class _DemoRunner:
    """Runs the demo pipelines' processes side by side and restarts them after crashes."""

    def __init__(self, demos, crash_probability, max_restarts, progress, env):
        self.demos = demos
        self.crash_probability, self.max_restarts = crash_probability, max_restarts
        self.progress, self.env = progress, env
        self.status = {demo.name: {"delivery_mode": demo.delivery_mode, "state": "starting", "restarts": 0,
                                   "error": ""} for demo in demos}
        self.processes: dict[str, tuple[subprocess.Popen, object]] = {}

    def run(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        try:
            for demo in self.demos:
                self._start(demo)
            self._report()
            while self.processes:
                if time.monotonic() > deadline:
                    for name in list(self.processes):
                        self._finish(name, "timed_out", f"still running after {timeout_s:.0f} s")
                    break
                for demo in self.demos:
                    if demo.name in self.processes:
                        self._check(demo)
                time.sleep(0.1)
        finally:
            for name in list(self.processes):
                self._finish(name, "failed", "interrupted")
        return self.status

    def _check(self, demo: DemoPipeline) -> None:
        process, log = self.processes[demo.name]
        code = process.poll()
        if code is None:
            return
        status = self.status[demo.name]
        if code == 0:
            self._finish(demo.name, "done")
        elif code == -9:   # SIGKILL from a fault point: the crash the demo is about
            del self.processes[demo.name]
            log.close()
            status["restarts"] += 1
            self._start(demo)
        else:
            log.seek(0)
            self._finish(demo.name, "failed", log.read().decode(errors="replace")[-2000:])
        self._report()

    def _start(self, demo: DemoPipeline) -> None:
        status = self.status[demo.name]
        command = [sys.executable, str(settings.BASE_DIR / "manage.py"), demo.command, demo.name,
                   "--batch-size", str(DEMO_BATCH_SIZE), "--stop-when-caught-up"]
        if status["restarts"] < self.max_restarts and self.crash_probability > 0:
            command += ["--crash-at", crash_spec(demo.crash_points, self.crash_probability)]
        log = tempfile.TemporaryFile()
        process = subprocess.Popen(command, cwd=settings.BASE_DIR, env=self.env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        self.processes[demo.name] = (process, log)
        status["state"] = "running"

    def _finish(self, name: str, state: str, error: str = "") -> None:
        process, log = self.processes.pop(name)
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        log.close()
        self.status[name].update(state=state, error=error)

    def _report(self) -> None:
        if self.progress:
            self.progress({name: dict(s) for name, s in self.status.items()})


def _subprocess_env(extra: dict | None) -> dict:
    """The children use this process's database, broker and session timeout (a test's or a worker's)."""
    database = settings.DATABASES["default"]
    auth = quote(database.get("USER") or "postgres", safe="")
    if database.get("PASSWORD"):
        auth += ":" + quote(database["PASSWORD"], safe="")
    env = dict(os.environ)
    env.update({"DATABASE_URL": f"postgres://{auth}@{database.get('HOST') or '127.0.0.1'}:"
                                f"{database.get('PORT') or 5432}/{database['NAME']}",
                "KAFKA_BOOTSTRAP_SERVERS": settings.KAFKA_BOOTSTRAP_SERVERS,
                "KAFKA_SESSION_TIMEOUT_MS": str(settings.KAFKA_SESSION_TIMEOUT_MS),
                "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env
