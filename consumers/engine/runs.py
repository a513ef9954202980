"""Pipeline runs inside a Celery worker: one long-lived task per run, stopped cleanly on warm shutdown.

The task takes the run (`run_in_worker`): Python-engine runs (either Kafka client) go to one of the worker's
engine host processes (consumers/engine/hosts.py, so that busy pipelines use every core), Spark runs stay in the
worker's own process, where its one Spark driver lives. Either way the run itself is `run_here`.

The task keeps its lease through the ConsumerRun heartbeat the engine writes (at most about a second
apart); the supervisor (consumers/operations/supervisor.py) restarts a pipeline whose runs stopped heartbeating.
A worker's warm shutdown sets every run's stop event, so runs commit what they hold and hand their
partitions over instead of being cut off mid-batch.
"""
import logging
import threading
import time

from django.conf import settings
from django.utils import timezone

from consumers import waiting
from consumers.engine import db, hosts
from consumers.engine.lifecycle import HALT_REASONS
from consumers.engine.options import PEERS_WAIT_S, RunOptions, StopEvent, engine_for
from consumers.models import ConsumerRun, DesiredState, Engine, Pipeline, PipelineError

# A fenced run ends within about a second (engine heartbeat) plus its consumer's close (up to 5 s).
OLDER_RUNS_WAIT_S = 20.0

log = logging.getLogger("tally.runs")

_lock = threading.Lock()
_stop_events: dict[str, StopEvent] = {}
# key -> reason: runs asked to stop before they began (a revoked task whose run still waits for older runs or for
# its peers); each stops as it begins.
_stopped_before_start: dict[str, str] = {}
# Set by the worker's warm shutdown. A run task the worker had already taken still starts after it (Celery runs
# what it reserved): such a run was never asked to stop, ran on and kept the worker from exiting. It ends at once
# instead, and the supervisor restarts the pipeline on a worker that is not going away.
_shutting_down = threading.Event()


def run_in_worker(pipeline_id: int, epoch: int, task_id: str = "", settled_peers: int = 0) -> dict:
    """The run task's work: take the run off the queue's count of waiting runs, then run it in an engine host
    process (kafka-python) or in this one (Spark), until it is stopped, fenced or fails."""
    db.take_turn()   # hundreds of tasks taken at once must not open hundreds of connections at once
    try:
        Pipeline.objects.filter(pk=pipeline_id, epoch=epoch).run_taken(timezone.now())
        skipped = _skip_reason(pipeline_id, epoch)
        engine = Pipeline.objects.filter(pk=pipeline_id).values_list("engine", flat=True).first()
    finally:
        # The task waits as long as the run runs: its thread's connection would sit idle all that time (a worker
        # of hundreds of pipelines would hold hundreds).
        db.end_turn()
    if skipped:
        return skipped
    if _shutting_down.is_set():
        return dict(hosts.SHUTTING_DOWN)
    if engine == Engine.PYTHON and settings.TALLY_ENGINE_PROCESSES > 0:
        return hosts.pool().run(pipeline_id, epoch, task_id=task_id, settled_peers=settled_peers,
                                stop_asked=_take_stop_asked)
    return run_here(pipeline_id, epoch, task_id=task_id, settled_peers=settled_peers)


def _skip_reason(pipeline_id: int, epoch: int) -> dict | None:
    """A task whose epoch is no longer the pipeline's (a newer action enqueued its own run) or whose pipeline
    should not run, does nothing."""
    pipeline = Pipeline.objects.filter(pk=pipeline_id).first()
    if pipeline is None:
        return {"reason": "skipped", "detail": f"pipeline {pipeline_id} no longer exists"}
    if pipeline.desired_state != DesiredState.RUNNING or pipeline.epoch != epoch:
        detail = (f"{pipeline.name} is {pipeline.desired_state} at epoch {pipeline.epoch}; "
                  f"this run was for epoch {epoch}")
        log.info("run task skipped: %s", detail)
        return {"reason": "skipped", "detail": detail}
    return None


def run_here(pipeline_id: int, epoch: int, task_id: str = "", settled_peers: int = 0, key: str = "") -> dict:
    """Run the pipeline in this process until it is stopped, fenced or fails (`stop_run(key)` stops it).
    With `settled_peers`, it first waits (bounded) until that many runs of its epoch hold partitions."""
    skipped = _skip_reason(pipeline_id, epoch)
    if skipped:
        return skipped
    pipeline = Pipeline.objects.get(pk=pipeline_id)
    if not _older_runs_ended(pipeline, epoch):
        detail = f"{pipeline.name}: runs of an older epoch are still live after {OLDER_RUNS_WAIT_S} s"
        log.warning("run task gives up: %s", detail)
        return {"reason": "skipped", "detail": detail}
    if settled_peers:
        _wait_for_settled_peers(pipeline, epoch, settled_peers)
    pipeline.refresh_from_db()
    if pipeline.desired_state != DesiredState.RUNNING or pipeline.epoch != epoch:
        return {"reason": "skipped", "detail": f"{pipeline.name} moved on while this run waited"}
    Pipeline.objects.filter(pk=pipeline_id, epoch=epoch).run_begun(timezone.now())
    engine = engine_for(pipeline.engine)
    stop = StopEvent()
    key = key or task_id or f"{pipeline_id}-{epoch}-{id(stop)}"
    if not _register(key, stop):
        return dict(hosts.SHUTTING_DOWN)
    try:
        result = engine(pipeline.name, RunOptions(stop=stop, task_id=task_id, epoch=epoch))
    finally:
        with _lock:
            _stop_events.pop(key, None)
    _after_run(pipeline, result)
    return {"reason": result.reason, "detail": getattr(result, "detail", ""), "records": result.records,
            "epoch": getattr(result, "epoch", epoch)}


def _register(key: str, stop: StopEvent) -> bool:
    """Make the run `key` stoppable by stop_run(key), stopped at once if it was asked before it began. False when
    the worker is shutting down: the run must not begin."""
    with _lock:
        if _shutting_down.is_set():
            return False
        _stop_events[key] = stop
    early = _take_stop_asked(key)
    if early is not None:
        stop.stop(early)
    return True


def _older_runs_ended(pipeline: Pipeline, epoch: int) -> bool:
    """Wait (bounded) until the runs this one replaces have left. They were fenced by the epoch bump and
    end within about a second; starting while they still hold partitions would only wait for them."""
    return waiting.wait_until(
        lambda: not ConsumerRun.objects.filter(pipeline=pipeline, epoch__lt=epoch).alive(timezone.now()).exists(),
        OLDER_RUNS_WAIT_S, pause=_pause)


def _wait_for_settled_peers(pipeline: Pipeline, epoch: int, peers: int) -> None:
    """Start only after `peers` runs of this epoch have their partitions: they take their shares one at a time.
    Bounded: with fewer partitions than runs some peers never get any, and this run joins anyway."""
    def settled_or_moved_on() -> bool:
        settled = ConsumerRun.objects.filter(pipeline=pipeline, epoch=epoch).alive(timezone.now()).exclude(
            assigned_partitions=[]).count()
        return settled >= peers or Pipeline.objects.filter(pk=pipeline.pk, epoch=epoch).count() == 0

    waiting.wait_until(settled_or_moved_on, PEERS_WAIT_S, pause=_pause)


def _pause(seconds: float) -> None:
    """A start-up wait on other runs: without its turn at a connection (db.take_turn), which the runs it waits
    for may need to end."""
    held = db.holds_turn()
    if held:
        db.end_turn()
    time.sleep(seconds)
    if held:
        db.take_turn()


def _after_run(pipeline: Pipeline, result) -> None:
    """A run that ended on its own (not fenced, not stopped by an operator) tells the supervisor why."""
    detail = getattr(result, "detail", "")
    if result.reason in HALT_REASONS:
        # A bad record under the "stop" policy, or a database error that is not about data: restarting
        # would fail the same way. The pipeline stays wanted-running without a consumer, so the supervisor
        # leaves it (Pipeline.halted_run) and the no-consumer alert fires at its next evaluation.
        from consumers.models import ActionLog, ActionResult

        ActionLog.objects.create(pipeline=pipeline, action="halt", actor="engine", params={"reason": result.reason},
                                 result=ActionResult.FAILED, message=PipelineError.HALTED.text(detail, result.reason),
                                 finished_at=timezone.now())
    elif result.reason == "error":
        # Only on the epoch it ran in: an action since (a restart, a stop) left its own state and error.
        Pipeline.objects.filter(pk=pipeline.pk, epoch=pipeline.epoch).set_error(PipelineError.RUN_FAILED, detail)


def stop_all_runs(reason: str = "worker shutting down") -> int:
    """Ask every run of this process, and of its engine hosts, to stop (warm shutdown). Returns how many
    were asked."""
    with _lock:
        _shutting_down.set()
        events = list(_stop_events.values())
    for event in events:
        event.stop(reason)
    pool = hosts.existing_pool()
    hosted = pool.stop_all(reason) if pool is not None else 0
    if events or hosted:
        log.info("%s: asked %d run(s) to stop", reason, len(events) + hosted)
    return len(events) + hosted


def stop_run(key: str, reason: str = "", *, before_start: bool = False) -> bool:
    """Ask the run started with `key` to stop (`reason` goes into its end reason). Returns whether this process
    holds it. With `before_start`, a run that has not begun yet under `key` stops as it begins."""
    with _lock:
        event = _stop_events.get(key)
        if event is None and before_start:
            _stopped_before_start[key] = reason
    if event is not None:
        event.stop(reason)
    return event is not None


def stop_task_run(task_id: str, reason: str) -> bool:
    """Ask the run of the run task `task_id` to stop cleanly, in an engine host or in this process (a run's key is
    its task's id in both), even if it has not begun yet. Returns whether a host or this process holds it now.

    Remembered first, then asked of the hosts: a run being handed to a host (HostPool.run) is either held there
    when the hosts are asked, or takes the remembered stop once it is (`_take_stop_asked`)."""
    held_here = stop_run(task_id, reason, before_start=True)
    pool = hosts.existing_pool()
    if pool is not None and pool.stop_run(task_id, reason):
        _take_stop_asked(task_id)
        return True
    return held_here


def _take_stop_asked(key: str) -> str | None:
    """The reason of a stop asked of the run `key` before it began here or in a host, forgetting it."""
    with _lock:
        return _stopped_before_start.pop(key, None)


def active_runs() -> int:
    with _lock:
        own = len(_stop_events)
    pool = hosts.existing_pool()
    return own + (pool.active_runs() if pool is not None else 0)
