"""Commit a Spark micro-batch in a Python worker, so that a fault kills that worker and not the driver.

The demo's lesson for the Spark engine is a process dying inside the commit protocol. Killing the driver
means a new JVM, SparkSession and query per crash (about a minute each on a loaded two-core machine);
killing the Python worker that is committing is the same real death at the same point, and Spark retries
the task while the driver stays warm:

  driver (foreachBatch): the collected batch + the crash point of each task attempt
    └─ one task: a Python worker opens its own connection and runs consumers.commit.commit_batch
         attempt 0 dies (SIGKILL) at its point: the transaction is rolled back, or committed if the point
         is after-db-commit
         attempt 1 runs the same batch: the commit protocol skips what attempt 0 committed (a replay)
  driver: outcomes as usual, the Kafka commit afterwards

Local masters retry a task only when the master says so (`local[N,F]`): `with_task_retries` adds F.
"""
import logging
import re

from consumers.engine import commit, db
from consumers.engine.faults import NO_FAULTS, FaultInjector

log = logging.getLogger("tally.spark.worker_commit")

# Attempts Spark makes at a task (the first and its retries): consecutive scheduled crashes beyond
# this minus one are not carried out, so the batch always commits.
TASK_ATTEMPTS = 8
# What the driver logs once per worker that died committing; the demo counts these lines.
WORKER_DIED = "tally-fault: a Python worker died committing"

_LOCAL = re.compile(r"^local(\[(\d+|\*)\])?$")


def with_task_retries(master: str, attempts: int = TASK_ATTEMPTS) -> str:
    """`local[2]` -> `local[2,8]`: a local master otherwise fails the job at the first task failure.
    Other masters (and local ones that already set failures) retry by `spark.task.maxFailures`."""
    match = _LOCAL.match(master)
    if not match:
        return master
    return f"local[{match.group(2) or 1},{attempts}]"


def crash_points(faults: FaultInjector, next_attempt: int) -> tuple[list[str], int]:
    """The crash point of each task attempt for the batch whose first attempt is `next_attempt` (1-based,
    counted over the run), and the attempt number after this batch's successful one."""
    points = []
    while len(points) < TASK_ATTEMPTS - 1 and (point := faults.point_at(next_attempt)) is not None:
        points.append(point)
        next_attempt += 1
    return points, next_attempt + 1


def commit_on_worker(spark, target: commit.Target, epoch: int, batches, points: list[str], fetches=None):
    """Run the commit protocol for `batches` in one Spark task. Returns the outcomes; raises what the
    protocol raised (Fenced, Gap, StopOnBadRecord) as on the driver."""
    payload = (target, epoch, batches, points, fetches)
    attempt, outcomes, refused = (spark.sparkContext.parallelize([0], 1)
                                  .mapPartitions(lambda _: [_commit_in_task(payload)]).collect()[0])
    for _ in range(attempt):
        log.warning("%s (batch of %s records retried by Spark)", WORKER_DIED,
                    sum(len(r) for r in batches.values()))
    if refused is not None:
        raise refused
    return outcomes


def _commit_in_task(payload):
    """In the Python worker: the task attempt's crash point (if any), then the commit protocol."""
    import django
    from django.apps import apps
    from pyspark import TaskContext

    if not apps.ready:
        django.setup()   # the worker inherits DJANGO_SETTINGS_MODULE and DATABASE_URL from the driver
    target, epoch, batches, points, fetches = payload
    attempt = TaskContext.get().attemptNumber()
    faults = FaultInjector(at_pass={points[attempt]: {1}}) if attempt < len(points) else NO_FAULTS
    conn = db.connect(f"tally-spark-worker-{target.pipeline_id}")
    try:
        faults.maybe_crash("after-poll")
        outcomes = commit.commit_batch(conn, target, epoch, batches, faults, fetches)
        faults.maybe_crash("after-db-commit")
        return attempt, outcomes, None
    except commit.CommitRefused as exc:
        return attempt, None, exc
    finally:
        conn.close()
