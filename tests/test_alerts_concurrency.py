"""Evaluations and senders running at the same time still produce one alert and one email per state."""
import threading
from datetime import timedelta

import pytest
from django.db import connection

from alerts.defaults import ensure_default_rules
from alerts.evaluate import evaluate_all
from alerts.models import Alert, Notification
from alerts.outbox import deliver_due
from consumers.models import PartitionHealth, Pipeline, PipelineHealth, Status
from tests.alert_clock import NOW, frozen_clock  # noqa: F401 - an autouse fixture
from tests.test_alerts_email import inbox, smtp_port  # noqa: F401 - fixtures

RACERS = 4


def race(function, *args):
    """Run `function(*args)` in RACERS threads released together; return their results."""
    barrier, results, errors = threading.Barrier(RACERS), [], []

    def run():
        try:
            barrier.wait(timeout=10)
            results.append(function(*args))
        except Exception as error:  # noqa: BLE001 - collected and asserted below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    return results


@pytest.mark.django_db(transaction=True)
def test_concurrent_evaluations_and_senders_deliver_each_state_exactly_once(inbox):  # noqa: F811
    ensure_default_rules()
    pipelines = [Pipeline.objects.create(name=f"race-{n}", topic="t", sink_table=f"race_{n}") for n in range(3)]
    for pipeline in pipelines:
        PartitionHealth.objects.create(pipeline=pipeline, partition=0, lost=1,
                                       findings=[{"kind": "lost", "start": 9, "end": 10, "count": 1}])
        PipelineHealth.objects.create(pipeline=pipeline, status=Status.OK, lost=1)

    race(evaluate_all, NOW)
    race(evaluate_all, NOW + timedelta(seconds=1))
    sent = race(deliver_due, NOW + timedelta(seconds=1))

    assert Alert.objects.count() == 3
    assert Notification.objects.count() == 3
    assert sum(result["sent"] for result in sent) == 3
    assert sorted(m["subject"].split(":")[1].strip() for m in inbox.messages) == ["race-0", "race-1", "race-2"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_senders_post_each_channel_message_once_and_in_order(settings):
    from alerts import channel_actions
    from alerts.models import Channel
    from tests.receivers import Receiver

    settings.ALERT_RECIPIENTS = []
    ensure_default_rules()
    receiver = Receiver().start()
    try:
        channel_actions.save(Channel(name="hooks", kind="webhook", url=receiver.url), "test")
        pipeline = Pipeline.objects.create(name="race", topic="t", sink_table="race")
        PartitionHealth.objects.create(pipeline=pipeline, partition=0, lost=1,
                                       findings=[{"kind": "lost", "start": 9, "end": 10, "count": 1}])
        PipelineHealth.objects.create(pipeline=pipeline, status=Status.OK, lost=1)
        evaluate_all(NOW)
        PartitionHealth.objects.filter(pipeline=pipeline).update(lost=0, findings=[])
        PipelineHealth.objects.filter(pipeline=pipeline).update(lost=0)
        evaluate_all(NOW + timedelta(seconds=1))  # resolved: a second message queued behind the first

        sent = race(deliver_due, NOW + timedelta(seconds=2))
        sent += race(deliver_due, NOW + timedelta(seconds=3))
    finally:
        receiver.stop()

    assert sum(result["sent"] for result in sent) == 2
    assert [body["event"] for body in receiver.bodies()] == ["fired", "resolved"]
