"""The delivery-guarantees demo as seen from the web: one run at a time, its progress and result kept in
Redis (the web process and the Celery worker are different processes, so a process-local cache would not
do), and reconciliation's numbers taken right after the run.

One run at a time: a run holds the lock (LOCK_KEY = its run_id) while it lives. request_run claims it for
QUEUED_SECONDS, the time a worker has to take the task; the run then keeps it on a short lease
(LEASE_SECONDS), renewed by a heartbeat thread and with every progress write, so that a run whose worker died
(SIGKILL, a lost host) lets go within a lease, not after the demo's longest run. A state that says "queued" or
"running" counts only while the lock holds its run_id (`current_state`): otherwise the page shows it
interrupted, and a new run may start.
"""
import json
import logging
import threading
import time
import uuid

import redis
from celery import current_app
from django.conf import settings
from django.utils import timezone

log = logging.getLogger("tally.demo")

STATE_KEY = "tally:demo:state"
LOCK_KEY = "tally:demo:lock"
# A requested run's claim on the demo until a worker takes its task: past that, no worker took it (none
# consumes the queue), the page shows it interrupted and a new run may be requested.
QUEUED_SECONDS = 5 * 60
# A running run's lease on the lock. The heartbeat renews it every HEARTBEAT_S, whatever step the run is in
# (seeding with a topic delete of up to a minute, the Spark run stopping, reconciliation), so the lease only
# has to outlast a few missed beats: a worker that died lets the demo go within this long.
LEASE_SECONDS = 60
HEARTBEAT_S = 10.0
# The most a run holds the demo, heartbeat or not (a step hung for good): longer than the demo's own timeout.
LOCK_SECONDS = 15 * 60
DEMO_TIMEOUT_S = 600.0
REDIS_TIMEOUT_S = 5
# Enqueued by name: the tasks import this module, never the reverse (consumers/tasks/demo.py).
RUN_DEMO_TASK = "tally.demo.run"
ACTIVE_STATES = ("queued", "running")
INTERRUPTED = "interrupted"

# Renew (or take, when it is free and the stored state is this run's) the lock for this run, write its state if one
# is given, or release the lock after writing it. 1 if done, 0 if another run holds the demo (nothing written).
# KEYS: lock, state; ARGV: run_id, lease seconds, state JSON or "", "1" to release.
_HOLD = """
local holder = redis.call('GET', KEYS[1])
if not holder then
  local raw = redis.call('GET', KEYS[2])
  if raw then
    local ok, stored = pcall(cjson.decode, raw)
    if not ok or type(stored) ~= 'table' or stored['run_id'] ~= ARGV[1] then return 0 end
  end
elseif holder ~= ARGV[1] then
  return 0
end
if ARGV[3] ~= '' then redis.call('SET', KEYS[2], ARGV[3]) end
if ARGV[4] == '1' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end
return 1
"""


def _redis():
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=REDIS_TIMEOUT_S,
                                socket_connect_timeout=REDIS_TIMEOUT_S)


def read_state() -> dict | None:
    raw = _redis().get(STATE_KEY)
    return json.loads(raw) if raw else None


def write_state(state: dict) -> None:
    _redis().set(STATE_KEY, json.dumps(state, default=str))


def current_state() -> dict | None:
    """The last run's state as the page shows it: a "queued" or "running" run whose lock has gone (its worker
    died, or no worker took its task) is interrupted, and so are its pipelines that were still going. Reads
    only (a GET never writes): the next run replaces it."""
    raw, holder = _redis().mget(STATE_KEY, LOCK_KEY)
    state = json.loads(raw) if raw else None
    if not state or state.get("state") not in ACTIVE_STATES or holder == str(state.get("run_id")).encode():
        return state
    why = ("no worker took it" if state["state"] == "queued"
           else f"its worker stopped sending a heartbeat for {LEASE_SECONDS} s")
    pipelines = {name: ({**status, "state": INTERRUPTED} if status.get("state") in ("starting", "running") else status)
                 for name, status in (state.get("pipelines") or {}).items()}
    return {**state, "state": INTERRUPTED, "pipelines": pipelines,
            "error": state.get("error") or f"This demo run was interrupted ({why}): start a new run."}


class DemoBusy(RuntimeError):
    pass


class DemoTakenOver(RuntimeError):
    """Another run holds the demo: this one lost its lease (its worker stalled past it) and must stop."""


class _Lease:
    """A run's hold on the demo lock: renewed with every state write and by a heartbeat thread, until released
    or for LOCK_SECONDS at most."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.client = _redis()
        self.script = self.client.register_script(_HOLD)
        self.ended = threading.Event()
        self.thread: threading.Thread | None = None

    def hold(self, state: dict | None = None, release: bool = False) -> bool:
        payload = json.dumps(state, default=str) if state is not None else ""
        return bool(self.script(keys=[LOCK_KEY, STATE_KEY],
                                args=[self.run_id, LEASE_SECONDS, payload, "1" if release else "0"]))

    def write(self, state: dict) -> None:
        if not self.hold(state):
            raise DemoTakenOver(f"Another demo run holds the demo: run {self.run_id} stops.")

    def start_heartbeat(self) -> None:
        self.thread = threading.Thread(target=self._beat, daemon=True, name=f"tally-demo-lease-{self.run_id}")
        self.thread.start()

    def _beat(self) -> None:
        until = time.monotonic() + LOCK_SECONDS
        while not self.ended.wait(HEARTBEAT_S) and time.monotonic() < until:
            try:
                if not self.hold():
                    log.warning("Demo run %s lost its lock to another run", self.run_id)
                    return
            except redis.RedisError as exc:   # the next beat tries again, well within the lease
                log.warning("Demo run %s could not renew its lock: %s", self.run_id, exc)

    def end(self, state: dict) -> None:
        self.ended.set()
        if self.thread is not None:
            self.thread.join(timeout=REDIS_TIMEOUT_S * 2)
        if not self.hold(state, release=True):
            log.warning("Demo run %s ended after another run took the demo: its result is not kept", self.run_id)


def request_run(records: int, crash_probability: float, user: str, seed: int, preset: str = "") -> str:
    """Claim the single demo slot (SET NX) and enqueue the task; raise DemoBusy if a run is going on."""
    run_id = uuid.uuid4().hex[:12]
    if not _redis().set(LOCK_KEY, run_id, nx=True, ex=QUEUED_SECONDS):
        raise DemoBusy("A demo run is already in progress: wait for it to finish.")
    try:
        write_state({"run_id": run_id, "state": "queued", "records": records,
                     "crash_probability": crash_probability, "seed": seed, "preset": preset,
                     "requested_by": user, "started_at": timezone.now().isoformat(), "pipelines": {}})
        current_app.signature(RUN_DEMO_TASK, args=(run_id, records, crash_probability, seed)).delay()
    except Exception:
        _redis().delete(LOCK_KEY)  # nothing was enqueued: do not block the next try for QUEUED_SECONDS
        raise
    return run_id


def run(run_id: str, records: int, crash_probability: float, seed: int, pipelines: list[str] | None = None) -> dict:
    """Run the classic demo, recording progress, then reconcile the demo pipelines. Called by the task;
    `pipelines` limits the run to some demo pipelines (default: all). A run whose demo another run holds
    (its claim expired before a worker took it, and a new run was requested) does nothing."""
    from consumers.demo import classic as demo

    state = read_state() or {}
    if state.get("run_id") not in (None, run_id):
        state = {}
    state.update(run_id=run_id, state="running", records=records, crash_probability=crash_probability,
                 seed=seed)
    lease = _Lease(run_id)
    if not lease.hold(state):
        log.warning("Demo run %s does not start: another run holds the demo", run_id)
        return {"run_id": run_id, "state": "superseded"}
    lease.start_heartbeat()

    def progress(pipelines: dict) -> None:
        state["pipelines"] = pipelines
        lease.write(state)

    try:
        result = demo.run_classic_demo(records=records, crash_probability=crash_probability, progress=progress,
                                       seed=seed, timeout_s=DEMO_TIMEOUT_S, pipelines=pipelines)
        state["pipelines"] = result
        state["reconciliation"] = reconcile_demo_pipelines()
        if pipelines is None:
            state["watched"] = watch_plain_consumer(records, seed)
        state["state"] = "done"
    except Exception as exc:  # the page must show why the run failed instead of spinning forever
        state.update(state="failed", error=f"{type(exc).__name__}: {exc}")
    finally:
        state["finished_at"] = timezone.now().isoformat()
        lease.end(state)
    return state


def watch_plain_consumer(records: int, seed: int) -> dict:
    """The consumer Tally does not run (examples/plain_consumer.py) and what its watch found; a failure is
    reported on the page, it does not fail the demo."""
    from consumers.demo import watched

    try:
        return watched.run_watched_consumer(records, seed)
    except Exception as exc:
        return {"state": "failed", "error": f"{type(exc).__name__}: {exc}"}


def reconcile_demo_pipelines() -> dict:
    """Reconciliation's verdict per demo pipeline (lost, duplicated, phantom), computed from offsets,
    ledger and sink — independent of the demo's own row count it is shown next to."""
    from consumers.demo.classic import DEMO_PIPELINES
    from consumers.models import Pipeline

    try:
        from consumers.reconciliation.reconcile import reconcile_pipeline
    except ImportError:
        return {}
    numbers = {}
    for pipeline in Pipeline.objects.filter(name__in=[d.name for d in DEMO_PIPELINES]):
        report = reconcile_pipeline(pipeline)
        numbers[pipeline.name] = _report_numbers(report)
    return numbers


def _report_numbers(report) -> dict:
    data = report.as_json() if hasattr(report, "as_json") else dict(report)
    return {key: data.get(key) for key in ("status", "lost", "duplicated", "phantom", "dead_lettered")}
