"""Slack's answers about the webhook URL (no_service_id, no_team, invalid_token, ...) are about the channel, even
when they come as a 400: the message is retried, and goes out once an operator fixes the URL; the channel's
reason names the Slack error. A 400 invalid_payload is about the message, and is given up. Time is injected
(`now`): nothing here sleeps."""
import pytest

from alerts.models import Channel, Notification
from alerts.outbox import deliver_due
from tests.alert_clock import frozen_clock  # noqa: F401 - an autouse fixture
from tests.test_alert_channels import (
    SECRET_TOKEN,
    add_channel,
    alert_settings,  # noqa: F401 - an autouse fixture
    at,
    fire_loss,
    resolve,
)


def slack(receiver) -> Channel:
    return add_channel("chat", "slack", f"{receiver.url}/services/T1/B2/{SECRET_TOKEN}")


@pytest.mark.parametrize("status,error", [
    (400, "no_service_id"), (400, "no_team"), (400, "invalid_token"), (403, "invalid_token"),
    (404, "no_service"), (404, "channel_not_found"), (410, "channel_is_archived"), (400, "user_not_found"),
])
def test_slack_refusing_the_webhook_url_is_retried_and_named_so_the_messages_go_out_once_it_is_fixed(receiver,
                                                                                                  status, error):
    """A message sent while the URL was being fixed would otherwise be lost; a resolve still follows its fired."""
    slack(receiver)
    pipeline = fire_loss()
    resolve(pipeline, at(1))
    receiver.answers = [(status, error)] * 2

    assert deliver_due(now=at(1)) == {"sent": 0, "failed": 1, "gave_up": 0}
    assert deliver_due(now=at(6)) == {"sent": 0, "failed": 1, "gave_up": 0}
    fired = Notification.objects.get(channel__name="chat", kind="fired")
    assert fired.failed_at is None and fired.last_error.startswith(f"HTTP {status}: {error} (Slack: ")
    channel = Channel.objects.get(name="chat")
    assert channel.consecutive_failures == 2 and channel.last_error == fired.last_error
    assert "URL" in channel.last_error and SECRET_TOKEN not in channel.last_error

    assert deliver_due(now=at(16)) == {"sent": 2, "failed": 0, "gave_up": 0}   # the URL was fixed
    assert [b["text"].split()[0] for b in receiver.bodies()[-2:]] == ["FIRING", "RESOLVED"]


@pytest.mark.parametrize("error", ["invalid_payload", "invalid_blocks", "too_many_attachments"])
def test_slack_refusing_the_message_itself_gives_it_up_with_its_reason_and_holds_nothing_behind_it(receiver, error):
    slack(receiver)
    fire_loss("orders")
    fire_loss("payments", at=at(1))
    receiver.answers = [(400, error)]

    assert deliver_due(now=at(1)) == {"sent": 1, "failed": 0, "gave_up": 1}
    refused = Notification.objects.get(channel__name="chat", alert__pipeline__name="orders")
    assert refused.failed_at == at(1) and refused.last_error == f"HTTP 400: {error}"
    assert deliver_due(now=at(3600)) == {"sent": 0, "failed": 0, "gave_up": 0}   # never sent again
    assert len(receiver.requests) == 2
