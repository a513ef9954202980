"""Spark drivers as the chaos tests run them: `manage.py run_spark_pipeline` in a process group of its own
(its JVM with it), appending to one log per test, and a wait for each driver to commit before it is killed."""
import subprocess
import sys
import time
from pathlib import Path

from consumers.models import BatchLedger
from tests.conftest import ROOT
from tests.waiting import patience


def start_driver(env, log_path: Path, name: str, *extra: str) -> subprocess.Popen:
    log_path.parent.mkdir(exist_ok=True)
    with open(log_path, "ab") as log:   # the driver writes to its own copy of the descriptor
        return subprocess.Popen([sys.executable, "manage.py", "run_spark_pipeline", name, *extra], cwd=ROOT,
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def log_size(log_path: Path) -> int:
    return log_path.stat().st_size if log_path.exists() else 0


def read_log(log_path: Path, since: int = 0) -> str:
    """The log the drivers share (each appends to it), from byte `since` on."""
    with open(log_path, "rb") as log:
        log.seek(since)
        return log.read().decode(errors="replace")


def wait_for_a_commit(driver, log_path: Path, since: int, pipeline, before: int, context=lambda: "") -> None:
    """Wait for the driver to start its query, then to commit a micro-batch beyond `before` ledger rows. Each
    phase has its own deadline: on a loaded machine a JVM and its application alone once took 94 s, which left
    the first micro-batch too little of one shared deadline. `context()` adds to a failure's message."""
    started = f"Spark query for {pipeline.name} started"

    def wait(timeout, what, condition):
        deadline = time.monotonic() + patience(timeout)
        while not condition():
            assert driver.poll() is None, (f"the driver exited early with {driver.returncode}; its log ends:\n"
                                           f"{read_log(log_path, since)[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {patience(timeout):.0f} s{context()}; the driver's log "
                                     f"ends:\n{read_log(log_path, since)[-3000:]}")
            time.sleep(0.1)

    wait(120, "query start", lambda: started in read_log(log_path, since))
    wait(60, "committed micro-batch", lambda: BatchLedger.objects.filter(pipeline=pipeline).count() > before)
