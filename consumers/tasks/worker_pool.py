"""The workers' task pool: Celery's threads pool, made to survive a cold shutdown (SIGQUIT, a second Ctrl-C).

Celery's cold shutdown (celery/apps/worker.py, on_cold_shutdown) cancels every running task through the pool's
terminate_job, then stops the pool, which waits for the tasks' threads to end, and only then sends
worker_shutting_down, where Tally asks its runs to stop (consumers/tasks/operations.py). The threads pool cannot end
a thread: its terminate_job raised NotImplementedError, which aborted the shutdown before any run was asked to stop,
and the worker then waited for ever for run tasks that go on as long as their pipelines run.

Here a task's thread is not ended either, and need not be: stopping the pool asks every run of the worker (and of
its engine hosts) to stop cleanly, and the wait for the threads is then the wait for the runs to end (each after its
batch, or declared crashed by its host 8 s after it was asked). A warm shutdown has already asked them by then.
"""
import logging

from celery.concurrency import get_implementation
from celery.concurrency.thread import TaskPool as CeleryThreadPool

log = logging.getLogger("tally.runs")


class ThreadPool(CeleryThreadPool):
    def terminate_job(self, pid, signal=None):
        # Called for each running task on a cold shutdown, and by `celery control revoke --terminate`; it names the
        # worker's pid, which every task shares, so not the task. Raising would abort the cold shutdown: the runs are
        # asked to stop when the pool stops, right after. A revoked run task's run is asked to stop by the
        # task_revoked signal, which names the task (consumers/tasks/operations.py).
        pass

    def on_stop(self) -> None:
        from celery.worker import state

        from consumers.engine.runs import stop_all_runs

        # Celery's cold shutdown sets should_terminate before it stops the pool
        stop_all_runs("worker shutting down (Cold)" if state.should_terminate else
                      "worker shutting down (its pool stops)")
        super().on_stop()


def tally_pool_for(pool_cls):
    """The pool a worker asked for `pool_cls` (`--pool threads`, a class, or the worker_pool setting) uses: Tally's
    for Celery's threads pool, so that every worker command, the ones already written included, gets it."""
    return ThreadPool if get_implementation(pool_cls) is CeleryThreadPool else pool_cls
