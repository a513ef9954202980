"""Celery tasks of the operating layer: pipeline runs and the supervisor. Thin wrappers (consumers/engine/runs.py,
consumers/operations/supervisor.py do the work).

The run task is long-lived (as long as the pipeline runs) and acknowledged on receipt: if its worker
dies, the supervisor enqueues a new run rather than the broker redelivering this one an hour later.
Workers use the threads pool (Spark must never start in a prefork child).
"""
from celery import shared_task
from celery.signals import worker_shutting_down

from consumers.operations.actions import RUN_PIPELINE_TASK


@shared_task(name=RUN_PIPELINE_TASK, bind=True, acks_late=False, ignore_result=False)
def run_pipeline_task(self, pipeline_id: int, epoch: int, settled_peers: int = 0):
    from consumers.engine.runs import run_in_worker

    return run_in_worker(pipeline_id, epoch, task_id=self.request.id or "", settled_peers=settled_peers)


@shared_task(name="consumers.supervise", ignore_result=True)
def supervise_task():
    from consumers.operations.supervisor import Verdict, supervise

    decisions = supervise()
    return [d.__dict__ for d in decisions if d.action != Verdict.OK]


@worker_shutting_down.connect
def _stop_runs_on_warm_shutdown(sig=None, how=None, exitcode=None, **kwargs):
    # Warm shutdown waits for running tasks: ask the runs to end cleanly (commit, leave the group).
    from consumers.engine.runs import stop_all_runs

    stop_all_runs(f"worker shutting down ({how or sig})")
