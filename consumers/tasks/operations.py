"""Celery tasks of the operating layer: pipeline runs and the supervisor. Thin wrappers (consumers/engine/runs.py,
consumers/operations/supervisor.py do the work).

The run task is long-lived (as long as the pipeline runs) and acknowledged on receipt: if its worker
dies, the supervisor enqueues a new run rather than the broker redelivering this one an hour later.
Workers use the threads pool (Spark must never start in a prefork child).
"""
import logging

from celery import shared_task
from celery.signals import task_revoked, worker_init, worker_ready, worker_shutting_down
from django.conf import settings

from consumers.operations.actions import RUN_PIPELINE_TASK, send_run
from consumers.tasks.worker_pool import tally_pool_for

log = logging.getLogger("tally.runs")


@shared_task(name=RUN_PIPELINE_TASK, bind=True, acks_late=False, ignore_result=False)
def run_pipeline_task(self, pipeline_id: int, epoch: int, settled_peers: int = 0):
    from consumers.engine.runs import run_in_worker

    # A run task taken off another queue (an older release sent runs to `celery`, and one left there at an upgrade
    # goes to the periodic-task worker) must not hold that worker's thread: it moves to the pipeline queue, still
    # counted as waiting (Pipeline.runs_waiting), since the supervisor sends no other run while it waits.
    queue = (self.request.delivery_info or {}).get("routing_key")
    if queue and queue != settings.TALLY_PIPELINE_QUEUE:
        moved_to = send_run(pipeline_id, epoch, settled_peers)
        log.info("run task of pipeline %s epoch %s taken off queue %r: sent to %r as %s", pipeline_id, epoch, queue,
                 settings.TALLY_PIPELINE_QUEUE, moved_to)
        return {"reason": "skipped", "detail": f"moved from queue {queue!r} to {settings.TALLY_PIPELINE_QUEUE!r}"}
    return run_in_worker(pipeline_id, epoch, task_id=self.request.id or "", settled_peers=settled_peers)


@shared_task(name="consumers.supervise", ignore_result=True)
def supervise_task():
    from consumers.operations.supervisor import Verdict, supervise

    decisions = supervise()
    return [d.__dict__ for d in decisions if d.action != Verdict.OK]


@shared_task(name="consumers.end_frozen_copies", ignore_result=True)
def end_frozen_copies_task() -> list[int]:
    """Beat: end engine sessions frozen in the middle of a COPY (consumers/operations/frozen_copies.py). A task of its
    own, not a step of the supervisor's pass: the pass may itself be waiting on the lock such a session holds."""
    from consumers.operations.frozen_copies import end_frozen_copies

    return end_frozen_copies()



@worker_init.connect
def _use_tallys_thread_pool(sender=None, **kwargs):
    # Sent before the worker makes its pool: `--pool threads` (the compose files, devstack, the docs, commands already
    # written) gets Tally's subclass, whose cold shutdown asks the runs to stop instead of hanging
    # (consumers/tasks/worker_pool.py). `--pool` takes only Celery's names, so it cannot name the class itself.
    if sender is not None and getattr(sender, "pool_cls", None) is not None:
        sender.pool_cls = tally_pool_for(sender.pool_cls)


@worker_ready.connect
def _start_engine_hosts(sender=None, **kwargs):
    # A worker that takes run tasks starts its engine host processes now, not when its first run arrives: a
    # restarted pipeline's run then starts within its lease (consumers/engine/hosts.py).
    queues = {queue.name for queue in getattr(getattr(sender, "task_consumer", None), "queues", None) or ()}
    if settings.TALLY_ENGINE_PROCESSES <= 0 or settings.TALLY_PIPELINE_QUEUE not in queues:
        return
    from consumers.engine import hosts

    hosts.warn_if_more_hosts_than_cores(settings.TALLY_ENGINE_PROCESSES)
    hosts.pool().start()
    log.info("%d engine host process(es) started: %s", len(hosts.pool().pids()), hosts.pool().pids())


@task_revoked.connect
def _stop_a_revoked_run(sender=None, request=None, terminated=False, **kwargs):
    # `celery control revoke --terminate TASK_ID` on a run task: a thread cannot be ended, so its run is asked to stop
    # cleanly (after its batch, committing what it holds). The supervisor then does what the pipeline's desired state
    # says: a running pipeline gets a new run; `pipeline stop` is how to stop one.
    if terminated and getattr(sender, "name", None) == RUN_PIPELINE_TASK and request is not None:
        from consumers.engine.runs import stop_task_run

        if not stop_task_run(request.id, "revoked (celery control revoke --terminate)"):
            log.info("run task %s revoked with no run going: a run of it stops as it begins", request.id)


@worker_shutting_down.connect
def _stop_runs_on_warm_shutdown(sig=None, how=None, exitcode=None, **kwargs):
    # Warm shutdown waits for running tasks: ask the runs to end cleanly (commit, leave the group). A cold shutdown
    # sends this only once the pool has stopped, having asked the runs itself (consumers/tasks/worker_pool.py).
    from consumers.engine.runs import stop_all_runs

    stop_all_runs(f"worker shutting down ({how or sig})")
