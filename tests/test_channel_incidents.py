"""A PagerDuty incident Tally opened is closed by Tally, whatever happens to its channel meanwhile: an acknowledge
made while the channel was disabled follows its held trigger, a channel deleted after a trigger it answered 500
still resolves it, and a channel moved to other settings resolves it with the old ones first."""
from alerts import channel_actions, evaluate
from alerts.evaluate import evaluate_all
from alerts.models import Alert, Notification
from alerts.outbox import deliver_due
from consumers.models import ActionLog
from tests.alert_clock import frozen_clock  # noqa: F401 - an autouse fixture
from tests.receivers import Receiver
from tests.test_alert_channels import add_channel, alert_settings, at, fire_loss  # noqa: F401 - autouse fixture
from tests.test_alerts_email import T0


def pager(receiver):
    return add_channel("pager", "pagerduty", f"{receiver.url}/v2/enqueue", routing_key="RK")


def actions(receiver) -> list[str]:
    return [event["event_action"] for event in receiver.bodies()]


def test_an_alert_acknowledged_while_its_channel_was_disabled_is_acknowledged_once_it_is_enabled(receiver):
    """The acknowledge was queued for enabled channels only: enabled again, the channel sent its held trigger
    alone, and PagerDuty paged for an alert someone had taken."""
    channel = pager(receiver)
    fire_loss()   # the trigger is queued, not yet sent
    channel.enabled = False
    channel_actions.save(channel, "olga")
    assert evaluate.acknowledge(Alert.objects.get(), "olga", now=at(30))
    deliver_due(now=at(30))
    assert receiver.bodies() == []   # the trigger is held, and the acknowledge waits behind it

    channel.enabled = True
    channel_actions.save(channel, "olga")
    evaluate_all(now=at(60))
    deliver_due(now=at(60))

    assert actions(receiver) == ["trigger", "acknowledge"]
    assert len({event["dedup_key"] for event in receiver.bodies()}) == 1


def test_deleting_a_channel_whose_trigger_was_answered_500_resolves_the_incident_it_may_have_opened(receiver):
    channel = pager(receiver)
    fire_loss()
    receiver.answers = [(500, "internal error")]   # then 202
    receiver.status, receiver.text = 202, "accepted"
    assert deliver_due(now=T0)["failed"] == 1

    closed = channel_actions.delete(channel, "olga")

    assert actions(receiver) == ["trigger", "resolve"]
    assert len({event["dedup_key"] for event in receiver.bodies()}) == 1 and "resolved the incident" in closed


def test_a_pagerduty_channel_changed_to_a_webhook_resolves_its_open_incidents_with_its_old_settings(receiver):
    channel = pager(receiver)
    fire_loss()
    deliver_due(now=T0)
    webhook = Receiver().start()
    try:
        channel.kind, channel.url, channel.routing_key = "webhook", webhook.url, ""
        channel_actions.save(channel, "olga")
    finally:
        webhook.stop()

    events = receiver.bodies()
    assert actions(receiver) == ["trigger", "resolve"] and events[1]["routing_key"] == "RK"
    assert events[0]["dedup_key"] == events[1]["dedup_key"] and webhook.requests == []
    change = ActionLog.objects.filter(action="alert_channel_change").latest("pk")
    assert "with its old settings, resolved the incident" in change.message and "RK" not in change.message


def test_a_trigger_answered_500_then_429_still_has_its_incident_resolved_when_the_channel_is_deleted(receiver):
    # The 500 may have opened the incident; the 429 after it only asked to slow down.
    channel = pager(receiver)
    fire_loss()
    receiver.answers = [(500, "internal error"), (429, "rate limited")]
    receiver.status, receiver.text = 202, "accepted"
    assert deliver_due(now=T0)["failed"] == 1
    row = Notification.objects.get(channel=channel)
    deliver_due(now=row.next_attempt_at)
    row.refresh_from_db()
    assert row.attempts == 2 and row.last_error.startswith("HTTP 429: ")

    channel_actions.delete(channel, "olga")
    assert actions(receiver) == ["trigger", "trigger", "resolve"]
