"""A topic check whose worker dies (SIGKILL, a lost machine) ends as failed with the reason, instead of showing
"running" for ever: the check heartbeats while it runs, and the periodic pass (TopicCheckJobQuerySet.fail_stale)
ends those silent for longer than the lease. `now` is passed in: nothing here waits for a lease to run out."""
import signal
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from consumers.models import Pipeline, TopicCheckJob, TopicCheckStatus
from tests.conftest import ROOT
from tests.waiting import patience, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
LEASE = 60
SECOND = timedelta(seconds=1)

# A check's worker process: the job is claimed and heartbeats as in a Celery task; Spark's part is replaced by a
# read of stdin that never ends, so the process is "in the middle of a check" until it is killed.
CHECK_IN_A_PROCESS = """
import sys
import django
django.setup()
from consumers.reconciliation import topic_check
topic_check.check_topic = lambda *args, **kwargs: sys.stdin.read()
topic_check.run_topic_check_job(int(sys.argv[1]))
"""


@pytest.fixture
def orders(settings):
    settings.TALLY_TOPIC_CHECK_LEASE_SECONDS = LEASE
    return Pipeline.objects.create(name="orders", topic="orders", sink_table="orders_sink")


def check_of(pipeline, **fields) -> TopicCheckJob:
    return TopicCheckJob.objects.create(pipeline=pipeline, topic=pipeline.topic, group_id=pipeline.group_id,
                                        table=pipeline.sink_table, key_column="value", **fields)


def test_a_running_check_is_failed_once_its_heartbeat_is_older_than_the_lease_and_not_before(orders):
    beat = timezone.now()
    check = check_of(orders, status=TopicCheckStatus.RUNNING, heartbeat_at=beat)

    assert TopicCheckJob.objects.fail_stale(beat + timedelta(seconds=LEASE) - SECOND) == 0
    check.refresh_from_db()
    assert (check.status, check.error, check.finished_at) == (TopicCheckStatus.RUNNING, "", None)

    later = beat + timedelta(seconds=LEASE) + SECOND
    assert TopicCheckJob.objects.fail_stale(later) == 1
    check.refresh_from_db()
    assert (check.status, check.finished_at) == (TopicCheckStatus.FAILED, later)
    assert check.error == (f"its worker stopped answering: no heartbeat for {LEASE} s (killed or lost); "
                           "request it again")


def test_queued_and_finished_checks_are_left_alone_and_a_late_heartbeat_does_not_revive_a_failed_one(orders):
    long_ago = timezone.now() - timedelta(days=1)
    queued = check_of(orders, created_at=long_ago)
    done = check_of(orders, status=TopicCheckStatus.DONE, heartbeat_at=long_ago, finished_at=long_ago)
    running = check_of(orders, status=TopicCheckStatus.RUNNING, heartbeat_at=long_ago)

    assert TopicCheckJob.objects.fail_stale(timezone.now()) == 1
    assert TopicCheckJob.objects.filter(pk=running.pk).heartbeat(timezone.now()) == 0
    statuses = dict(TopicCheckJob.objects.values_list("pk", "status"))
    assert statuses == {queued.pk: TopicCheckStatus.QUEUED, done.pk: TopicCheckStatus.DONE,
                        running.pk: TopicCheckStatus.FAILED}


def test_a_check_whose_process_is_killed_ends_failed_and_the_api_says_why(orders, subprocess_env, viewer_client):
    check = check_of(orders)
    worker = subprocess.Popen([sys.executable, "-c", CHECK_IN_A_PROCESS, str(check.pk)], cwd=ROOT,
                              env=subprocess_env, stdin=subprocess.PIPE)
    try:
        wait_for(lambda: TopicCheckJob.objects.filter(pk=check.pk, status=TopicCheckStatus.RUNNING).exists(),
                 30, "the check to be claimed")
    finally:
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=patience(10)) == -signal.SIGKILL
    check.refresh_from_db()
    assert check.status == TopicCheckStatus.RUNNING   # nobody is left to say it ended
    assert check.heartbeat_at is not None

    assert TopicCheckJob.objects.fail_stale(check.heartbeat_at + timedelta(seconds=LEASE) + SECOND) == 1

    answer = viewer_client.get("/api/pipelines/orders/topic-checks").json()["topic_checks"]
    assert [(c["id"], c["status"]) for c in answer] == [(check.pk, "failed")]
    assert answer[0]["error"].startswith("its worker stopped answering")


def test_the_beat_ends_the_checks_whose_worker_stopped_answering(orders, settings):
    from consumers.tasks.spark import fail_stale_topic_checks_task
    from tally.celery import app

    app.loader.import_default_modules()
    entry = settings.CELERY_BEAT_SCHEDULE["topic-checks-fail-stale"]
    assert entry["task"] == fail_stale_topic_checks_task.name and entry["task"] in app.tasks
    check = check_of(orders, status=TopicCheckStatus.RUNNING, heartbeat_at=timezone.now() - timedelta(days=1))

    assert fail_stale_topic_checks_task() == 1
    check.refresh_from_db()
    assert check.status == TopicCheckStatus.FAILED


def test_a_failed_check_shows_why_it_failed_not_its_last_progress_line(orders, viewer_client, monkeypatch):
    # Failed checks kept "starting" (or whatever they last reported) as their progress line.
    from consumers.reconciliation import topic_check

    def refuse(pipeline):
        raise topic_check.TopicCheckError("table 'orders_sink' has no column 'value'")

    monkeypatch.setattr(topic_check, "topic_check_spec", refuse)
    refused = check_of(orders)
    topic_check.run_topic_check_job(refused.pk)
    silent = check_of(orders)
    TopicCheckJob.objects.filter(pk=silent.pk).claim(timezone.now() - timedelta(seconds=2 * LEASE))
    TopicCheckJob.objects.fail_stale(timezone.now())

    lines = dict(TopicCheckJob.objects.values_list("pk", "progress_message"))
    assert lines == {refused.pk: "failed: table 'orders_sink' has no column 'value'",
                     silent.pk: f"failed: its worker stopped answering: no heartbeat for {LEASE} s (killed or lost); "
                                "request it again"}
    answer = viewer_client.get("/api/pipelines/orders/topic-checks").json()["topic_checks"]
    assert {c["id"]: (c["status"], c["progress_message"]) for c in answer} == {
        pk: (TopicCheckStatus.FAILED, line) for pk, line in lines.items()}


def test_one_failed_heartbeat_write_does_not_end_the_heartbeats(orders, monkeypatch, settings):
    """A connection lost for one beat: the beat after it writes again. The check waits for three more beats (a
    condition, not a time), so it finishes only if they come."""
    from django.db import OperationalError

    from consumers.models.topic_check import TopicCheckJobQuerySet
    from consumers.reconciliation import topic_check

    settings.TALLY_TOPIC_CHECK_LEASE_SECONDS = 1   # a beat every 0.2 s
    beats, real = [], TopicCheckJobQuerySet.heartbeat

    def flaky(self, now):
        beats.append(now)
        if len(beats) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return real(self, now)

    monkeypatch.setattr(TopicCheckJobQuerySet, "heartbeat", flaky)
    def check_topic(*args, **kwargs):
        wait_for(lambda: len(beats) >= 4, 30, "the heartbeats after the failed one")
        return {"missing_count": 0}

    monkeypatch.setattr(topic_check, "check_topic", check_topic)
    job = topic_check.run_topic_check_job(topic_check.create_job(orders).pk)
    assert (job.status, job.error) == (TopicCheckStatus.DONE, "")


def test_a_check_declared_failed_while_it_ran_stays_failed_with_its_reason(orders, monkeypatch):
    """The beat failed it (its worker silent too long); the worker then finished. The status is not turned to
    done under the failure's text."""
    from consumers.reconciliation import topic_check

    job = topic_check.create_job(orders)

    def declared_failed_meanwhile(*args, **kwargs):
        assert TopicCheckJob.objects.fail_stale(timezone.now() + timedelta(days=1)) == 1
        return {"missing_count": 0}

    monkeypatch.setattr(topic_check, "check_topic", declared_failed_meanwhile)
    job = topic_check.run_topic_check_job(job.pk)
    assert job.status == TopicCheckStatus.FAILED and job.error.startswith("its worker stopped answering")
