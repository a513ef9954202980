"""Alert emails received by a real SMTP server (aiosmtpd on a free loopback port), with injected time."""
import email
import email.policy
import json
from datetime import timedelta
from io import StringIO

import pytest
from aiosmtpd.controller import Controller
from django.core.management import call_command

from alerts import outbox
from alerts.evaluate import evaluate_all
from alerts.models import Alert, AlertRule, AlertState, Mute, Notification, NotificationKind, RuleKind
from alerts.outbox import deliver_due
from consumers.kafka.broker import free_port
from consumers.models import ActionLog, ActionResult, ConsumerRun, PartitionHealth, Pipeline, PipelineHealth, Status
from tests.alert_clock import NOW as T0
from tests.alert_clock import default_rules, frozen_clock  # noqa: F401 - autouse fixtures
from tests.alert_rows import open_alert


class Inbox:
    """aiosmtpd handler that keeps every received message, parsed."""

    def __init__(self):
        self.messages = []

    async def handle_DATA(self, server, session, envelope):
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.messages.append({"to": envelope.rcpt_tos, "subject": str(message["subject"]),
                              "text": message.get_body(("plain",)).get_content(),
                              "html": message.get_body(("html",)).get_content()})
        return "250 Message accepted for delivery"

    def subjects(self):
        return [m["subject"] for m in self.messages]


def start_smtp(port):
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    return controller, inbox


@pytest.fixture
def smtp_port(settings):
    port = free_port()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", port, 5
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    settings.ALERT_RECIPIENTS = ["oncall@example.com"]
    settings.TALLY_BASE_URL = "https://tally.example.com"
    return port


@pytest.fixture
def inbox(smtp_port):
    controller, inbox = start_smtp(smtp_port)
    yield inbox
    controller.stop()


def make_pipeline(name, **fields):
    return Pipeline.objects.create(name=name, topic=f"{name}-topic", sink_table=name.replace("-", "_"), **fields)


def report_health(pipeline, partitions, status=Status.OK, at=T0):
    """What reconciliation writes: one PartitionHealth per partition (findings included) and the total."""
    totals = {"lost": 0, "duplicated": 0, "phantom": 0}
    for partition, (findings, part_status) in partitions.items():
        counts = {kind: sum(f["count"] for f in findings if f["kind"] == kind) for kind in totals}
        PartitionHealth.objects.update_or_create(
            pipeline=pipeline, partition=partition,
            defaults={"findings": findings, "status": part_status, "checked_at": at, "lag_records": 0, **counts})
        for kind in totals:
            totals[kind] += counts[kind]
    PipelineHealth.objects.update_or_create(pipeline=pipeline, defaults={"status": status, "checked_at": at, **totals})


def lost(start, end):
    return {"kind": "lost", "start": start, "end": end, "count": end - start}


def evaluate_and_send(now):
    report = evaluate_all(now=now)
    deliver_due(now=now)
    return report


@pytest.mark.django_db
def test_a_loss_alert_email_names_the_pipeline_partitions_and_lost_offsets(inbox):
    pipeline = make_pipeline("orders-at-most-once")
    report_health(pipeline, {0: ([lost(10, 14)], Status.OK), 2: ([lost(3, 4), lost(7, 9)], Status.OK)}, Status.ERR)

    evaluate_and_send(T0)

    loss_mails = [m for m in inbox.messages if "lost" in m["subject"]]
    assert len(loss_mails) == 1
    mail = loss_mails[0]
    assert mail["to"] == ["oncall@example.com"]
    assert mail["subject"].startswith("[Tally] FIRING: orders-at-most-once: 7 lost records")
    assert "partition 0: 4 records, offsets 10-13" in mail["text"]
    assert "partition 2: 3 records, offsets 3, 7-8" in mail["text"]
    assert f"Since:      {T0:%Y-%m-%d %H:%M:%S} UTC" in mail["text"]
    assert "https://tally.example.com/pipelines/orders-at-most-once/" in mail["text"]
    assert "<td>10-13</td>" in mail["html"]
    assert 'href="https://tally.example.com/pipelines/orders-at-most-once/"' in mail["html"]


@pytest.mark.django_db
def test_evaluating_the_same_state_again_sends_no_second_email(inbox):
    pipeline = make_pipeline("orders")
    report_health(pipeline, {0: ([lost(5, 6)], Status.OK)})

    for seconds in (0, 1, 2, 30):
        evaluate_and_send(T0 + timedelta(seconds=seconds))
    call_command("check_alerts", stdout=StringIO())

    assert len(inbox.messages) == 1
    assert Alert.objects.filter(pipeline=pipeline, state=AlertState.FIRING).count() == 1


@pytest.mark.django_db
def test_reminders_and_the_resolve_email_come_exactly_when_due(inbox):
    pipeline = make_pipeline("payments")
    AlertRule.objects.create(name="payments loss", kind=RuleKind.LOST, pipeline=pipeline, reminder_seconds=600,
                             recipients="payments@example.com, oncall@example.com")
    report_health(pipeline, {0: ([lost(40, 42)], Status.OK)})

    timeline = [0, 599, 600, 601, 1199, 1200, 1500]
    received = []
    for seconds in timeline:
        evaluate_and_send(T0 + timedelta(seconds=seconds))
        received.append(len(inbox.messages))
    assert received == [1, 1, 2, 2, 2, 3, 3]
    assert inbox.subjects()[1].startswith("[Tally] STILL FIRING: payments:")
    assert "reminder 2" in inbox.messages[2]["text"]
    assert inbox.messages[0]["to"] == ["payments@example.com", "oncall@example.com"]

    report_health(pipeline, {0: ([], Status.OK)}, at=T0 + timedelta(seconds=1700))
    evaluate_and_send(T0 + timedelta(seconds=1700))
    evaluate_and_send(T0 + timedelta(seconds=1800))
    evaluate_and_send(T0 + timedelta(seconds=2400))

    assert len(inbox.messages) == 4
    resolved = inbox.messages[3]
    assert resolved["subject"].startswith("[Tally] RESOLVED: payments: 2 lost records")
    assert f"Resolved:   {T0 + timedelta(seconds=1700):%Y-%m-%d %H:%M:%S} UTC" in resolved["text"]
    assert Alert.objects.get(pipeline=pipeline).state == AlertState.RESOLVED


@pytest.mark.django_db
def test_an_acknowledged_alert_sends_no_reminders_but_still_its_resolve(inbox):
    pipeline = make_pipeline("billing")
    AlertRule.objects.create(name="billing loss", kind=RuleKind.LOST, pipeline=pipeline, reminder_seconds=60)
    report_health(pipeline, {0: ([lost(1, 2)], Status.OK)})
    evaluate_and_send(T0)
    Alert.objects.get(pipeline=pipeline).acknowledge("alice", now=T0 + timedelta(seconds=10))

    for seconds in (60, 120, 600):
        evaluate_and_send(T0 + timedelta(seconds=seconds))
    assert len(inbox.messages) == 1

    report_health(pipeline, {0: ([], Status.OK)})
    evaluate_and_send(T0 + timedelta(seconds=700))
    assert inbox.subjects()[1].startswith("[Tally] RESOLVED: billing")
    assert "acknowledged by alice" in inbox.messages[1]["text"]


def record_rewind(pipeline, before, after, at):
    return ActionLog.objects.create(pipeline=pipeline, action="rewind", actor="alice", result=ActionResult.DONE,
                                    params={"to_offset": after}, offsets_before=before, offsets_after=after,
                                    created_at=at)


@pytest.mark.django_db
def test_an_operator_rewind_sends_no_loss_or_stall_alert_for_the_rewound_range(inbox):
    pipeline = make_pipeline("clicks", desired_state="running")
    ConsumerRun.objects.create(pipeline=pipeline, epoch=1, host="h", pid=1, state="running", heartbeat_at=T0)
    record_rewind(pipeline, {"0": 100, "1": 50}, {"0": 150, "1": 50}, at=T0 - timedelta(seconds=30))
    # Reconciliation sees the skipped range [100, 150) as missing, and the paused-then-resumed consumer stalled.
    report_health(pipeline, {0: ([lost(100, 150), {"kind": "gap", "start": 100, "end": 150, "count": 50}],
                                 Status.STALL),
                             1: ([], Status.OK)}, Status.STALL)

    report = evaluate_and_send(T0)

    assert inbox.messages == []
    assert report.firing == [] and not Alert.objects.filter(pipeline=pipeline).exists()


@pytest.mark.django_db
def test_a_loss_outside_the_rewound_range_still_fires_naming_only_the_unplanned_offsets(inbox):
    pipeline = make_pipeline("views")
    record_rewind(pipeline, {"0": 100}, {"0": 150}, at=T0 - timedelta(hours=2))
    report_health(pipeline, {0: ([lost(95, 152)], Status.OK)})

    evaluate_and_send(T0)

    assert len(inbox.messages) == 1
    assert "partition 0: 7 records, offsets 95-99, 150-151" in inbox.messages[0]["text"]


@pytest.mark.django_db
def test_a_mute_holds_every_email_until_it_ends(inbox):
    pipeline = make_pipeline("search")
    rule = AlertRule.objects.create(name="search loss", kind=RuleKind.LOST, pipeline=pipeline, reminder_seconds=300)
    Mute.mute(rule=rule, pipeline=pipeline, minutes=60, user="alice", now=T0)
    report_health(pipeline, {0: ([lost(7, 9)], Status.OK)})

    for minutes in (0, 5, 10, 30, 59):
        evaluate_and_send(T0 + timedelta(minutes=minutes, seconds=59))
    assert inbox.messages == []
    assert Alert.objects.get(pipeline=pipeline).state == AlertState.FIRING  # still listed while muted

    evaluate_and_send(T0 + timedelta(minutes=60))
    assert inbox.subjects() == ["[Tally] FIRING: search: 2 lost records (partition 0: offsets 7-8)"]


@pytest.mark.django_db
def test_an_alert_that_fires_and_resolves_during_a_mute_sends_nothing(inbox):
    pipeline = make_pipeline("ads")
    Mute.mute(rule=None, pipeline=pipeline, minutes=30, now=T0)
    report_health(pipeline, {0: ([lost(1, 3)], Status.OK)})
    evaluate_and_send(T0)
    report_health(pipeline, {0: ([], Status.OK)})
    evaluate_and_send(T0 + timedelta(minutes=10))
    evaluate_and_send(T0 + timedelta(minutes=40))

    assert inbox.messages == []
    assert Alert.objects.get(pipeline=pipeline).state == AlertState.RESOLVED


@pytest.mark.django_db
def test_with_the_smtp_server_down_evaluation_completes_and_the_send_is_retried_until_delivered(smtp_port):
    first, second = make_pipeline("first"), make_pipeline("second")
    report_health(first, {0: ([lost(1, 2)], Status.OK)})
    report_health(second, {0: ([lost(8, 9)], Status.OK)})

    report = evaluate_and_send(T0)  # nothing listens on smtp_port

    assert {a["pipeline"] for a in report.firing} == {"first", "second"}
    pending = Notification.objects.order_by("pk")
    assert [(n.attempts, n.delivered_at) for n in pending] == [(1, None), (1, None)]
    assert all("Connection refused" in n.last_error or "Errno" in n.last_error for n in pending)
    assert all(n.next_attempt_at == T0 + timedelta(seconds=30) for n in pending)

    controller, inbox = start_smtp(smtp_port)
    try:
        assert deliver_due(now=T0 + timedelta(seconds=29)) == {"sent": 0, "failed": 0, "gave_up": 0}
        assert inbox.messages == []  # backoff respected: not retried before it is due
        evaluate_all(now=T0 + timedelta(seconds=30))
        assert deliver_due(now=T0 + timedelta(seconds=30))["sent"] == 2
        deliver_due(now=T0 + timedelta(seconds=300))
    finally:
        controller.stop()

    assert sorted(m["subject"].split(":")[1].strip() for m in inbox.messages) == ["first", "second"]
    assert all(n.delivered_at == T0 + timedelta(seconds=30) and n.attempts == 2 for n in Notification.objects.all())


@pytest.mark.django_db
def test_retries_back_off_exponentially_and_give_up_after_the_last_attempt(smtp_port, settings):
    settings.ALERT_SEND_MAX_ATTEMPTS = 3
    pipeline = make_pipeline("flaky")
    report_health(pipeline, {0: ([lost(1, 2)], Status.OK)})
    evaluate_all(now=T0)

    attempts_at = [T0, T0 + timedelta(seconds=30), T0 + timedelta(seconds=90)]
    for now in attempts_at:
        deliver_due(now=now)
    notification = Notification.objects.get()
    assert notification.attempts == 3
    assert notification.failed_at == attempts_at[-1] and notification.delivered_at is None
    assert deliver_due(now=T0 + timedelta(days=1)) == {"sent": 0, "failed": 0, "gave_up": 0}


@pytest.mark.django_db
def test_check_alerts_json_reports_what_fired(inbox):
    pipeline = make_pipeline("inventory")
    report_health(pipeline, {0: ([{"kind": "duplicated", "start": 3, "end": 5, "count": 2}], Status.OK)})

    out = StringIO()
    call_command("check_alerts", "--json", stdout=out)

    report = json.loads(out.getvalue())
    assert [a["summary"] for a in report["firing"]] == ["2 duplicated records (partition 0: offsets 3-4)"]
    assert report["emails"]["sent"] == 1
    assert inbox.subjects() == ["[Tally] FIRING: inventory: 2 duplicated records (partition 0: offsets 3-4)"]


@pytest.mark.django_db
def test_a_summary_quoting_an_error_with_crlf_goes_out_with_a_one_line_subject(inbox):
    """Django refuses a header holding "\\r" (BadHeaderError): the email was retried and never sent."""
    alert = open_alert(make_pipeline("ingest"), summary="consumer stopped: KafkaError\r\nbroker 1 down\rretrying")
    outbox.queue(alert, NotificationKind.FIRED, 0, T0)

    assert deliver_due(now=T0) == {"sent": 1, "failed": 0, "gave_up": 0}
    assert inbox.subjects() == ["[Tally] FIRING: ingest: consumer stopped: KafkaError broker 1 down retrying"]
