"""A receiver that rate-limits (429, with or without Retry-After) asks Tally to wait: the message waits, in
order, and goes out; the channel is not counted as failing for it. A 503 is the receiver down, and still
counts. Time is injected (`now`): nothing here sleeps."""
from datetime import timedelta

import pytest
from django.core import mail

from alerts import channel_actions
from alerts.channels import Session
from alerts.models import Channel, Notification
from alerts.outbox import RETRY_AFTER_MAX_SECONDS, deliver_due
from tests.alert_clock import frozen_clock  # noqa: F401 - an autouse fixture
from tests.test_alert_channels import (
    SECRET_TOKEN,
    add_channel,
    alert_settings,  # noqa: F401 - an autouse fixture
    at,
    fire_loss,
    resolve,
)
from tests.test_alerts_email import T0


@pytest.fixture(autouse=True)
def failing_after_three(settings):
    settings.ALERT_CHANNEL_FAILING_AFTER = 3


def deliver_when_due(start, runs: int):
    """`runs` delivery runs, each when the next row waiting for its retry is due; returns the last run's time.
    (A row due but held behind an older one of its channel waits for that one.)"""
    due = start
    for _ in range(runs):
        deliver_due(now=due)
        waiting = (Notification.objects.filter(delivered_at__isnull=True, failed_at__isnull=True,
                                               next_attempt_at__gt=due).order_by("next_attempt_at").first())
        if waiting is None:
            break
        due = waiting.next_attempt_at
    return due


def told_failing():
    return [m for m in mail.outbox if "is failing" in m.subject]


@pytest.mark.parametrize("kind,url,fields,retry_after", [
    ("slack", f"/services/T1/B2/{SECRET_TOKEN}", {}, {"Retry-After": "1"}),
    # PagerDuty's Events API answers 429 without a Retry-After: the backoff is the wait.
    ("pagerduty", "/v2/enqueue", {"routing_key": "RK"}, {}),
    ("webhook", "/in", {}, {"Retry-After": "30"}),
])
def test_a_burst_rate_limited_by_the_receiver_goes_out_in_order_without_the_channel_failing(receiver, kind, url,
                                                                                          fields, retry_after):
    receiver.headers = retry_after
    add_channel("out", kind, receiver.url + url, **fields)
    pipeline = fire_loss()
    resolve(pipeline, at(1))
    # More 429s in a row than ALERT_CHANNEL_FAILING_AFTER: each one the receiver asking to wait, not failing.
    receiver.answers = [(429, "rate_limited")] * 6

    assert deliver_due(now=at(1)) == {"sent": 0, "failed": 1, "gave_up": 0}
    fired = Notification.objects.get(channel__name="out", kind="fired")
    assert fired.answer == "HTTP 429: rate_limited"
    assert fired.next_attempt_at == at(1 + max(5, int(retry_after.get("Retry-After", 0))))
    channel = Channel.objects.get(name="out")
    assert channel.consecutive_failures == 0 and channel.last_error == ""

    deliver_when_due(at(1), runs=10)

    assert len(receiver.requests) == 8   # 6 answered 429, then fired and resolved, once each
    events = [b.get("event_action") or b.get("event") or b["text"].split()[0] for b in receiver.bodies()[-2:]]
    assert events in (["trigger", "resolve"], ["fired", "resolved"], ["FIRING", "RESOLVED"])
    assert Notification.objects.filter(channel__name="out", delivered_at__isnull=True).count() == 0
    channel.refresh_from_db()
    assert not channel.is_failing and channel.consecutive_failures == 0 and channel.admins_told_at is None
    assert told_failing() == []


def test_a_429_between_failures_neither_counts_nor_clears_the_failures_before_it(receiver):
    """A channel failing 500, 500, then rate-limited, then 500 again has failed three times in a row: the 429
    says nothing of whether the channel works."""
    add_channel("out", "webhook", receiver.url)
    fire_loss()
    receiver.answers = [(500, "broken"), (500, "broken"), (429, "slow down"), (500, "broken")]

    deliver_when_due(T0, runs=3)
    channel = Channel.objects.get(name="out")
    assert channel.consecutive_failures == 2 and not channel.is_failing
    assert channel.last_error == "HTTP 500: broken"   # the 429 is on the row, not the channel's failure

    deliver_when_due(Notification.objects.get().next_attempt_at, runs=1)
    channel.refresh_from_db()
    assert channel.consecutive_failures == 3 and channel.is_failing and len(told_failing()) == 1


def test_a_receiver_answering_503_with_retry_after_is_down_and_counts_toward_failing(receiver):
    """A 503 says the receiver is unavailable (down, in maintenance), Retry-After or not: its wait is honoured,
    but the messages are not getting through, and the admins hear of it."""
    receiver.status, receiver.text, receiver.headers = 503, "maintenance", {"Retry-After": "60"}
    add_channel("out", "webhook", receiver.url)
    fire_loss()

    deliver_when_due(T0, runs=3)
    channel = Channel.objects.get(name="out")
    assert channel.consecutive_failures == 3 and channel.is_failing and len(told_failing()) == 1


def test_a_receiver_that_keeps_answering_429_past_the_longest_wait_counts_toward_failing(receiver):
    """429s for longer than any Retry-After Tally honours (an hour) get nothing through: its rows would be given up
    after ALERT_CHANNEL_GIVE_UP_HOURS with nobody told. From then on each 429 counts."""
    receiver.status, receiver.text = 429, "rate_limited"
    add_channel("out", "webhook", receiver.url)
    fire_loss()

    deliver_when_due(T0, runs=3)
    channel = Channel.objects.get(name="out")
    assert channel.consecutive_failures == 0 and len(receiver.requests) == 3

    an_hour_on = Notification.objects.get().created_at + timedelta(seconds=RETRY_AFTER_MAX_SECONDS)
    deliver_when_due(max(an_hour_on, Notification.objects.get().next_attempt_at), runs=3)
    channel.refresh_from_db()
    assert channel.consecutive_failures == 3 and channel.is_failing and len(told_failing()) == 1
    assert "HTTP 429: rate_limited" in channel.last_error


def test_a_burst_to_one_slack_webhook_goes_out_in_one_run_a_second_apart_and_other_kinds_are_not_held(receiver):
    """Slack takes about one message a second per webhook and answers a faster burst with 429s: each of those
    messages then waited for a later delivery run (every ALERT_EVALUATE_SECONDS), so a burst of N alerts took
    about N runs to reach Slack. A run now spaces its sends to one webhook a second apart."""
    add_channel("chat", "slack", f"{receiver.url}/services/T1/B2/{SECRET_TOKEN}")
    add_channel("hooks", "webhook", f"{receiver.url}/in")
    for name in ("orders", "payments", "refunds", "invoices"):
        fire_loss(name)
    sleeps = []   # a run's waits, recorded instead of slept

    assert deliver_due(now=T0, session=Session(sleep=sleeps.append))["sent"] == 8

    assert sleeps == [1.0, 1.0, 1.0]   # before the 2nd, 3rd and 4th Slack message; none for the webhook
    assert Notification.objects.filter(delivered_at__isnull=True).count() == 0


def test_a_run_started_while_another_sends_keeps_the_pace_of_the_slack_webhook(receiver):
    """Two delivery runs may overlap (a run slowed by its receivers is still sending when the next one starts):
    the pace is the channel's, not the run's, so the second run waits for the rest of the first's interval."""
    add_channel("chat", "slack", f"{receiver.url}/services/T1/B2/{SECRET_TOKEN}")
    fire_loss("orders")
    first, second = [], []
    assert deliver_due(now=T0, session=Session(sleep=first.append))["sent"] == 1
    fire_loss("payments", at=at(0.25))

    assert deliver_due(now=at(0.25), session=Session(sleep=second.append))["sent"] == 1

    assert (first, second) == ([], [0.75])
    assert Channel.objects.get(name="chat").next_send_at == at(2)   # the second's slot was at(1)


def test_two_channels_on_one_slack_webhook_share_its_pace_and_another_webhook_keeps_its_own(receiver):
    """Slack's limit is per webhook URL, not per Tally channel: two channels an operator made for one webhook
    (say, to route other rules there) sent a message each per second to it, two a second in all, and met 429s."""
    shared = f"{receiver.url}/services/T1/B2/{SECRET_TOKEN}"
    add_channel("chat", "slack", shared)
    add_channel("chat-oncall", "slack", shared)
    add_channel("other-room", "slack", f"{receiver.url}/services/T1/B3/{SECRET_TOKEN}")
    for name in ("orders", "payments"):
        fire_loss(name)
    sleeps = []

    assert deliver_due(now=T0, session=Session(sleep=sleeps.append))["sent"] == 6

    # Four messages to the shared webhook wait three times; the other room's two wait once.
    assert sleeps == [1.0] * 4
    paces = dict(Channel.objects.values_list("name", "next_send_at"))
    assert paces["chat"] == paces["chat-oncall"]


def test_a_test_message_takes_its_slot_in_the_pace_and_a_clock_set_back_holds_the_channel_one_interval(receiver):
    chat = add_channel("chat", "slack", f"{receiver.url}/services/T1/B2/{SECRET_TOKEN}")
    assert channel_actions.test(chat, "ops")[0]
    fire_loss("orders")
    waited = []
    assert deliver_due(now=T0, session=Session(sleep=waited.append))["sent"] == 1
    assert waited == [1.0]   # behind the test message sent at the same instant

    # A clock set back by a day leaves next_send_at a day ahead: the channel waits one interval, not a day.
    fire_loss("payments", at=at(-86_400))
    held = []
    assert deliver_due(now=at(-86_400), session=Session(sleep=held.append))["sent"] == 1
    assert held == [1.0]
    assert len(receiver.requests) == 3
