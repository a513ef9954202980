"""An operator's acknowledge reaches the channels that heard the alert fire and have a word for it: PagerDuty
acknowledges the incident (the same dedup_key), Slack gets a short line; email and webhooks get nothing. It goes
through the outbox, like every other notification: in order, retried until the receiver answers."""
from django.core import mail

from alerts import evaluate
from alerts.models import Alert, AlertState, Mute
from alerts.outbox import deliver_due
from tests.alert_clock import frozen_clock  # noqa: F401 - an autouse fixture
from tests.test_alert_channels import (
    add_channel,
    alert_settings,  # noqa: F401 - an autouse fixture
    at,
    fire_loss,
    resolve,
)
from tests.test_alerts_email import T0
from tests.views_helpers import client_of, make_operator


def pager(receiver, name="pager"):
    return add_channel(name, "pagerduty", f"{receiver.url}/v2/enqueue", routing_key="RK")


def fire_and_acknowledge(at_seconds=30):
    pipeline = fire_loss()
    deliver_due(now=T0)
    assert evaluate.acknowledge(Alert.objects.get(), "olga", now=at(at_seconds))
    return pipeline


def test_acknowledging_in_the_api_acknowledges_the_pagerduty_incident_with_its_dedup_key(receiver):
    pager(receiver)
    pipeline = fire_loss()
    deliver_due(now=T0)
    alert = Alert.objects.get()
    assert client_of(make_operator()).post(f"/api/alerts/{alert.pk}/acknowledge/").status_code == 200
    deliver_due(now=at(30))
    resolve(pipeline, at(60))
    deliver_due(now=at(60))

    events = receiver.bodies()
    assert [e["event_action"] for e in events] == ["trigger", "acknowledge", "resolve"]
    assert len({e["dedup_key"] for e in events}) == 1 and all(e["routing_key"] == "RK" for e in events)


def test_an_acknowledge_the_receiver_refuses_for_a_while_is_retried_until_it_answers(receiver):
    pager(receiver)
    fire_and_acknowledge()
    receiver.status = 500
    assert deliver_due(now=at(30)) == {"sent": 0, "failed": 1, "gave_up": 0}
    receiver.status = 202
    assert deliver_due(now=at(300)) == {"sent": 1, "failed": 0, "gave_up": 0}
    assert [e["event_action"] for e in receiver.bodies()] == ["trigger", "acknowledge", "acknowledge"]


def test_slack_gets_a_short_line_naming_who_acknowledged(receiver):
    add_channel("chat", "slack", f"{receiver.url}/hooks/T0KEN")
    fire_and_acknowledge()
    deliver_due(now=at(30))
    fired, acknowledged = receiver.bodies()
    assert "ACKNOWLEDGED orders" in acknowledged["text"] and "olga" in acknowledged["text"]
    assert len(acknowledged.get("blocks", [])) < len(fired["blocks"])


def test_webhooks_and_email_hear_nothing_of_an_acknowledge(receiver):
    add_channel("hook", "webhook", f"{receiver.url}/hook")
    add_channel("mail", "email", recipients="ops@example.com")
    fire_and_acknowledge()
    deliver_due(now=at(30))
    assert [e["event"] for e in receiver.bodies()] == ["fired"]
    assert len(mail.outbox) == 1


def test_a_channel_that_never_heard_the_alert_fire_hears_nothing_of_its_acknowledge(receiver):
    pipeline = fire_loss()
    alert = Alert.objects.get()
    Mute.mute(rule=alert.rule, pipeline=pipeline, watch=None, minutes=60, user="olga", reason="", now=T0)
    pager(receiver)   # added while muted: it has not heard the alert fire
    assert evaluate.acknowledge(alert, "olga", now=at(30))
    deliver_due(now=at(30))
    assert receiver.bodies() == [] and Alert.objects.get().state == AlertState.ACKNOWLEDGED


def test_a_channel_disabled_after_an_acknowledge_was_queued_still_sends_it_and_then_the_resolve(receiver):
    channel = pager(receiver)
    pipeline = fire_and_acknowledge()
    channel.enabled = False
    channel.save()
    resolve(pipeline, at(60))
    deliver_due(now=at(60))
    assert [e["event_action"] for e in receiver.bodies()] == ["trigger", "acknowledge", "resolve"]
