"""The dashboard's topic check: a Celery job (real worker, threads pool) that starts Spark in the worker and
stores progress and the result in TopicCheckJob."""
import time

import pytest

from consumers.engine import commit
from consumers.engine.spark_session import stop_spark
from consumers.kafka import admin as kafka_admin
from consumers.models import DeliveryMode, TopicCheckStatus
from consumers.reconciliation import topic_check
from tests.test_topic_check import classic, records  # noqa: F401,F811  (the classic example's fixture)
from tests.waiting import patience

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.spark_processes, pytest.mark.celery]


def test_the_dashboard_topic_check_runs_as_a_celery_job_with_progress_and_a_stored_result(classic, celery_worker):  # noqa: F811
    # The worker starts its own JVM: end this process's first, to keep one Spark JVM at a time.
    stop_spark(shutdown_jvm=True)
    topic, log, conn, make = classic
    pipeline, target = make(DeliveryMode.AT_MOST_ONCE)
    commit.commit_batch(conn, target, 1, {0: records(log, 0, range(0, 45)), 1: records(log, 1, range(0, 50))})
    kafka_admin.commit_offsets(pipeline.group_id, topic, {0: 50, 1: 50})
    job = topic_check.request_topic_check(pipeline, requested_by="alice")
    assert job.pipeline == pipeline
    seen_progress = set()
    deadline = time.monotonic() + patience(180)
    while time.monotonic() < deadline:
        job.refresh_from_db()
        seen_progress.add(job.progress_message)
        if job.status in (TopicCheckStatus.DONE, TopicCheckStatus.FAILED):
            break
        time.sleep(0.5)
    assert job.status == TopicCheckStatus.DONE, job.error
    assert job.result["missing"] == [log[0][o] for o in range(45, 50)]
    assert (job.progress, job.finished_at is not None) == (1.0, True)
    assert len(seen_progress - {"", "done"}) >= 1  # progress was reported while it ran


