"""The outbox's order and its holds (alerts/outbox.py) against real receivers (HTTP and SMTP), each case a defect
once: a disabled channel's held "fired" held the resolves of other alerts for good, and such rows, picked and
skipped at every run, filled its batch so that no other channel heard anything; an alert acknowledged while muted
paged PagerDuty when the mute ended; the rules' own emails could read RESOLVED before FIRING after a mail outage.
Clocks are passed in (and frozen)."""
import time_machine

from alerts import channel_actions
from alerts.evaluate import acknowledge, evaluate_all
from alerts.models import Alert, AlertRule, Channel, Mute, Notification, RuleKind
from alerts.outbox import DELIVERY_BATCH, DROPPED_UNHEARD, deliver_due
from consumers.models import Status
from tests.alert_clock import default_rules, frozen_clock  # noqa: F401 - autouse fixtures
from tests.receivers import Receiver
from tests.test_alert_channels import add_channel, alert_settings, at  # noqa: F401 - alert_settings is autouse
from tests.test_alerts_email import T0, lost, make_pipeline, report_health, smtp_port, start_smtp  # noqa: F401


def losing(name: str, seconds: float):
    pipeline = make_pipeline(name)
    report_health(pipeline, {0: ([lost(1, 3)], Status.OK)}, Status.ERR, at=at(seconds))
    return pipeline


def recovered(pipeline, seconds: float) -> None:
    report_health(pipeline, {0: ([], Status.OK)}, at=at(seconds))


def test_a_disabled_channels_resolves_go_past_another_alerts_held_fired_and_its_backlog_starves_no_channel(receiver):
    add_channel("old", "webhook", f"{receiver.url}/old")
    pipelines = [losing(f"p{i}", 0) for i in range(DELIVERY_BATCH)]
    evaluate_all(now=T0)
    deliver_due(now=T0)
    assert len(receiver.bodies()) == DELIVERY_BATCH          # "old" heard them all fire
    receiver.status = 500
    x = losing("x", 10)
    evaluate_all(now=at(10))
    deliver_due(now=at(10))                                   # x's "fired" failed: it waits for its retry
    with time_machine.travel(at(12), tick=False):
        old = Channel.objects.get(name="old")
        old.enabled = False                                   # the operator disables the failing channel
        channel_actions.save(old, "ops")
    for pipeline in pipelines:
        recovered(pipeline, 20)
    evaluate_all(now=at(20))                                  # 50 resolves for "old", behind x's held "fired"
    new = Receiver().start()
    try:
        add_channel("new", "webhook", f"{new.url}/new")
        losing("z", 30)
        evaluate_all(now=at(30))
        deliver_due(now=at(30))   # "old" still answers 500: its first resolve fails, the rest wait behind it
        assert ("fired", "z") in [(b["event"], b["target"]["name"]) for b in new.bodies()]
    finally:
        new.stop()
    receiver.status = 200
    receiver.requests.clear()
    for seconds in range(40, 400, 30):
        deliver_due(now=at(seconds))
    assert sorted(b["target"]["name"] for b in receiver.bodies()) == sorted(p.name for p in pipelines)
    assert {b["event"] for b in receiver.bodies()} == {"resolved"}   # x's "fired" stays held while it fires

    recovered(x, 400)
    evaluate_all(now=at(400))
    receiver.requests.clear()
    deliver_due(now=at(400))
    # x's trigger was tried (a 500 may still have opened an incident): it is dropped, and its resolve goes.
    assert [(b["event"], b["target"]["name"]) for b in receiver.bodies()] == [("resolved", "x")]
    dropped = Notification.objects.get(channel__name="old", alert__pipeline=x, kind="fired")
    assert dropped.failed_at is not None and dropped.last_error == DROPPED_UNHEARD


def test_a_resolve_to_a_channel_its_rule_deletion_disabled_goes_past_another_alerts_failed_trigger(receiver):
    rule = AlertRule.objects.create(name="pager loss", kind=RuleKind.LOST)
    AlertRule.objects.exclude(pk=rule.pk).update(enabled=False)
    add_channel("pager", "pagerduty", f"{receiver.url}/v2/enqueue", routing_key="RK", rules=[rule])
    p1 = losing("p1", 0)
    evaluate_all(now=T0)
    deliver_due(now=T0)                                   # p1's incident opened
    receiver.status = 500
    p2 = losing("p2", 10)
    evaluate_all(now=at(10))
    deliver_due(now=at(10))                               # p2's trigger failed
    with time_machine.travel(at(15), tick=False):
        rule.delete()                                     # both resolved; the channel disabled
    assert not Channel.objects.get(name="pager").enabled
    receiver.status = 200
    for seconds in (20, 60, 600):
        deliver_due(now=at(seconds))
    alert_of = {Alert.objects.get(pipeline_name=p.name).pk: p.name for p in (p1, p2)}
    events = [(b["event_action"], alert_of[int(b["dedup_key"].rsplit("-", 1)[1])]) for b in receiver.bodies()]
    assert events[:2] == [("trigger", "p1"), ("trigger", "p2")]
    assert sorted(events[2:]) == [("resolve", "p1"), ("resolve", "p2")]   # p2's trigger was tried: it may have opened


def test_an_alert_acknowledged_while_muted_is_acknowledged_right_after_its_late_trigger(receiver):
    add_channel("pager", "pagerduty", f"{receiver.url}/v2/enqueue", routing_key="RK")
    pipeline = make_pipeline("orders")
    rule = AlertRule.objects.get(kind=RuleKind.LOST, pipeline=None)
    Mute.mute(rule=rule, pipeline=pipeline, minutes=10, now=T0)
    report_health(pipeline, {0: ([lost(10, 13)], Status.OK)}, Status.ERR, at=T0)
    evaluate_all(now=T0)
    assert acknowledge(Alert.objects.get(pipeline=pipeline), "bob", now=at(60))
    deliver_due(now=at(60))
    assert receiver.bodies() == []                        # muted: nobody was told, so there is nothing to acknowledge
    evaluate_all(now=at(11 * 60))                         # the mute is over and the loss is still there
    deliver_due(now=at(11 * 60))
    assert [b["event_action"] for b in receiver.bodies()] == ["trigger", "acknowledge"]


def test_the_rules_emails_read_firing_then_resolved_after_a_short_mail_outage(smtp_port, settings):  # noqa: F811
    settings.ALERT_RECIPIENTS = ["oncall@example.com"]
    pipeline = losing("orders", 0)
    evaluate_all(now=T0)
    deliver_due(now=T0)                       # the mail server is down: the "fired" is retried 30 s later
    recovered(pipeline, 10)
    evaluate_all(now=at(10))
    controller, inbox = start_smtp(smtp_port)
    try:
        deliver_due(now=at(20))               # the "resolved" waits behind the "fired"
        assert inbox.subjects() == []
        deliver_due(now=at(30))
    finally:
        controller.stop()
    assert [s.split(":")[0].removeprefix("[Tally] ") for s in inbox.subjects()] == ["FIRING", "RESOLVED"]
