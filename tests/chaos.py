"""Helpers for engine, demo and chaos tests: topics with the values 1..N, engine subprocesses, and the
row-by-row view of a sink."""
import collections
import signal
import subprocess
import sys
import tempfile

from psycopg2 import sql

from consumers.engine import db
from tests.conftest import ROOT
from tests.producing import send
from tests.waiting import patience, wait_for  # noqa: F401 - re-exported: the suite's one wait helper

CHAOS_SESSION_TIMEOUT_MS = "6000"  # as real Kafka's minimum: a killed member holds its partitions this long


def produce_values(topic: str, values, partitions: int = 1) -> None:
    """Values as text, round-robin over the partitions (so each partition holds them in order)."""
    send(topic, [(i % partitions, None, str(value).encode()) for i, value in enumerate(values)])


def sink_counts(table: str) -> collections.Counter:
    """{id: how many rows} of a sink table, read through a fresh connection (sees committed rows only)."""
    conn = db.connect("tally-tests")
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql.SQL("SELECT id, count(*) FROM {} GROUP BY id").format(sql.Identifier(table)))
            counts = collections.Counter(dict(cursor.fetchall()))
        conn.rollback()
    finally:
        conn.close()
    return counts


def split_reported(runs, partitions: int) -> bool:
    """Whether `runs` (ConsumerRun rows) each report reading a share and, together, every partition once.
    A run's `assigned_partitions` is its heartbeat's: one that gave partitions up says so at its next beat,
    after the peer that took them may already have. Their claims, though, never overlap, at any moment."""
    claims = [set(run.claimed_partitions) for run in runs]
    assert sum(map(len, claims)) == len(set().union(*claims)), f"a partition claimed twice: {claims}"
    shares = [sorted(run.assigned_partitions) for run in runs]
    return all(shares) and sorted(p for share in shares for p in share) == list(range(partitions))


def ledger_batches(pipeline_id: int) -> int:
    conn = db.connect("tally-tests")
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM consumers_batchledger WHERE pipeline_id = %s", [pipeline_id])
            (count,) = cursor.fetchone()
        conn.rollback()
    finally:
        conn.close()
    return count


class EngineProcess:
    """`manage.py run_pipeline NAME ...` in its own process group, output in a temporary file."""

    def __init__(self, env: dict, name: str, *args: str):
        env = dict(env, KAFKA_SESSION_TIMEOUT_MS=CHAOS_SESSION_TIMEOUT_MS)
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "run_pipeline", name, *args],
                                        cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self):
        return self.process.poll()

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)   # ends a stopped (SIGSTOP) process too
        self.process.wait(timeout=10)

    def __enter__(self) -> "EngineProcess":
        return self

    def __exit__(self, *exc_info) -> None:
        self.kill()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not end in time; always reaped."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()




def run_killed_at(env: dict, name: str, args: list[str], spec: str, timeout: float = 60) -> "EngineProcess":
    """Run the engine with `--crash-at spec` (one fault that must fire: "POINT@PASS" or "POINT:1"); check that it
    died by SIGKILL at that fault. Returns the finished process."""
    engine = EngineProcess(env, name, *args, "--crash-at", spec)
    assert engine.wait(patience(timeout)) == -signal.SIGKILL, engine.output()[-2000:]
    fired = spec if "@" in spec else spec.partition(":")[0]
    assert f"crash-at: fault {fired} fired" in engine.output(), engine.output()[-2000:]
    return engine


def run_until_clean_exit(env: dict, name: str, args: list[str], max_runs: int, timeout: float = 60) -> int:
    """Run the engine again and again until it exits 0; returns how many runs were SIGKILLed."""
    kills = 0
    for _ in range(max_runs):
        engine = EngineProcess(env, name, *args)
        try:
            code = engine.wait(patience(timeout))
        except subprocess.TimeoutExpired:
            engine.kill()
            raise AssertionError(f"{name} ran longer than {timeout} s:\n{engine.output()[-3000:]}") from None
        if code == 0:
            return kills
        assert code == -signal.SIGKILL, f"engine failed with {code}:\n{engine.output()[-3000:]}"
        kills += 1
    raise AssertionError(f"{name} did not finish within {max_runs} runs")
