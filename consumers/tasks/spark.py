"""Celery tasks of the Spark area: the topic check job. Thin: consumers/reconciliation/topic_check.py does the work.

The task starts a SparkSession on first use in the worker process (one per process, reused): run it in a
worker with the threads or solo pool, never prefork (a JVM gateway does not survive a fork).
"""
from celery import shared_task

from consumers.reconciliation.topic_check import RUN_TOPIC_CHECK_TASK


@shared_task(name=RUN_TOPIC_CHECK_TASK, acks_late=False, ignore_result=True)
def run_topic_check_task(job_id: int):
    from consumers.reconciliation.topic_check import run_topic_check_job

    job = run_topic_check_job(job_id)
    return job.status
