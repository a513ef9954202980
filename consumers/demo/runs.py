"""The delivery-guarantees demo as seen from the web: one run at a time, its progress and result kept in
Redis (the web process and the Celery worker are different processes, so a process-local cache would not
do), and reconciliation's numbers taken right after the run.
"""
import json
import uuid

import redis
from celery import current_app
from django.conf import settings
from django.utils import timezone

STATE_KEY = "tally:demo:state"
LOCK_KEY = "tally:demo:lock"
# Longer than the demo's own timeout (run_classic_demo's timeout_s), so a dead worker frees the lock.
LOCK_SECONDS = 15 * 60
DEMO_TIMEOUT_S = 600.0
REDIS_TIMEOUT_S = 5
# Enqueued by name: the tasks import this module, never the reverse (consumers/tasks/demo.py).
RUN_DEMO_TASK = "tally.demo.run"


def _redis():
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=REDIS_TIMEOUT_S,
                                socket_connect_timeout=REDIS_TIMEOUT_S)


def read_state() -> dict | None:
    raw = _redis().get(STATE_KEY)
    return json.loads(raw) if raw else None


def write_state(state: dict) -> None:
    _redis().set(STATE_KEY, json.dumps(state, default=str))


class DemoBusy(RuntimeError):
    pass


def request_run(records: int, crash_probability: float, user: str, seed: int, preset: str = "") -> str:
    """Claim the single demo slot (SET NX) and enqueue the task; raise DemoBusy if a run is going on."""
    run_id = uuid.uuid4().hex[:12]
    if not _redis().set(LOCK_KEY, run_id, nx=True, ex=LOCK_SECONDS):
        raise DemoBusy("A demo run is already in progress: wait for it to finish.")
    try:
        write_state({"run_id": run_id, "state": "queued", "records": records,
                     "crash_probability": crash_probability, "seed": seed, "preset": preset,
                     "requested_by": user, "started_at": timezone.now().isoformat(), "pipelines": {}})
        current_app.signature(RUN_DEMO_TASK, args=(run_id, records, crash_probability, seed)).delay()
    except Exception:
        _redis().delete(LOCK_KEY)  # nothing was enqueued: do not block the next try for LOCK_SECONDS
        raise
    return run_id


def run(run_id: str, records: int, crash_probability: float, seed: int, pipelines: list[str] | None = None) -> dict:
    """Run the classic demo, recording progress, then reconcile the demo pipelines. Called by the task;
    `pipelines` limits the run to some demo pipelines (default: all)."""
    from consumers.demo import classic as demo

    state = read_state() or {}
    state.update(run_id=run_id, state="running", records=records, crash_probability=crash_probability,
                 seed=seed)
    write_state(state)

    def progress(pipelines: dict) -> None:
        state["pipelines"] = pipelines
        write_state(state)

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
        write_state(state)
        client = _redis()
        if client.get(LOCK_KEY) == run_id.encode():
            client.delete(LOCK_KEY)
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
