"""Celery tasks of the Spark area: the topic check job, and the end of those whose worker died. Thin:
consumers/reconciliation/topic_check.py does the work.

The task starts a SparkSession on first use in the worker process (one per process, reused): run it in a
worker with the threads or solo pool, never prefork (a JVM gateway does not survive a fork). With
SPARK_WARM_ON_WORKER_START the worker starts it at once, in the background.
"""
import logging
import threading

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from consumers.reconciliation.topic_check import RUN_TOPIC_CHECK_TASK


@shared_task(name=RUN_TOPIC_CHECK_TASK, acks_late=False, ignore_result=True)
def run_topic_check_task(job_id: int):
    from consumers.reconciliation.topic_check import run_topic_check_job

    job = run_topic_check_job(job_id)
    return job.status


@shared_task(name="consumers.fail_stale_topic_checks", ignore_result=True)
def fail_stale_topic_checks_task() -> int:
    """Beat: running checks whose worker stopped answering, and queued ones no worker will take (their task is gone),
    end as failed (consumers/models/topic_check.py)."""
    from django.utils import timezone

    from consumers.models import TopicCheckJob
    from consumers.reconciliation.topic_check import fail_lost_checks

    now = timezone.now()
    return TopicCheckJob.objects.fail_stale(now) + fail_lost_checks(now)


log = logging.getLogger("tally.spark")
# Pools that run tasks in the worker's own process: the only ones where a JVM may live (no fork after it).
IN_PROCESS_POOLS = ("celery.concurrency.thread", "celery.concurrency.solo")


@worker_ready.connect
def warm_spark_on_worker_start(sender=None, **kwargs):
    if not settings.SPARK_WARM_ON_WORKER_START:
        return
    pool = getattr(sender, "pool", None)
    if type(pool).__module__ not in IN_PROCESS_POOLS:
        log.warning("SPARK_WARM_ON_WORKER_START needs a threads or solo pool, not %s: not warming Spark",
                    type(pool).__module__)
        return
    threading.Thread(target=_warm, name="tally-spark-warm-up", daemon=True).start()


def _warm():
    from consumers.engine.spark_session import warm_up

    try:
        log.info("Spark driver warm in %.1f s (SPARK_WARM_ON_WORKER_START)", warm_up())
    except Exception:  # the first Spark run builds the session again and reports its own error
        log.exception("Warming the Spark driver failed")
