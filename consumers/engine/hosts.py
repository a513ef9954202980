"""Engine host processes: where a Celery worker runs its Python-engine runs (either Kafka client), so that they use
every core.

Why (docs/architecture.md "Workers and cores"): a Python process holds one core at a time (the GIL), and a run's
poll loop holds it while it decodes records, so runs executed in the worker's own threads share one core. A run
per process would use every core too, but each costs a whole interpreter with Django loaded: hundreds of idle
pipelines would not fit. So a worker starts up to `TALLY_ENGINE_PROCESSES` host processes (`manage.py
engine_host`, consumers/engine/host_process.py) and each hosts many runs, one thread per run.

The Celery task stays the run's door: it picks a host (`HostPool.run`), sends it the run and waits for its
result, as it waited for an in-thread run before. A host reads commands as JSON lines on its stdin and writes
results as JSON lines on its stdout. It stops its runs cleanly when its stdin closes (the worker is gone) or on
SIGTERM, and a run it held when it died ends "error" here, its ConsumerRun row declared crashed, so the
supervisor sees a dead host's runs as dead at once (wherever it runs) and restarts their pipelines. A host that
answers no ping for a run's lease (hung) is killed and treated the same way (`HostPool.check_hosts`), and so is
one that never answers within START_LIMIT_S of its start (hung while loading Django).
"""
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future

from django.conf import settings
from django.utils import timezone

log = logging.getLogger("tally.runs")

# How long a new host may take to load Django and answer its first ping. Far above a lease: on a loaded machine
# loading took longer than one, and a host killed for it would only be started again, just as slowly.
START_LIMIT_S = 120

STOP_ALL = "*"


class Host:
    """One engine host process and the runs it holds: {key: (pipeline id, future of the run's result)}."""

    def __init__(self, number: int):
        self.number = number
        # stderr is inherited: the runs' log lines go to the worker's log.
        self.process = subprocess.Popen([sys.executable, str(settings.BASE_DIR / "manage.py"), "engine_host"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.pending: dict[str, tuple[int, Future]] = {}
        self.alive = True
        self.started_at = time.monotonic()
        self.heard_at: float | None = None   # monotonic time of its last line; None until it first answers
        self.killed_because = ""
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()   # the pool's threads and its watchdog write commands: one line at a time
        threading.Thread(target=self._read_results, name=f"tally-engine-host-{number}", daemon=True).start()
        log.info("engine host %d started (pid %d)", number, self.process.pid)

    @property
    def pid(self) -> int:
        return self.process.pid

    def load(self) -> int:
        return len(self.pending)

    def holds(self, pipeline_id: int) -> bool:
        return any(pid == pipeline_id for pid, _ in list(self.pending.values()))

    def start_run(self, key: str, pipeline_id: int, epoch: int, task_id: str, settled_peers: int) -> Future | None:
        """Send a run to this host; None when the host is already gone."""
        future: Future = Future()
        with self._lock:
            if not self.alive:
                return None
            self.pending[key] = (pipeline_id, future)
        self.send({"op": "run", "key": key, "pipeline_id": pipeline_id, "epoch": epoch, "task_id": task_id,
                   "settled_peers": settled_peers})
        return future

    def stop(self, key: str = STOP_ALL, reason: str = "") -> None:
        self.send({"op": "stop", "key": key, "reason": reason})

    def send(self, message: dict) -> None:
        try:
            with self._send_lock:
                self.process.stdin.write(json.dumps(message) + "\n")
                self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as exc:
            # The host is gone: its reader thread ends its runs.
            log.warning("engine host %d (pid %d) did not take a command: %s", self.number, self.pid, exc)

    def silent_for(self, now: float) -> float:
        """Seconds since the host last answered, or since it started while it has never answered."""
        return now - (self.started_at if self.heard_at is None else self.heard_at)

    def hung(self, now: float, lease: float) -> bool:
        """Silent for a lease once it has answered; for START_LIMIT_S (or a lease, if longer) before that: it may
        still be loading Django."""
        limit = lease if self.heard_at is not None else max(lease, START_LIMIT_S)
        return self.silent_for(now) > limit

    def kill(self, reason: str) -> None:
        """End a host that stopped answering: its reader then ends its runs as for a host that died."""
        self.killed_because = reason
        log.error("engine host %d (pid %d) %s: killing it", self.number, self.pid, reason)
        self.process.kill()

    def _read_results(self) -> None:
        for line in self.process.stdout:
            self.heard_at = time.monotonic()
            try:
                message = json.loads(line)
            except ValueError:
                log.warning("engine host %d wrote a line that is not a result: %.200s", self.number, line)
                continue
            with self._lock:
                entry = self.pending.pop(message.get("key"), None)
            if entry is not None:
                entry[1].set_result(message.get("result") or {})
        code = self.process.wait()
        with self._lock:
            self.alive = False
            pending, self.pending = self.pending, {}
        if pending:
            log.error("engine host %d (pid %d) exited %s holding %d run(s)", self.number, self.pid, code, len(pending))
        detail = f"its engine host process (pid {self.pid}) " + (
            f"{self.killed_because} and was killed" if self.killed_because else f"exited {code}")
        if pending:
            self._declare_crashed(list(pending), detail)
        for _, future in pending.values():
            future.set_result({"reason": "error", "records": 0, "detail": detail})

    def _declare_crashed(self, keys: list[str], reason: str) -> None:
        """The runs this host held never said they ended. Say it for them now: a supervisor on another machine
        (docker-compose.yml's `tasks`) cannot see this pid and would wait out their lease, and a page would
        show them dead with no reason. Keys are the runs' task ids; the pid keeps a reused task id apart."""
        from django.db import connection

        from consumers.models import ConsumerRun

        try:
            ConsumerRun.objects.filter(task_id__in=[key for key in keys if key], pid=self.pid).declare_crashed(
                reason, timezone.now())
        except Exception:  # the futures below must still end the tasks
            log.exception("engine host %d (pid %d): its runs could not be declared crashed", self.number, self.pid)
        finally:
            connection.close()   # this reader thread ends here


# What a run task taken after the worker's warm shutdown began returns instead of starting a run.
SHUTTING_DOWN = {"reason": "skipped", "records": 0, "detail": "the worker is shutting down: the run was not started"}


class HostPool:
    """The worker's `size` engine hosts, started when the worker is ready to take run tasks (or at its first
    kafka-python run)."""

    def __init__(self, size: int):
        self.size = size
        self.hosts: list[Host] = []
        self._lock = threading.Lock()
        self._numbers = 0
        self._stopping = False   # after stop_all (warm shutdown) no run starts: it would never be asked to stop
        self._watching = False

    def run(self, pipeline_id: int, epoch: int, *, task_id: str = "", settled_peers: int = 0,
            stop_asked: Callable[[str], str | None] = lambda key: None) -> dict:
        """Run the pipeline in one of the hosts and wait for the run's result (a dict, as runs.run_here's).
        `stop_asked(key)`: the reason of a stop asked of this run before a host held it (runs.stop_task_run), or
        None; read once the host holds it, so that a stop asked after that finds it there."""
        key = task_id or uuid.uuid4().hex
        for _ in range(2):  # a host that died between the choice and the send: once more on another
            with self._lock:  # chosen and sent under the lock, so the next choice sees this run's load
                if self._stopping:
                    return dict(SHUTTING_DOWN)
                host = self._choose(pipeline_id)
                future = host.start_run(key, pipeline_id, epoch, task_id, settled_peers)
            if future is not None:
                reason = stop_asked(key)
                if reason is not None:
                    host.stop(key, reason)
                return future.result()
        return {"reason": "error", "records": 0, "detail": "no engine host process would take the run"}

    def start(self) -> None:
        """Start the missing hosts now (the worker is ready): a run taken later starts without waiting for one
        to load Django, which on a loaded machine took longer than a run's lease."""
        with self._lock:
            self._start_missing()

    def stop_run(self, key: str, reason: str) -> bool:
        """Ask the run started with `key` (its task's id) to stop cleanly. Returns whether a host holds it."""
        with self._lock:
            holders = [host for host in self.hosts if host.alive and key in host.pending]
        for host in holders:
            host.stop(key, reason)
        return bool(holders)

    def stop_all(self, reason: str) -> int:
        """Ask every host to stop its runs cleanly (warm shutdown). Returns how many runs were asked."""
        with self._lock:
            self._stopping = True
            hosts = [host for host in self.hosts if host.alive]
        for host in hosts:
            host.stop(STOP_ALL, reason)
        return sum(host.load() for host in hosts)

    def active_runs(self) -> int:
        with self._lock:
            return sum(host.load() for host in self.hosts if host.alive)

    def describe(self) -> list[dict]:
        """The live hosts, for `celery inspect engine_hosts` (tally/celery.py)."""
        now = time.monotonic()
        with self._lock:
            hosts = [host for host in self.hosts if host.alive]
        return [{"number": host.number, "pid": host.pid, "runs": host.load(),
                 "answered_s_ago": None if host.heard_at is None else round(now - host.heard_at, 1)}
                for host in hosts]

    def pids(self) -> list[int]:
        with self._lock:
            return [host.pid for host in self.hosts if host.alive]

    def _choose(self, pipeline_id: int) -> Host:
        """The host with the fewest runs, preferring one that holds no run of this pipeline (a pipeline's runs
        then spread over processes). Missing hosts (at the first run, or after one died) are all started at
        once: they load Django side by side, so runs sent together start together. Called under the lock."""
        self._start_missing()
        return min(self.hosts, key=lambda host: (host.holds(pipeline_id), host.load(), host.number))

    def _start_missing(self) -> None:
        """Called under the lock."""
        self.hosts = [host for host in self.hosts if host.alive]
        while len(self.hosts) < self.size:
            self._numbers += 1
            self.hosts.append(Host(self._numbers))
        if not self._watching:
            self._watching = True
            threading.Thread(target=self._watch, name="tally-engine-host-watchdog", daemon=True).start()

    def _watch(self) -> None:
        """Ping every host a few times a lease; kill one silent for a whole lease. A hung host (stopped, deadlocked,
        swapped out) would otherwise hold its runs' tasks for ever and, as the least loaded host, take restarted
        runs that never begin. Its runs stopped heartbeating with it, so the supervisor counts them dead anyway.
        A host that died (killed here, by the OOM killer, by anyone) is replaced at the next round, not when the next
        run comes: that run, often its own pipeline's restart, would otherwise wait for the new host to load Django."""
        while True:
            try:
                with self._lock:
                    if not self._stopping:
                        self._start_missing()
                self.check_hosts(time.monotonic())
            except Exception:  # noqa: BLE001 - a fork refused (ENOMEM, EAGAIN) must not end the watchdog for good
                log.exception("engine hosts: the watchdog's round failed; it tries again at the next")
            time.sleep(settings.TALLY_RUN_LEASE_SECONDS / 4)

    def check_hosts(self, now: float) -> None:
        """One round of the watchdog at monotonic time `now`: kill the hung hosts, ping the others."""
        lease = settings.TALLY_RUN_LEASE_SECONDS
        with self._lock:
            hosts = [host for host in self.hosts if host.alive]
        for host in hosts:
            if host.hung(now, lease):
                since = "" if host.heard_at is not None else " since it started"
                host.kill(f"did not answer for {host.silent_for(now):.0f} s{since}")
            else:
                host.send({"op": "ping"})


_pool: HostPool | None = None
_pool_lock = threading.Lock()


def pool() -> HostPool:
    """This worker's host pool (one per process)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = HostPool(settings.TALLY_ENGINE_PROCESSES)
        return _pool


def existing_pool() -> HostPool | None:
    return _pool


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, a cpuset) where the platform tells it, else the
    machine's. A container's CPU quota is not seen (docs/deploy.md)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not on Linux
        return os.cpu_count() or 1


def warn_if_more_hosts_than_cores(processes: int) -> None:
    """A warning, not an error: more hosts than cores may be chosen on purpose (runs that mostly wait on I/O), but
    by accident busy runs share cores and the pipeline's throughput is less than the setting suggests."""
    cores = usable_cores()
    if processes > cores:
        log.warning("TALLY_ENGINE_PROCESSES is %d but this worker may use %d core(s): busy runs of its engine hosts "
                    "will share cores (fine when they mostly wait; else set it to the cores the worker may use)",
                    processes, cores)
