"""The supervisor (Celery beat, every few seconds): a pipeline that should run but has no live run gets
a new one — its worker was killed, its host died, or the run failed.

A run is live while its ConsumerRun row at the pipeline's current epoch has not ended (starting or running) and
its heartbeat is younger than the lease (`TALLY_RUN_LEASE_SECONDS`: `ConsumerRun.objects.alive`); with
`TALLY_SUPERVISOR_CHECK_LOCAL_PIDS`, a run on this host whose process is gone is dead at once. A pipeline of N
runs with fewer than N live is restarted whole; one whose run halted (`lifecycle.HALT_REASONS`) is left for an
operator; one whose run tasks still wait in the queue gets no more. Restarts back off exponentially
(`restart_after`), stop after `TALLY_SUPERVISOR_MAX_ATTEMPTS` consecutive attempts (the pipeline is then stopped,
with the reason), and every one is recorded in `Pipeline.last_error` and the action log (actor "supervisor"). Two
supervisors never both restart one pipeline: each claims the restart with a conditional UPDATE and only the one
whose row count is 1 enqueues.
"""
import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import models, transaction
from django.db.models import F, Q
from django.utils import timezone

from consumers.models import (
    LIVE_RUN_STATES,
    ActionLog,
    ActionResult,
    ConsumerRun,
    DesiredState,
    Pipeline,
    PipelineError,
)
from consumers.operations import actions

log = logging.getLogger("tally.supervisor")

ACTOR = "supervisor"


class Verdict(models.TextChoices):
    """What one supervisor pass decided for a pipeline that should run."""
    OK = "ok", "its runs are live"
    WAITING = "waiting", "waiting out its restart backoff"
    WAITING_FOR_WORKER = "waiting_for_worker", "its runs wait in the queue for a worker"
    HALTED = "halted", "a run halted on something a restart cannot cure: left for an operator"
    RESTARTED = "restarted", "restarted"
    GAVE_UP = "gave_up", "stopped after too many restarts"
    SKIPPED = "skipped", "left alone this pass"


@dataclass
class Decision:
    pipeline: str
    action: Verdict
    detail: str = ""


def supervise(now=None) -> list[Decision]:
    """One pass over the pipelines that should run. Returns what was decided for each."""
    now = now or timezone.now()
    decisions = []
    for pipeline in Pipeline.objects.filter(desired_state=DesiredState.RUNNING).order_by("pk"):
        try:
            decisions.append(_supervise_one(pipeline, now))
        except Exception as exc:  # one broken pipeline must not stop the supervision of the others
            log.exception("supervising %s failed", pipeline.name)
            decisions.append(Decision(pipeline.name, Verdict.SKIPPED, f"{type(exc).__name__}: {exc}"))
    return decisions


def live_runs(pipeline: Pipeline, now=None) -> list[ConsumerRun]:
    now = now or timezone.now()
    runs = ConsumerRun.objects.filter(pipeline=pipeline, epoch=pipeline.epoch).alive(now)
    return [run for run in runs if not _died_on_this_host(run)]


def _died_on_this_host(run: ConsumerRun) -> bool:
    # Saves waiting out the lease when the worker ran on this machine and its process is gone.
    if not settings.TALLY_SUPERVISOR_CHECK_LOCAL_PIDS or run.host != socket.gethostname() or not run.pid:
        return False
    try:
        os.kill(run.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _supervise_one(pipeline: Pipeline, now) -> Decision:
    runs = live_runs(pipeline, now)
    if pipeline.runs_waiting and len(runs) < pipeline.parallel_runs:
        if _run_tasks_lost(pipeline, now):
            return _restart_or_give_up(pipeline, f"its {pipeline.runs_waiting} run task(s) of epoch {pipeline.epoch}, "
                                                 f"queued since {pipeline.waiting_since:%H:%M:%S}, are no longer in "
                                                 f"the queue and no worker took them: lost", now)
        # Its run tasks are still in the queue: enqueueing more would only pile duplicates behind them.
        # Past TALLY_WORKER_WAIT_SECONDS the page and the no-consumer alert say it waits for a worker.
        return Decision(pipeline.name, Verdict.WAITING_FOR_WORKER,
                        f"{pipeline.runs_waiting} run task(s) queued since {pipeline.waiting_since:%H:%M:%S}, "
                        f"not yet taken by a worker")
    if runs and len(runs) < pipeline.parallel_runs and (_one_died(pipeline, runs) or _settled(runs, now)):
        halted = pipeline.runs.filter(epoch=pipeline.epoch).halted().order_by("-pk").first()
        if halted is not None:
            # One of its runs halted (a bad record under "stop", a sink error): a restart would halt again on
            # the same record, so, as for a single run, the pipeline is left for an operator.
            return Decision(pipeline.name, Verdict.HALTED, f"run {halted.pk} halted: {halted.end_reason}")
        # One of its processes died: the pipeline is restarted as a whole, like a single run.
        return _restart_or_give_up(pipeline, f"only {len(runs)} of its {pipeline.parallel_runs} runs are live "
                                             f"({_why_not_running(pipeline, now, live=runs)})", now)
    if runs:
        stable_since = now - timedelta(seconds=settings.TALLY_SUPERVISOR_STABLE_SECONDS)
        if pipeline.restart_attempts and any(run.started_at <= stable_since for run in runs):
            # Running steadily again: the next failure starts a fresh series of attempts.
            Pipeline.objects.filter(pk=pipeline.pk, restart_attempts=pipeline.restart_attempts).update(
                restart_attempts=0, restart_after=None)
        return Decision(pipeline.name, Verdict.OK, f"{len(runs)} live run(s)")
    if pipeline.restart_after and pipeline.restart_after > now:
        return Decision(pipeline.name, Verdict.WAITING, f"next attempt after {pipeline.restart_after:%H:%M:%S}")
    halted = pipeline.halted_run()
    if halted is not None:
        # A bad record under the "stop" policy or a database error that is not about data: a restart
        # would fail the same way. The no-consumer alert fires instead; an operator restarts it.
        return Decision(pipeline.name, Verdict.HALTED, f"run {halted.pk} halted: {halted.end_reason}")
    return _restart_or_give_up(pipeline, _why_not_running(pipeline, now), now)


def _restart_or_give_up(pipeline: Pipeline, reason: str, now) -> Decision:
    if pipeline.restart_after and pipeline.restart_after > now:
        return Decision(pipeline.name, Verdict.WAITING, f"next attempt after {pipeline.restart_after:%H:%M:%S}")
    if pipeline.restart_attempts >= settings.TALLY_SUPERVISOR_MAX_ATTEMPTS:
        return _give_up(pipeline, reason)
    return _restart(pipeline, reason, now)


def _run_tasks_lost(pipeline: Pipeline, now) -> bool:
    """The run tasks the pipeline waits for left the broker without a worker taking them (Redis lost its data, a
    purge, a worker killed between receiving a task and taking it): an empty queue, once a task a dead worker
    had reserved would have been redelivered (TALLY_TASK_REDELIVERY_SECONDS) and taken (a lease). A queue that
    holds tasks may hold them: waiting on is never wrong then, only a second task would be."""
    patience = timedelta(seconds=settings.TALLY_TASK_REDELIVERY_SECONDS + settings.TALLY_RUN_LEASE_SECONDS)
    if pipeline.waiting_since is None or now - pipeline.waiting_since < patience:
        return False
    return actions.queued_run_tasks() == 0


def _one_died(pipeline: Pipeline, runs: list[ConsumerRun]) -> bool:
    """A run of the current epoch other than the live ones exists: it ended, or its process is gone."""
    return ConsumerRun.objects.filter(pipeline=pipeline, epoch=pipeline.epoch).exclude(
        pk__in=[run.pk for run in runs]).exists()


def _settled(runs: list[ConsumerRun], now) -> bool:
    """The runs started together have had time to join (each waits up to PEERS_WAIT_S for its peers): fewer
    live ones than the pipeline asks for now means one died."""
    from consumers.engine.options import PEERS_WAIT_S

    settle = timedelta(seconds=settings.TALLY_RUN_LEASE_SECONDS + PEERS_WAIT_S)
    return min(run.started_at for run in runs) <= now - settle


def _why_not_running(pipeline: Pipeline, now, live: list[ConsumerRun] = ()) -> str:
    """Why the pipeline has no live run or, with its `live` runs, why the others of its epoch are not live."""
    runs = ConsumerRun.objects.filter(pipeline=pipeline)
    if live:
        # The live runs are not the reason: the run described is one of the epoch's others.
        runs = runs.filter(epoch=pipeline.epoch).exclude(pk__in=[run.pk for run in live])
    last = runs.order_by("-started_at").first()
    if last is None:
        return f"no other run joined epoch {pipeline.epoch}" if live else "no run has started"
    if last.state in LIVE_RUN_STATES:
        if _died_on_this_host(last):
            return f"run {last.pk} on {last.host} (pid {last.pid}) died"
        if last.epoch != pipeline.epoch:
            return f"no run joined epoch {pipeline.epoch} (the last run, {last.pk}, was of epoch {last.epoch})"
        age = (now - last.heartbeat_at).total_seconds()
        return f"run {last.pk} on {last.host} (pid {last.pid}) stopped heartbeating {age:.0f} s ago"
    return f"run {last.pk} on {last.host} ended: {last.end_reason or last.state}"


def _mark_dead_runs(pipeline: Pipeline, reason: str, now) -> None:
    """Runs still marked running whose heartbeat expired or whose process is gone crashed: say so, so that
    the dashboard shows it and the new run does not wait for them to leave."""
    alive = set(ConsumerRun.objects.filter(pipeline=pipeline).alive(now).values_list("pk", flat=True))
    for run in ConsumerRun.objects.filter(pipeline=pipeline).unended():
        if run.pk not in alive or _died_on_this_host(run):
            ConsumerRun.objects.filter(pk=run.pk).declare_crashed(f"declared dead by the supervisor: {reason}", now)


def backoff_seconds(attempts: int) -> float:
    """Seconds to leave the run started by attempt number `attempts` (0-based) before the next one."""
    base = settings.TALLY_SUPERVISOR_BACKOFF_SECONDS
    return min(base * (2 ** attempts), settings.TALLY_SUPERVISOR_BACKOFF_MAX_SECONDS)


def _restart(pipeline: Pipeline, reason: str, now) -> Decision:
    attempt = pipeline.restart_attempts + 1
    # The run we enqueue needs at least one lease to start heartbeating before we judge it.
    wait = max(backoff_seconds(pipeline.restart_attempts), settings.TALLY_RUN_LEASE_SECONDS)
    with transaction.atomic():
        runs = pipeline.parallel_runs
        claimed = Pipeline.objects.filter(
            Q(restart_after__isnull=True) | Q(restart_after__lte=now), pk=pipeline.pk,
            desired_state=DesiredState.RUNNING, epoch=pipeline.epoch,
            restart_attempts=pipeline.restart_attempts, runs_waiting=pipeline.runs_waiting,
        ).bump_epoch(restart_attempts=F("restart_attempts") + 1, restart_after=now + timedelta(seconds=wait),
                     last_error=PipelineError.RESTARTED.text(reason), updated_at=now, runs_waiting=runs,
                     waiting_since=now)
        if claimed != 1:
            return Decision(pipeline.name, Verdict.SKIPPED, "another supervisor or an operator acted first")
        epoch = pipeline.epoch + 1
        _mark_dead_runs(pipeline, reason, now)
        offsets = actions.positions(pipeline)
        ActionLog.objects.create(pipeline=pipeline, action="restart", actor=ACTOR,
                                 params={"attempt": attempt, "epoch": epoch}, offsets_before=offsets,
                                 offsets_after=offsets, result=ActionResult.DONE,
                                 message=f"attempt {attempt}: {reason}", finished_at=now)
        transaction.on_commit(lambda: actions.enqueue_or_note(pipeline.pk, epoch, runs, []))
    log.warning("%s: restarting (attempt %d): %s", pipeline.name, attempt, reason)
    return Decision(pipeline.name, Verdict.RESTARTED, f"attempt {attempt}: {reason}")


def _give_up(pipeline: Pipeline, reason: str) -> Decision:
    message = PipelineError.GAVE_UP.text(f"after {pipeline.restart_attempts} restart attempts; the pipeline is "
                                         f"stopped. Last reason: {reason}")
    with transaction.atomic():
        stopped = Pipeline.objects.filter(pk=pipeline.pk, desired_state=DesiredState.RUNNING,
                                          restart_attempts=pipeline.restart_attempts).bump_epoch(
            desired_state=DesiredState.STOPPED, last_error=message,
            restart_after=None, updated_at=timezone.now())
        if stopped != 1:
            return Decision(pipeline.name, Verdict.SKIPPED, "another supervisor or an operator acted first")
        ActionLog.objects.create(pipeline=pipeline, action="stop", actor=ACTOR,
                                 params={"attempts": pipeline.restart_attempts}, result=ActionResult.FAILED,
                                 message=message, finished_at=timezone.now())
    log.error("%s: %s", pipeline.name, message)
    return Decision(pipeline.name, Verdict.GAVE_UP, message)
