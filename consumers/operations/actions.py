"""Operator actions on Tally pipelines: start, stop, pause, resume, restart — audited.

The dashboard views, the JSON API and the command line all call these functions. Every call writes one
`ActionLog` row (who, when, what, parameters, offsets before/after, result, message), refusals included.

Epochs (docs/architecture.md): every action bumps `Pipeline.epoch` under the pipeline's row lock. The
lock waits for batches in flight (the commit protocol holds the row FOR SHARE), so once the bump commits
no write of the old epoch can land; the old run notices the new epoch at its next heartbeat (about a
second) and ends. `start`, `resume` and `restart` then enqueue a run, which joins the new epoch.
"""
import logging
from dataclasses import dataclass
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from consumers.access import record_refusal
from consumers.kafka import clusters
from consumers.kafka.errors import ClusterConfigError
from consumers.models import (
    ActionLog,
    ActionResult,
    DesiredState,
    PartitionOffset,
    Pipeline,
    PipelineError,
    error_text,
    runs_problem,
)
from consumers.operations.errors import Refused

log = logging.getLogger("tally.actions")

ActionRefused = Refused   # the name callers outside the rewind code expect

# An action still marked "running" after this long was abandoned (its process died): it no longer blocks.
STALE_ACTION_AFTER = timedelta(minutes=10)

# Enqueued by name: the tasks import this module, never the reverse (consumers/tasks/operations.py).
RUN_PIPELINE_TASK = "consumers.run_pipeline"


@dataclass(frozen=True)
class Transition:
    allowed_from: tuple[str, ...]
    to: str
    enqueue_run: bool
    refusal: str


TRANSITIONS = {
    "start": Transition((DesiredState.STOPPED, DesiredState.PAUSED), DesiredState.RUNNING, True,
                        "it is already running; use restart to start a new run"),
    "stop": Transition((DesiredState.RUNNING, DesiredState.PAUSED), DesiredState.STOPPED, False,
                       "it is already stopped"),
    "pause": Transition((DesiredState.RUNNING,), DesiredState.PAUSED, False, "it is not running"),
    "resume": Transition((DesiredState.PAUSED,), DesiredState.RUNNING, True, "it is not paused"),
    "restart": Transition((DesiredState.RUNNING,), DesiredState.RUNNING, True, "it is not running; use start"),
}
ACTIONS = tuple(TRANSITIONS)


def start(name, actor: str = "cli", runs: int | None = None) -> ActionLog:
    return perform("start", name, actor, runs=runs)


def stop(name, actor: str = "cli") -> ActionLog:
    return perform("stop", name, actor)


def pause(name, actor: str = "cli") -> ActionLog:
    return perform("pause", name, actor)


def resume(name, actor: str = "cli", runs: int | None = None) -> ActionLog:
    return perform("resume", name, actor, runs=runs)


def restart(name, actor: str = "cli", runs: int | None = None) -> ActionLog:
    return perform("restart", name, actor, runs=runs)


def perform(action: str, name, actor: str = "cli", *, runs: int | None = None) -> ActionLog:
    """Do `action` on the pipeline `name` (a name or a Pipeline). Returns the ActionLog row; raises
    Refused (with `.action_log` set) when the action is not allowed now. `runs`: how many runs to enqueue
    (default: the pipeline's `parallel_runs`, which another number replaces from now on, audited)."""
    if action not in TRANSITIONS:
        raise ValueError(f"Unknown action {action!r}: use one of {', '.join(ACTIONS)}.")
    transition = TRANSITIONS[action]
    params = {"runs": runs} if transition.enqueue_run and runs is not None else {}
    enqueue_failures: list[str] = []
    pipeline = lookup(name, action, actor, params)
    if runs is None:
        runs = pipeline.parallel_runs
    if transition.enqueue_run and (problem := runs_problem(runs, pipeline.engine)):
        refuse(pipeline, action, actor, params, f"Cannot {action} pipeline {pipeline.name!r}: {problem}.")
    if transition.enqueue_run and (problem := cluster_problem(pipeline)):
        refuse(pipeline, action, actor, params, f"Cannot {action} pipeline {pipeline.name!r}: {problem}.")
    with transaction.atomic():
        locked = Pipeline.objects.select_for_update().get(pk=pipeline.pk)
        problem = busy_reason(locked)
        if problem is None and locked.desired_state not in transition.allowed_from:
            problem = f"Cannot {action} pipeline {locked.name!r}: {transition.refusal} (desired state " \
                      f"{locked.desired_state})."
        if problem is not None:
            entry = None  # written after the rollback below, so the refusal is recorded
        else:
            before = positions(locked)
            done = f"{action}: desired state {transition.to}"
            if transition.enqueue_run and runs != locked.parallel_runs:
                # Durably: the supervisor keeps parallel_runs live, and would restart back to the old number.
                params["parallel_runs_before"] = locked.parallel_runs
                Pipeline.objects.filter(pk=locked.pk).update(parallel_runs=runs)
            epoch = set_state(locked, transition.to, enqueue_runs=runs if transition.enqueue_run else 0,
                              enqueue_failures=enqueue_failures)
            done += f", epoch {epoch}"
            if "parallel_runs_before" in params:
                done += f", runs {params['parallel_runs_before']} -> {runs}"
            entry = ActionLog.objects.create(
                pipeline=locked, action=action, actor=actor, params={**params, "epoch": epoch},
                offsets_before=before, offsets_after=before, result=ActionResult.DONE,
                message=done + (f", {runs} run(s) enqueued" if transition.enqueue_run else ""),
                finished_at=timezone.now())
    if entry is None:
        refuse(pipeline, action, actor, params, problem)
    if enqueue_failures:
        # Never "done" without a run enqueued: the action is recorded failed, with the reason.
        # Without the "N run(s) enqueued" of a success: the log must not say both.
        message = (f"{done}; but no run was enqueued: {enqueue_failures[0]}. The supervisor starts "
                   f"one when the task broker is back.")
        ActionLog.objects.filter(pk=entry.pk).update(result=ActionResult.FAILED, message=error_text(message))
        entry.refresh_from_db()
    log.info("%s %s by %s: %s", action, pipeline.name, actor, entry.message)
    return entry


def set_state(pipeline: Pipeline, desired_state: str, *, enqueue_runs: int = 0, last_error: str = "",
              enqueue_failures: list[str] | None = None) -> int:
    """Inside a transaction holding the pipeline's row lock: set the desired state, bump the epoch, clear
    the supervisor's restart counter and (after commit) enqueue runs of the new epoch. Returns the epoch.
    A failed enqueue (the task broker is down) is appended to `enqueue_failures` and left on the pipeline
    (`last_error`), never raised after the commit."""
    now = timezone.now()
    grace = now + timedelta(seconds=settings.TALLY_RUN_LEASE_SECONDS) if enqueue_runs else None
    pipeline.bump_epoch(
        desired_state=desired_state, restart_attempts=0,
        # The supervisor leaves a freshly enqueued run one lease to start before it steps in.
        restart_after=grace, last_error=last_error, updated_at=now,
        # The new epoch's tasks wait in the queue until a worker takes them (Pipeline.waiting_for_worker).
        runs_waiting=enqueue_runs, waiting_since=now if enqueue_runs else None)
    if enqueue_runs:
        epoch, pipeline_id = pipeline.epoch, pipeline.pk
        failures = enqueue_failures if enqueue_failures is not None else []
        transaction.on_commit(lambda: enqueue_or_note(pipeline_id, epoch, enqueue_runs, failures))
    return pipeline.epoch


def enqueue_or_note(pipeline_id: int, epoch: int, runs: int, failures: list[str]) -> list[str]:
    """enqueue_run, but a broker outage becomes a reason in `failures` and on the pipeline."""
    try:
        return enqueue_run(pipeline_id, epoch, runs)
    except Exception as exc:  # kombu's OperationalError and friends: Redis is down or unreachable
        reason = f"the task broker is unreachable ({type(exc).__name__}: {exc})"
        log.error("pipeline %s epoch %s: %s", pipeline_id, epoch, reason)
        Pipeline.objects.filter(pk=pipeline_id, epoch=epoch).set_error(PipelineError.NOT_ENQUEUED, reason,
                                                                     runs_waiting=0, waiting_since=None)
        failures.append(reason)
        return []


def enqueue_run(pipeline_id: int, epoch: int, runs: int = 1) -> list[str]:
    """Send `runs` run tasks of `epoch` to the Celery workers (they share the partitions through the database:
    consumers/engine/shares.py). Returns the task ids."""
    # Run i starts once i runs of the epoch hold partitions, so the runs take their shares one at a time.
    return [send_run(pipeline_id, epoch, i) for i in range(runs)]


def send_run(pipeline_id: int, epoch: int, settled_peers: int = 0) -> str:
    """Send one run task to the pipeline queue. Returns its task id."""
    return (current_app.signature(RUN_PIPELINE_TASK, args=(pipeline_id, epoch, settled_peers))
            .apply_async(queue=settings.TALLY_PIPELINE_QUEUE).id)


def queued_run_tasks() -> int | None:
    """How many tasks wait in the pipeline queue, by the broker's count; None when the broker cannot be asked."""
    return queued_tasks(settings.TALLY_PIPELINE_QUEUE)


def queued_tasks(queue: str) -> int | None:
    """How many tasks wait in `queue`, by the broker's count; None when the broker cannot be asked."""
    try:
        with current_app.connection_for_read() as connection:
            connection.ensure_connection(max_retries=1)
            return connection.default_channel.queue_declare(queue=queue).message_count
    except Exception as exc:  # kombu's OperationalError and friends: the broker is down or unreachable
        log.warning("could not count the tasks queued in %r: %s: %s", queue, type(exc).__name__, exc)
        return None


def lookup(name, action: str, actor: str, params: dict) -> Pipeline:
    """The pipeline called `name` (or `name` itself if it is a Pipeline); an unknown name is refused."""
    if isinstance(name, Pipeline):
        return name
    pipeline = Pipeline.objects.filter(name=name).first()
    if pipeline is None:
        refuse(None, action, actor, {**params, "pipeline": name}, f"No pipeline named {name!r}.")
    return pipeline


def cluster_problem(consumed) -> str | None:
    """Why the cluster a pipeline or watch names cannot be used (not configured, or its settings are wrong, also
    those read only when a client is built: a secret file removed or empty), or None. Asked before anything
    moves: a run, a rewind or a check on it would only fail later."""
    try:
        clusters.check_settings(consumed.cluster or clusters.DEFAULT)
    except ClusterConfigError as exc:
        return str(exc)
    return None


def busy_reason(pipeline: Pipeline) -> str | None:
    """Why another action may not start now (one already running on this pipeline), or None."""
    running = (ActionLog.objects.filter(pipeline=pipeline, result=ActionResult.RUNNING,
                                        created_at__gte=timezone.now() - STALE_ACTION_AFTER)
               .order_by("-created_at").first())
    if running is None:
        return None
    return (f"Another action is running on pipeline {pipeline.name!r}: {running.action} by {running.actor} "
            f"since {running.created_at:%Y-%m-%d %H:%M:%S} UTC. Try again when it has finished.")


def claim(pipeline: Pipeline, action: str, actor: str, params: dict) -> ActionLog:
    """Mark a long action (a rewind) as running on the pipeline; refused if another one is running.
    The pipeline's row lock makes check-and-insert atomic between concurrent operators."""
    with transaction.atomic():
        locked = Pipeline.objects.select_for_update().get(pk=pipeline.pk)
        problem = busy_reason(locked)
        if problem is None:
            return ActionLog.objects.create(pipeline=locked, action=action, actor=actor, params=params,
                                            offsets_before=positions(locked), result=ActionResult.RUNNING)
    refuse(pipeline, action, actor, params, problem)


def refuse(pipeline: Pipeline | None, action: str, actor: str, params: dict, message: str, *,
           dry_run: bool = False, entry: ActionLog | None = None, kind: type[Refused] = Refused):
    """Record a refusal (consumers.access.record_refusal: a new row, or `entry` if the action was already
    logged) and raise it as `kind` (Refused, or a subclass a door tells apart, e.g. Unavailable), for the
    domain's callers that answer a refusal by an exception."""
    entry = record_refusal(actor, action, message, pipeline=pipeline, params=params, dry_run=dry_run, entry=entry)
    error = kind(message)
    error.action_log = entry
    raise error


def positions(pipeline: Pipeline) -> dict[str, int]:
    """The DB's next offset per partition, as the action log stores it ({"0": n, ...})."""
    return {str(p): n for p, n in
            PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset")}
