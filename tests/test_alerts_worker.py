"""The beat task evaluates alerts in a real Celery worker and the email reaches a real SMTP server."""
import time

import pytest
from django.conf import settings

from alerts.defaults import ensure_default_rules
from alerts.models import Alert, AlertState, Notification
from consumers.kafka.broker import free_port
from consumers.models import PartitionHealth, Pipeline, PipelineHealth, Status
from tests.conftest import start_celery_worker, stop_process_group
from tests.test_alerts_email import start_smtp
from tests.waiting import patience


@pytest.fixture
def smtp_inbox():
    port = free_port()
    controller, inbox = start_smtp(port)
    inbox.port = port
    yield inbox
    controller.stop()


@pytest.fixture
def alerts_worker(subprocess_env, celery_app_for_tests, smtp_inbox):
    env = dict(subprocess_env, EMAIL_HOST="127.0.0.1", EMAIL_PORT=str(smtp_inbox.port),
               ALERT_RECIPIENTS="oncall@example.com", TALLY_BASE_URL="https://tally.example.com")
    process = start_celery_worker(env, log_name="alerts-worker")
    deadline = time.monotonic() + patience(60)
    while not celery_app_for_tests.control.ping(timeout=0.5):
        assert process.poll() is None and time.monotonic() < deadline, "the Celery worker did not start"
    yield process
    stop_process_group(process)


def test_the_beat_schedule_runs_alert_evaluation_periodically():
    entry = settings.CELERY_BEAT_SCHEDULE["alerts-evaluate"]
    assert entry["task"] == "tally.alerts.evaluate"
    assert 0 < entry["schedule"] <= 300


def pipeline_that_lost(name, partition, offsets: range):
    """The pipeline `name` reading nums, reconciled OK but for the records at `offsets` of `partition`, lost."""
    pipeline = Pipeline.objects.create(name=name, topic="nums", sink_table=name.replace("-", "_"))
    lost = len(offsets)
    PartitionHealth.objects.create(pipeline=pipeline, partition=partition, lost=lost,
                                   findings=[{"kind": "lost", "start": offsets.start, "end": offsets.stop,
                                              "count": lost}])
    PipelineHealth.objects.create(pipeline=pipeline, status=Status.OK, lost=lost)
    return pipeline


def evaluate_twice_in_the_worker():
    """Two beats' evaluations, run by the worker: the second finds the alert already notified."""
    from alerts.tasks import evaluate_alerts_task

    for _ in range(2):
        evaluate_alerts_task.apply_async().get(timeout=patience(60))


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_the_evaluation_task_in_a_real_worker_fires_once_and_emails(alerts_worker, smtp_inbox):
    ensure_default_rules()
    pipeline = pipeline_that_lost("worker-nums", partition=1, offsets=range(30, 32))

    evaluate_twice_in_the_worker()

    assert [m["subject"] for m in smtp_inbox.messages] == [
        "[Tally] FIRING: worker-nums: 2 lost records (partition 1: offsets 30-31)"]
    assert "https://tally.example.com/pipelines/worker-nums/" in smtp_inbox.messages[0]["text"]
    assert Alert.objects.get(pipeline=pipeline).state == AlertState.FIRING
    assert Notification.objects.get().delivered_at is not None


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_the_evaluation_task_in_a_real_worker_delivers_a_channels_outbox(alerts_worker):
    from alerts import channel_actions
    from alerts.models import Channel
    from tests.receivers import Receiver

    receiver = Receiver().start()
    try:
        ensure_default_rules()
        channel_actions.save(Channel(name="hooks", kind="webhook", url=f"{receiver.url}/in", secret="s"), "test")
        pipeline_that_lost("worker-hooks", partition=0, offsets=range(4, 5))

        evaluate_twice_in_the_worker()
    finally:
        receiver.stop()

    assert [(b["event"], b["target"]["name"]) for b in receiver.bodies()] == [("fired", "worker-hooks")]
    assert Notification.objects.get(channel__name="hooks").delivered_at is not None
