"""The one place that builds Tally's SparkSession, from settings, once per process.

- `SPARK_MASTER` (default `local[*]`) picks the cluster; `SPARK_DRIVER_MEMORY` the driver's heap;
  `spark.jars` gets the PostgreSQL JDBC jar (`SPARK_JDBC_JAR`) for the topic check's table reads.
- Spark's Python workers run the interpreter of this process (`sys.executable`): the project is installed
  into that environment, so the Kafka Data Source module is importable there (no `addPyFile`).
- Never build a session before a fork (a Celery prefork pool): the forked JVM gateway gives garbled answers
  and hangs. Spark work runs in a threads or solo pool worker and builds the session lazily, on first use.
"""
import contextlib
import hashlib
import logging
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings

log = logging.getLogger("tally.spark")

_lock = threading.Lock()
_session = None
_session_pid = None

# Local masters run on one small machine: Spark's default of 200 shuffle partitions would mean 200 tiny
# tasks per aggregation, each costing more to schedule than to run.
LOCAL_SHUFFLE_PARTITIONS = 4


class SparkSessionError(RuntimeError):
    pass


def is_local(master: str) -> bool:
    return master.startswith("local")


# Attempts Spark makes at one task (the first and its retries). Spark's local mode gives up on a
# micro-batch at its first failed task, where a cluster retries it (spark.task.maxFailures): a Python
# worker killed mid-commit must be retried everywhere, and the demo's crash schedule carries out at most
# TASK_ATTEMPTS - 1 consecutive worker deaths (consumers/engine/spark_commit.py), so every master gets
# the same number.
TASK_ATTEMPTS = 8
_LOCAL = re.compile(r"^local(\[(?P<threads>[^,\]]+)\])?$")


def with_task_retries(master: str) -> str:
    """`local` / `local[N]` / `local[*]` -> `local[N,8]` (retries as on a cluster, where
    `spark.task.maxFailures` says it); local masters that already set failures, and other masters, unchanged."""
    match = _LOCAL.match(master.replace(" ", ""))
    if match is None:
        return master
    return f"local[{match.group('threads') or 1},{TASK_ATTEMPTS}]"


def on_loopback(master: str) -> bool:
    """A local master, or a standalone cluster on this machine (spark://127.0.0.1:P): the driver then
    listens on the loopback address only, where the executors reach it."""
    if is_local(master):
        return True
    host = urlsplit(master).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1")


# Spark puts its own pyspark.zip and py4j zip first on every Python worker's PYTHONPATH, and Python caches
# no bytecode for modules in a zip: each Python process Spark starts compiles PySpark again, 1.8 s of CPU
# against 0.6 s from the installed package (measured). One such process plans each streaming query that
# reads a Python Data Source, and Spark gives it 10 s to connect back: at load average 20 the zip import
# alone took 9 s and query starts failed. Workers on this machine run this interpreter, where the same
# PySpark is installed (the package that ships the zips), so they start through this launcher, which
# drops the zips from PYTHONPATH.
_WORKER_LAUNCHER = """#!/bin/sh
# Written by Tally (consumers/engine/spark_session.py): Spark's Python workers import the installed PySpark.
PYTHONPATH=$(printf '%s' "$PYTHONPATH" | tr ':' '\\n' \\
  | grep -v -e '/pyspark\\.zip$' -e '/py4j-[^/]*\\.zip$' | paste -sd: -)
export PYTHONPATH
exec {python} "$@"
"""


def worker_python(master: str) -> str:
    """The interpreter Spark's Python workers run: this one, through the launcher on this machine."""
    if not on_loopback(master):
        return sys.executable   # the executors' own hosts: spark.pyspark.python there (docs/spark.md)
    digest = hashlib.sha256(sys.executable.encode()).hexdigest()[:12]
    return str(Path(tempfile.gettempdir()) / f"tally-spark-python-{digest}")


def install_worker_launcher(path: str) -> None:
    """Write the launcher (atomically: other processes may be starting Spark too) unless it is there."""
    if path == sys.executable:
        return
    text = _WORKER_LAUNCHER.format(python=shlex.quote(sys.executable))
    target = Path(path)
    if target.is_file() and target.read_text() == text and os.access(target, os.X_OK):
        return
    partial = target.with_name(f"{target.name}.{os.getpid()}")
    partial.write_text(text)
    partial.chmod(0o755)
    os.replace(partial, target)


def session_config(master: str | None = None) -> dict[str, str]:
    """The Spark configuration Tally uses, from settings (a plain dict, so it can be shown and tested)."""
    master = master or settings.SPARK_MASTER
    config = {
        "spark.app.name": "tally",
        "spark.driver.memory": settings.SPARK_DRIVER_MEMORY,
        "spark.pyspark.python": worker_python(master),
        "spark.pyspark.driver.python": sys.executable,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Tally owns offsets in PostgreSQL; Spark's checkpoints are scratch (see consumers/engine/spark.py).
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.task.maxFailures": str(TASK_ATTEMPTS),  # cluster masters; local ones: with_task_retries
    }
    jar = settings.SPARK_JDBC_JAR
    if jar and Path(jar).is_file():
        config["spark.jars"] = jar
    if is_local(master):
        config["spark.sql.shuffle.partitions"] = str(LOCAL_SHUFFLE_PARTITIONS)
    if on_loopback(master):
        config["spark.driver.host"] = "127.0.0.1"
        config["spark.driver.bindAddress"] = "127.0.0.1"
    return config


def get_spark():
    """The process's SparkSession, created on first use and then reused."""
    global _session, _session_pid
    with _lock:
        if _session is not None and _session_pid != os.getpid():
            raise SparkSessionError("This process was forked after its SparkSession was created; Spark cannot "
                                    "be used across a fork. Run Spark work in a threads or solo pool worker.")
        if _session is None or _session_is_stopped(_session):
            _session = _build()
            _session_pid = os.getpid()
        return _session


def warm_up() -> float:
    """Start this process's session and run one tiny Python job through it (a Python worker, Arrow's code
    paths), so the next Spark run starts on a warm driver. Returns the seconds it took."""
    started = time.monotonic()
    get_spark().range(2).mapInArrow(_unchanged, "id long").collect()
    return time.monotonic() - started


def _unchanged(batches):
    yield from batches


def stop_spark(shutdown_jvm: bool = False) -> None:
    """Stop the session; with shutdown_jvm also end this process's JVM (its memory goes back to the
    machine, and the next get_spark() starts a fresh one)."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
        if shutdown_jvm:
            _shutdown_gateway()


def _shutdown_gateway() -> None:
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):
        gateway.shutdown()
    if process is not None:
        # The gateway JVM exits when its stdin closes (PySpark's contract with spark-submit).
        with contextlib.suppress(Exception):
            process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    SparkContext._gateway = None
    SparkContext._jvm = None


def _session_is_stopped(spark) -> bool:
    try:
        return spark.sparkContext._jsc is None
    except Exception:  # a dead gateway: build a new session
        return True


def _build():
    from pyspark.sql import SparkSession

    master = settings.SPARK_MASTER
    # Workers inherit these: the same interpreter, so the same installed project and dependencies.
    workers = worker_python(master)
    install_worker_launcher(workers)
    os.environ["PYSPARK_PYTHON"] = workers
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if on_loopback(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(with_task_retries(master))
    for key, value in session_config(master).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    from consumers.engine.spark_source import register

    register(spark)
    log.info("SparkSession started: master=%s, Spark %s", master, spark.version)
    return spark
