"""A real Spark standalone cluster for tests and benchmarks: a master and N workers started from the pyspark
wheel (`bin/spark-class ...deploy.master.Master` / `...deploy.worker.Worker`) on 127.0.0.1 with free ports,
stopped by PID. Ready when the master's `/json/` lists every worker ALIVE.

    with StandaloneCluster(workers=2) as cluster:   # or the `spark_cluster` fixture
        settings.SPARK_MASTER = cluster.master      # spark://127.0.0.1:P: all a user sets

Executors run the driver's interpreter (the session sets PYSPARK_PYTHON to the venv's python), so they
import the installed project, psycopg2 and kafka-python.
"""
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from consumers.kafka.broker import free_port

ROOT = Path(__file__).resolve().parent.parent  # not from tests.conftest: it imports this module
READY_TIMEOUT_S = 120  # two workers register in ~13 s on an idle 2-core machine; shared machines are slower


class ClusterError(RuntimeError):
    pass


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class StandaloneCluster:
    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g", name: str = "cluster"):
        self.workers, self.cores, self.memory = workers, cores, memory
        self.port, self.webui_port = free_port(), free_port()
        self.master = f"spark://127.0.0.1:{self.port}"
        self.base = ROOT / "var" / f"spark-{name}-{uuid.uuid4().hex[:6]}"
        self.processes: list[subprocess.Popen] = []

    # --- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> "StandaloneCluster":
        self.base.mkdir(parents=True)
        try:
            self.processes.append(self._spawn("master", "org.apache.spark.deploy.master.Master", "--host",
                                              "127.0.0.1", "--port", str(self.port), "--webui-port",
                                              str(self.webui_port)))
            self._wait(lambda state: state is not None, "the master to answer")
            for i in range(self.workers):
                work_dir = self.base / f"worker-{i}"
                work_dir.mkdir()
                self.processes.append(self._spawn(
                    f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.master, "--host", "127.0.0.1",
                    "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", str(self.cores),
                    "--memory", self.memory, "--work-dir", str(work_dir)))
            self._wait(lambda state: state is not None and len(alive_workers(state)) == self.workers,
                       f"{self.workers} workers ALIVE")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM each daemon by PID (each leads its own process group, with the executors it started),
        SIGKILL what is left after 20 s."""
        for process in reversed(self.processes):
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for process in reversed(self.processes):
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        self.processes.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    # --- state ------------------------------------------------------------------------------------------
    def state(self) -> dict | None:
        """The master's `/json/` (workers, applications), or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=5) as reply:
                return json.load(reply)
        except (OSError, ValueError):
            return None

    def executor_pids(self) -> list[int]:
        """PIDs of the executor JVMs the workers started (for chaos tests)."""
        import psutil

        found = []
        for process in self.processes[1:]:
            try:
                children = psutil.Process(process.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            found += [c.pid for c in children if "CoarseGrainedExecutorBackend" in " ".join(_cmdline(c))]
        return found

    def _spawn(self, name: str, main_class: str, *args: str) -> subprocess.Popen:
        env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_LOG_DIR=str(self.base), SPARK_WORKER_DIR=str(self.base),
                   # The REST submission server would take port 6066 (shared by every cluster on the machine).
                   SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false", SPARK_NO_DAEMONIZE="1")
        log = open(self.base / f"{name}.log", "wb")
        return subprocess.Popen([str(spark_home() / "bin" / "spark-class"), main_class, *args], cwd=self.base,
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            dead = [p for p in self.processes if p.poll() is not None]
            if dead:
                raise ClusterError(f"a Spark daemon exited with {dead[0].returncode}; logs in {self.base}")
            if ready(self.state()):
                return
            time.sleep(0.5)
        raise ClusterError(f"waited {READY_TIMEOUT_S} s for {what}; logs in {self.base}")


def alive_workers(state: dict) -> list[dict]:
    return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]


def _cmdline(process) -> list[str]:
    try:
        return process.cmdline()
    except Exception:  # gone meanwhile
        return []


def _signal_group(process: subprocess.Popen, sig) -> None:
    """Signal the daemon's group even when the daemon itself has exited: the executors it started may not have."""
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="session")
def spark_cluster():
    """A standalone master with two 1-core workers for the whole test session."""
    with StandaloneCluster(workers=2) as cluster:
        yield cluster


@pytest.fixture
def on_spark_cluster(spark_cluster, settings):
    """This process's SparkSession on the cluster (the local one is stopped first, and again after)."""
    from consumers.engine.spark_session import stop_spark

    stop_spark(shutdown_jvm=True)
    settings.SPARK_MASTER = spark_cluster.master
    yield spark_cluster
    stop_spark(shutdown_jvm=True)
