"""Alert channels against local HTTP receivers: delivered once, in order, with backoff, even when the
receiver was down, answered 500 or was too slow; PagerDuty triggers and resolves one incident; signed
webhooks verify. Time is injected (`now`) and frozen: nothing here sleeps."""
import hashlib
import hmac
import json
from datetime import timedelta
from email.utils import format_datetime
from io import StringIO

import pytest
import time_machine
from django.core import mail
from django.core.management import call_command

from alerts import channel_actions
from alerts.channels import webhook
from alerts.channels.webhook import SIGNATURE_HEADER
from alerts.defaults import ensure_default_rules
from alerts.evaluate import evaluate_all
from alerts.models import Alert, AlertRule, AlertState, Channel, Notification, RuleKind
from alerts.outbox import RETRY_AFTER_MAX_SECONDS, deliver_due
from alerts.payloads import dedup_key
from consumers.models import ActionLog, PartitionHealth, Status, Watch
from tests.alert_clock import frozen_clock  # noqa: F401 - an autouse fixture
from tests.receivers import Receiver
from tests.test_alerts_email import T0, lost, make_pipeline, report_health

SECRET_TOKEN = "T0KEN-s3cr3t-path-XYZ"


@pytest.fixture(autouse=True)
def alert_settings(db, settings):
    ensure_default_rules()
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.ALERT_RECIPIENTS = []  # only the channels under test receive anything
    settings.TALLY_BASE_URL = "https://tally.example.com"
    settings.ALERT_CHANNEL_TIMEOUT_SECONDS = 0.5
    settings.ADMINS = [("Ada", "ada@example.com")]


def add_channel(name, kind, url="", rules=None, **fields) -> Channel:
    return channel_actions.save(Channel(name=name, kind=kind, url=url, **fields), "test", rules)


def fire_loss(name="orders", at=T0):
    pipeline = make_pipeline(name)
    report_health(pipeline, {0: ([lost(10, 13)], Status.OK)}, Status.ERR, at=at)
    evaluate_all(now=at)
    return pipeline


def resolve(pipeline, at):
    report_health(pipeline, {0: ([], Status.OK)}, at=at)
    evaluate_all(now=at)


def at(seconds):
    return T0 + timedelta(seconds=seconds)


def test_a_webhook_gets_the_loss_once_signed_with_hmac(receiver):
    add_channel("hooks", "webhook", f"{receiver.url}/in/{SECRET_TOKEN}", secret="sign-me")
    fire_loss()

    assert deliver_due(now=T0) == {"sent": 1, "failed": 0, "gave_up": 0}
    for seconds in (1, 60, 600):
        evaluate_all(now=at(seconds))
        deliver_due(now=at(seconds))

    assert len(receiver.requests) == 1
    request = receiver.requests[0]
    assert request["path"] == f"/in/{SECRET_TOKEN}"
    expected = "sha256=" + hmac.new(b"sign-me", request["body"], hashlib.sha256).hexdigest()
    assert hmac.compare_digest(request["headers"][SIGNATURE_HEADER], expected)
    payload = json.loads(request["body"])
    assert (payload["event"], payload["target"]["name"], payload["rule"]["kind"]) == ("fired", "orders", "lost")
    assert payload["facts"]["partitions"]["0"]["offsets_text"] == "10-12"
    assert request["headers"]["X-Tally-Delivery"] == payload["id"]
    row = Notification.objects.get(channel__name="hooks")
    assert row.delivered_at == T0 and row.answer == "HTTP 200: ok"


def test_a_tampered_body_does_not_verify(receiver):
    add_channel("hooks", "webhook", receiver.url, secret="sign-me")
    fire_loss()
    deliver_due(now=T0)
    request = receiver.requests[0]
    tampered = request["body"].replace(b"orders", b"0rders")
    forged = "sha256=" + hmac.new(b"sign-me", tampered, hashlib.sha256).hexdigest()
    assert not hmac.compare_digest(request["headers"][SIGNATURE_HEADER], forged)


def test_a_receiver_down_while_a_loss_fires_gets_it_once_after_it_comes_back_in_order():
    down = Receiver()  # its port has no listener yet
    add_channel("hooks", "webhook", f"{down.url}/{SECRET_TOKEN}")
    pipeline = fire_loss()
    assert deliver_due(now=T0) == {"sent": 0, "failed": 1, "gave_up": 0}
    resolve(pipeline, at(3))
    assert deliver_due(now=at(5)) == {"sent": 0, "failed": 1, "gave_up": 0}

    row = Notification.objects.get(channel__name="hooks", kind="fired")
    assert "Connection refused" in row.last_error and SECRET_TOKEN not in row.last_error
    assert row.next_attempt_at == at(5 + 10)  # second failure: 10 s

    down.start()
    try:
        assert deliver_due(now=at(14)) == {"sent": 0, "failed": 0, "gave_up": 0}  # backoff respected
        assert deliver_due(now=at(15)) == {"sent": 2, "failed": 0, "gave_up": 0}
        for seconds in (16, 300, 3600):
            evaluate_all(now=at(seconds))
            deliver_due(now=at(seconds))
    finally:
        down.stop()

    bodies = down.bodies()
    assert [b["event"] for b in bodies] == ["fired", "resolved"]
    assert bodies[0]["fired_at"] == T0.isoformat() and bodies[0]["event_at"] == T0.isoformat()
    assert bodies[1]["event_at"] == at(3).isoformat()
    assert Alert.objects.get(pipeline=pipeline).state == AlertState.RESOLVED


def test_a_receiver_answering_500_is_retried_with_backoff_capped_at_five_minutes(receiver):
    receiver.status, receiver.text = 500, "upstream broken"
    add_channel("hooks", "webhook", receiver.url)
    fire_loss()

    due = T0
    delays = []
    for _ in range(9):
        deliver_due(now=due)
        row = Notification.objects.get(channel__name="hooks")
        delays.append(int((row.next_attempt_at - due).total_seconds()))
        due = row.next_attempt_at
    assert delays == [5, 10, 20, 40, 80, 160, 300, 300, 300]
    assert row.answer == "HTTP 500: upstream broken" and row.delivered_at is None
    assert len(receiver.requests) == 9

    receiver.status, receiver.text = 202, "accepted"
    assert deliver_due(now=due)["sent"] == 1
    assert deliver_due(now=due + timedelta(minutes=10))["sent"] == 0
    assert len(receiver.requests) == 10


def test_a_receiver_answering_429_or_503_is_retried_after_its_retry_after_within_the_cap(receiver):
    add_channel("hooks", "webhook", receiver.url)
    fire_loss()

    def next_wait(status, retry_after, now):
        receiver.status, receiver.headers = status, {"Retry-After": retry_after}
        assert deliver_due(now=now)["failed"] == 1
        return (Notification.objects.get(channel__name="hooks").next_attempt_at - now).total_seconds()

    assert next_wait(429, "120", T0) == 120  # seconds, longer than the 5 s backoff
    assert next_wait(503, format_datetime(at(720), usegmt=True), at(120)) == 600  # an HTTP-date
    assert next_wait(429, "99999999999999999999", at(720)) == RETRY_AFTER_MAX_SECONDS  # capped
    assert next_wait(429, "1", at(720 + 3600)) == 40  # never shorter than the backoff (4th attempt)
    assert next_wait(500, "900", at(720 + 3640)) == 80  # only 429 and 503 name a wait
    receiver.status, receiver.headers = 200, {}
    assert deliver_due(now=at(720 + 3720))["sent"] == 1


def test_a_receiver_too_slow_to_answer_times_out_and_is_retried(receiver):
    receiver.slow = True
    add_channel("hooks", "webhook", receiver.url)
    fire_loss()

    assert deliver_due(now=T0)["failed"] == 1
    row = Notification.objects.get(channel__name="hooks")
    assert "timeout" in row.last_error and row.next_attempt_at == at(5)

    receiver.slow = False
    receiver.release.set()
    assert deliver_due(now=at(5))["sent"] == 1
    assert [b["event"] for b in receiver.bodies()] == ["fired"]


def test_pagerduty_trigger_and_resolve_share_the_dedup_key(receiver):
    add_channel("pager", "pagerduty", f"{receiver.url}/v2/enqueue", routing_key="R0UTING-KEY-1234")
    rule = AlertRule.objects.get(kind=RuleKind.LOST, pipeline=None)
    rule.reminder_seconds = 600
    rule.save()
    pipeline = fire_loss()
    deliver_due(now=T0)
    evaluate_all(now=at(600))
    deliver_due(now=at(600))
    resolve(pipeline, at(700))
    deliver_due(now=at(700))

    events = receiver.bodies()
    assert [e["event_action"] for e in events] == ["trigger", "trigger", "resolve"]
    assert len({e["dedup_key"] for e in events}) == 1
    assert all(e["routing_key"] == "R0UTING-KEY-1234" for e in events)
    trigger = events[0]["payload"]
    assert trigger["severity"] == "critical" and trigger["component"] == "orders"
    assert trigger["timestamp"] == T0.isoformat() and "3 lost records" in trigger["summary"]


def test_slack_gets_readable_blocks(receiver):
    add_channel("chat", "slack", f"{receiver.url}/services/T1/B2/{SECRET_TOKEN}")
    fire_loss()
    deliver_due(now=T0)

    message = receiver.bodies()[0]
    assert message["text"].startswith("FIRING orders: 3 lost records")
    kinds = [block["type"] for block in message["blocks"]]
    assert kinds[0] == "header" and "actions" in kinds and "context" in kinds
    fields = " ".join(f["text"] for b in message["blocks"] if b["type"] == "section" for f in b.get("fields", []))
    assert "*Rule*\nLost records (lost)" in fields and "*Cluster*\ndefault" in fields
    partitions = [b["text"]["text"] for b in message["blocks"] if b["type"] == "section" and "text" in b]
    assert any("partition 0: 3 records, offsets 10-12" in text for text in partitions)
    buttons = next(b for b in message["blocks"] if b["type"] == "actions")["elements"]
    assert buttons[0]["url"] == "https://tally.example.com/pipelines/orders/"


def test_a_rule_routed_channel_gets_only_its_rules_and_an_unrouted_one_gets_every_rule(receiver):
    lag = AlertRule.objects.create(name="orders lag", kind=RuleKind.LAG_RECORDS, threshold=100)
    add_channel("lag-only", "webhook", f"{receiver.url}/lag", rules=[lag])
    add_channel("everything", "webhook", f"{receiver.url}/all")
    pipeline = fire_loss()
    PartitionHealth.objects.filter(pipeline=pipeline).update(lag_records=500)
    evaluate_all(now=at(1))
    deliver_due(now=at(1))

    by_path = {}
    for request in receiver.requests:
        by_path.setdefault(request["path"], []).append(json.loads(request["body"])["rule"]["kind"])
    assert sorted(by_path["/all"]) == ["lag_records", "lost"]
    assert by_path["/lag"] == ["lag_records"]


def test_a_channel_that_keeps_failing_shows_failing_and_the_admins_get_one_email(settings):
    settings.ALERT_CHANNEL_FAILING_AFTER = 3
    down = Receiver()
    channel = add_channel("hooks", "webhook", f"{down.url}/{SECRET_TOKEN}")
    fire_loss()
    due = T0
    for _ in range(6):
        deliver_due(now=due)
        due = Notification.objects.get(channel=channel).next_attempt_at
    channel.refresh_from_db()
    assert channel.is_failing and channel.as_json()["state"] == "failing"
    assert channel.failing_since == at(5 + 10) and channel.consecutive_failures == 6
    told = [m for m in mail.outbox if "is failing" in m.subject]
    assert len(told) == 1 and told[0].to == ["ada@example.com"]
    assert SECRET_TOKEN not in told[0].body and "Connection refused" in told[0].body

    down.start()
    try:
        deliver_due(now=due)
    finally:
        down.stop()
    channel.refresh_from_db()
    assert not channel.is_failing and channel.consecutive_failures == 0 and channel.last_success_at == due


def test_an_email_channel_gets_the_rendered_email():
    add_channel("team", "email", recipients="team@example.com, lead@example.com")
    fire_loss()
    deliver_due(now=T0)
    assert [(m.to, m.subject[:24]) for m in mail.outbox] == [(["team@example.com", "lead@example.com"],
                                                              "[Tally] FIRING: orders: ")]


def test_a_resolve_reaches_the_channels_that_heard_it_fire_even_during_a_mute(receiver):
    from alerts.models import Mute

    add_channel("pager", "pagerduty", receiver.url, routing_key="RK")
    pipeline = fire_loss()
    deliver_due(now=T0)
    Mute.mute(rule=None, pipeline=pipeline, minutes=60, now=at(10))
    resolve(pipeline, at(20))
    deliver_due(now=at(20))
    assert [e["event_action"] for e in receiver.bodies()] == ["trigger", "resolve"]


def test_a_disabled_channel_holds_its_messages_and_gets_nothing_new(receiver):
    channel = add_channel("hooks", "webhook", receiver.url)
    fire_loss("first")
    channel.enabled = False
    channel.save()
    deliver_due(now=T0)
    fire_loss("second", at=at(1))
    deliver_due(now=at(1))
    assert receiver.requests == []
    assert Notification.objects.filter(channel=channel).count() == 1


def test_check_alerts_evaluates_then_delivers_the_channels_outbox(receiver):
    add_channel("hooks", "webhook", receiver.url)
    pipeline = make_pipeline("orders")
    report_health(pipeline, {0: ([lost(10, 13)], Status.OK)}, Status.ERR)

    out = StringIO()
    call_command("check_alerts", "--json", stdout=out)
    call_command("check_alerts", stdout=StringIO())

    assert json.loads(out.getvalue())["emails"] == {"sent": 1, "failed": 0, "gave_up": 0}
    assert [b["event"] for b in receiver.bodies()] == ["fired"]


def test_the_payload_names_the_pipelines_cluster(receiver):
    add_channel("hooks", "webhook", receiver.url)
    pipeline = make_pipeline("eu-orders", cluster="eu-west")
    report_health(pipeline, {0: ([lost(1, 2)], Status.OK)}, Status.ERR)
    evaluate_all(now=T0)
    deliver_due(now=T0)
    payload = receiver.bodies()[0]
    assert payload["cluster"] == payload["target"]["cluster"] == "eu-west"


def test_a_channel_whose_only_rule_is_deleted_is_disabled_not_widened_to_every_rule(receiver):
    pipeline = make_pipeline("orders")
    lag = AlertRule.objects.create(name="orders lag", kind=RuleKind.LAG_RECORDS, threshold=100, pipeline=pipeline)
    other = AlertRule.objects.create(name="any lag", kind=RuleKind.LAG_RECORDS, threshold=1000)
    pager = add_channel("orders-pager", "webhook", f"{receiver.url}/pager", rules=[lag])
    both = add_channel("two-rules", "webhook", f"{receiver.url}/two", rules=[lag, other])

    pipeline.delete()   # its own rules go with it

    pager.refresh_from_db()
    assert not pager.enabled and list(pager.rules.all()) == []
    logged = ActionLog.objects.get(action="alert_channel_change", params__name="orders-pager", actor="tally")
    assert "its only rule 'orders lag' was deleted" in logged.message
    both.refresh_from_db()
    assert both.enabled and list(both.rules.all()) == [other]   # still routed: it keeps its other rule

    fire_loss("payments")   # a loss elsewhere: the disabled channel hears nothing of it
    deliver_due(now=at(1))
    assert {request["path"] for request in receiver.requests} == set()


@pytest.mark.parametrize("deleted_by", ["pipeline", "queryset"])
def test_a_channel_whose_rules_are_all_deleted_together_is_disabled_not_widened_to_every_rule(receiver, deleted_by):
    """Each rule's pre_delete still sees the others: the check waits until they are all gone."""
    doomed = make_pipeline("doomed")
    loss = AlertRule.objects.create(name="doomed loss", kind=RuleKind.LOST, pipeline=doomed)
    dupes = AlertRule.objects.create(name="doomed dupes", kind=RuleKind.DUPLICATED, pipeline=doomed)
    pager = add_channel("doomed-pager", "webhook", f"{receiver.url}/pager", rules=[loss, dupes])

    if deleted_by == "pipeline":
        doomed.delete()
    else:
        AlertRule.objects.filter(pk__in=[loss.pk, dupes.pk]).delete()

    pager.refresh_from_db()
    assert not pager.enabled and list(pager.rules.all()) == []
    logged = ActionLog.objects.get(action="alert_channel_change", params__name="doomed-pager", actor="tally")
    assert "its 2 rules were deleted together" in logged.message
    fire_loss("payments")
    deliver_due(now=at(1))
    assert receiver.requests == []
    assert not Notification.objects.filter(channel=pager).exists()


def test_a_channel_disabled_because_its_only_rule_was_deleted_still_resolves_the_incident_it_opened(receiver):
    pipeline = make_pipeline("orders")
    own = AlertRule.objects.create(name="orders lost", kind=RuleKind.LOST, pipeline=pipeline)
    pager = add_channel("orders-pager", "pagerduty", f"{receiver.url}/v2/enqueue", routing_key="RK", rules=[own])
    report_health(pipeline, {0: ([lost(10, 13)], Status.OK)}, Status.ERR)
    evaluate_all(now=T0)
    deliver_due(now=T0)

    own.delete()   # resolves its alert, then disables the channel (no rule left would mean every rule)
    for seconds in (1, 60):
        evaluate_all(now=at(seconds))
        deliver_due(now=at(seconds))

    pager.refresh_from_db()
    events = receiver.bodies()
    assert not pager.enabled
    assert [e["event_action"] for e in events] == ["trigger", "resolve"] and len({e["dedup_key"] for e in events}) == 1


def test_a_channel_disabled_before_it_told_of_an_alert_sends_neither_its_fire_nor_its_resolve(receiver):
    pipeline = make_pipeline("orders")
    own = AlertRule.objects.create(name="orders lost", kind=RuleKind.LOST, pipeline=pipeline)
    pager = add_channel("orders-pager", "pagerduty", f"{receiver.url}/v2/enqueue", routing_key="RK", rules=[own])
    report_health(pipeline, {0: ([lost(10, 13)], Status.OK)}, Status.ERR)
    evaluate_all(now=T0)   # the "fired" is queued, not yet sent

    own.delete()   # resolves the alert and disables the channel: the "resolved" waits behind the held "fired"
    for seconds in (1, 60):
        evaluate_all(now=at(seconds))
        deliver_due(now=at(seconds))

    pager.refresh_from_db()
    assert not pager.enabled and receiver.bodies() == []


def test_a_channel_disabled_with_a_reminder_queued_drops_the_reminder_and_still_resolves_the_incident(receiver):
    # The held reminder held the resolve behind it: the incident stayed open for as long as the channel was
    # disabled, and enabling it again sent the stale trigger after the resolve, which opens a new incident.
    rule = AlertRule.objects.get(kind=RuleKind.LOST, pipeline=None)
    rule.reminder_seconds = 600
    rule.save()
    pager = add_channel("pager", "pagerduty", f"{receiver.url}/v2/enqueue", routing_key="RK")
    pipeline = fire_loss()
    deliver_due(now=T0)
    evaluate_all(now=at(600))   # the reminder is queued, not yet sent
    pager.enabled = False
    channel_actions.save(pager, "olga")

    resolve(pipeline, at(700))
    deliver_due(now=at(700))
    pager.enabled = True
    channel_actions.save(pager, "olga")
    deliver_due(now=at(800))

    assert [e["event_action"] for e in receiver.bodies()] == ["trigger", "resolve"]
    reminder = Notification.objects.get(channel=pager, kind="reminder")
    assert reminder.delivered_at is None and reminder.failed_at == at(700)
    assert "dropped: the channel was disabled" in reminder.last_error


def test_a_channel_added_while_an_alert_fires_hears_it_at_the_next_pass_and_hears_it_resolve(receiver):
    rule = AlertRule.objects.get(kind=RuleKind.LOST, pipeline=None)
    rule.reminder_seconds = 0   # no reminders: without the catch-up the channel would never hear of this loss
    rule.save()
    pipeline = fire_loss()
    acknowledged = fire_loss("acked")
    Alert.objects.get(pipeline=acknowledged).acknowledge("olga", at(5))
    channel = add_channel("pager", "pagerduty", f"{receiver.url}/v2/enqueue", routing_key="RK")

    report = evaluate_all(now=at(60))
    assert report.fired == [f"orders/{rule.name} (to channels added since it fired)"]
    assert evaluate_all(now=at(120)).fired == []   # heard once, not again at every pass
    deliver_due(now=at(120))
    resolve(pipeline, at(180))
    deliver_due(now=at(180))
    events = receiver.bodies()
    assert [e["event_action"] for e in events] == ["trigger", "resolve"] and len({e["dedup_key"] for e in events}) == 1
    assert events[0]["payload"]["component"] == "orders"   # the acknowledged alert is someone's already: not paged
    assert list(Notification.objects.filter(channel=channel).values_list("kind", "sequence").order_by("pk")) == [
        ("fired", 0), ("resolved", 0)]


def test_a_channel_that_is_down_with_a_backlog_does_not_hold_back_the_other_channels(receiver):
    down = Receiver()  # its port has no listener: every try fails
    add_channel("down", "webhook", f"{down.url}/{SECRET_TOKEN}")
    for name in ("a", "b", "c"):
        fire_loss(name)  # three messages wait on "down", older than anything the other channel will get
    add_channel("up", "webhook", receiver.url)
    fire_loss("d", at=at(10))

    for seconds in range(10, 70, 10):  # passes of two rows each: fewer than "down"'s backlog
        deliver_due(now=at(seconds), limit=2)

    assert {b["target"]["name"] for b in receiver.bodies()} == {"a", "b", "c", "d"}
    assert not Notification.objects.filter(channel__name="down", delivered_at__isnull=False).exists()


def test_a_row_claimed_late_in_a_slow_run_is_neither_sent_twice_nor_retried_without_backoff(receiver, monkeypatch):
    add_channel("slow", "webhook", f"{receiver.url}/slow")
    add_channel("down", "webhook", f"{Receiver().url}/{SECRET_TOKEN}")   # no listener: refused at once
    add_channel("fast", "webhook", f"{receiver.url}/fast")
    fire_loss()
    original, later = webhook.send, time_machine.travel(at(600), tick=False)

    def send(channel, notification, session):
        if channel.name == "fast" and send.next_run:   # meanwhile, the next run starts
            send.next_run = False
            deliver_due(now=at(600))
        answer = original(channel, notification, session)
        if channel.name == "slow":   # the slow receiver took 10 minutes to answer
            later.start()
        return answer

    send.next_run = True
    monkeypatch.setattr(webhook, "send", send)
    try:
        deliver_due()   # the run's clock is the real one: the frozen clock, moved by the slow receiver
    finally:
        later.stop()

    assert sorted(request["path"] for request in receiver.requests) == ["/fast", "/slow"]
    failed = Notification.objects.get(channel__name="down")
    assert failed.attempts == 1 and failed.next_attempt_at == at(600 + 5)   # its backoff counts from its try


def test_a_long_answer_quoting_the_secret_where_it_is_cut_short_shows_no_part_of_it(receiver):
    receiver.status, receiver.text = 502, "x" * 272 + f"bad gateway for /in/{SECRET_TOKEN}"
    add_channel("hooks", "webhook", f"{receiver.url}/in/{SECRET_TOKEN}")
    fire_loss()
    deliver_due(now=T0)

    row = Notification.objects.get(channel__name="hooks")
    channel = Channel.objects.get(name="hooks")
    assert row.answer.startswith("HTTP 502: xxx")
    for text in (row.answer, row.last_error, channel.last_error):
        assert SECRET_TOKEN[:6] not in text


def test_an_answer_quoting_a_token_of_the_urls_query_alone_does_not_show_it(receiver):
    receiver.status, receiver.text = 401, "invalid token: Zq8%tokenVALUE"
    add_channel("chat", "webhook", f"{receiver.url}/v1/spaces/AAA/messages?key=K3yVALUE99&token=Zq8%25tokenVALUE")
    fire_loss()
    deliver_due(now=T0)

    row = Notification.objects.get(channel__name="chat")
    shown = Channel.objects.get(name="chat").as_json()
    assert shown["last_error"] == "HTTP 401: invalid token: ••••••••"
    assert "tokenVALUE" not in row.answer + row.last_error


def test_slack_names_a_watch_as_a_watch_and_counts_one_record_as_one_record():
    from alerts.channels.slack import message
    from alerts.payloads import channel_test_payload

    payload = channel_test_payload(Channel(name="chat"), now=T0)
    payload["target"]["type"] = "watch"
    payload["facts"] = {"partitions": {"0": {"count": 1, "offsets_text": "3"}}}

    blocks = message(payload)["blocks"]
    buttons = next(b for b in blocks if b["type"] == "actions")["elements"]
    assert buttons[0]["text"]["text"] == "Open the watch"
    assert any(b.get("text", {}).get("text") == "• partition 0: 1 record, offsets 3" for b in blocks)


@pytest.mark.parametrize("status", [400, 413, 422])
def test_a_message_the_receiver_refuses_as_invalid_is_given_up_at_once_and_holds_back_nothing_behind_it(receiver,
                                                                                                         status):
    """Sent again, the same body gets the same answer: retried for 72 h, it would hold every later message of
    its channel (they go in order) for as long."""
    receiver.answers = [(status, '{"status":"invalid event","message":"Event object is invalid"}')]
    add_channel("pager", "pagerduty", f"{receiver.url}/v2/enqueue", routing_key="RK")
    fire_loss("orders")
    fire_loss("payments", at=at(1))

    assert deliver_due(now=at(1)) == {"sent": 1, "failed": 0, "gave_up": 1}
    refused = Notification.objects.get(channel__name="pager", alert__pipeline__name="orders")
    assert refused.failed_at == at(1) and refused.delivered_at is None
    assert refused.last_error.startswith(f"HTTP {status}: ") and "invalid event" in refused.last_error
    assert [e["payload"]["component"] for e in receiver.bodies()] == ["orders", "payments"]
    assert deliver_due(now=at(3600)) == {"sent": 0, "failed": 0, "gave_up": 0}   # never sent again


@pytest.mark.parametrize("status", [401, 403, 404, 410])
def test_a_receiver_refusing_the_channels_url_or_key_is_retried_so_its_messages_go_out_once_it_is_fixed(receiver,
                                                                                                     status):
    receiver.answers = [(status, "invalid_token")]
    add_channel("chat", "slack", f"{receiver.url}/services/{SECRET_TOKEN}")
    fire_loss()
    assert deliver_due(now=T0) == {"sent": 0, "failed": 1, "gave_up": 0}
    assert deliver_due(now=at(5)) == {"sent": 1, "failed": 0, "gave_up": 0}


def test_slack_shows_a_summary_quoting_mrkdwn_control_characters_as_written_in_the_text_too():
    """A status alert's summary quotes the pipeline's last error, which may quote a record: `<!channel>` there
    must not notify a whole Slack channel, in the blocks or in the top-level text (its notifications)."""
    from alerts.channels.slack import message
    from alerts.payloads import channel_test_payload

    payload = channel_test_payload(Channel(name="chat"), now=T0)
    payload["summary"] = "status ERR: bad record <!channel> a&b <https://evil.example|click>"

    sent = message(payload)
    escaped = "status ERR: bad record &lt;!channel&gt; a&amp;b &lt;https://evil.example|click&gt;"
    assert sent["text"] == f"TEST (test): {escaped}"
    assert sent["blocks"][1]["text"]["text"] == escaped
    assert sent["blocks"][0]["text"]["text"].endswith("<!channel> a&b <https://evil.example|click>")  # plain_text


def test_pagerduty_names_a_watch_as_a_watch_in_its_link(receiver):
    from alerts import evaluate

    add_channel("pager", "pagerduty", f"{receiver.url}/v2/enqueue", routing_key="RK")
    rule = AlertRule.objects.get(kind=RuleKind.LOST, pipeline=None)
    watch = Watch.objects.create(name="billing", group_id="team-billing", topic="billing")
    evaluate.apply(rule, watch, evaluate.Finding("2 lost records"), T0, evaluate.EvaluationReport())
    deliver_due(now=T0)

    trigger = receiver.bodies()[0]
    assert trigger["links"][0] == {"href": "https://tally.example.com/watches/billing/", "text": "Watch billing"}
    assert trigger["payload"]["custom_details"]["target"]["type"] == "watch"


def test_a_rule_edited_to_another_kind_resolves_its_open_incident_and_opens_one_for_what_it_now_finds(receiver):
    """An open loss alert must not become a lag alert in place: the loss incident would stay open under the lag's
    numbers, and nobody would be told that lag fired."""
    add_channel("pager", "pagerduty", f"{receiver.url}/v2/enqueue", routing_key="RK")
    pipeline = fire_loss()
    deliver_due(now=T0)
    rule = AlertRule.objects.get(kind=RuleKind.LOST, pipeline=None)
    rule.kind, rule.threshold = RuleKind.LAG_RECORDS, 100
    rule.save()
    PartitionHealth.objects.filter(pipeline=pipeline).update(lag_records=500)

    report = evaluate_all(now=at(60))
    deliver_due(now=at(60))

    loss, lag = Alert.objects.filter(rule=rule).order_by("pk")
    assert (loss.state, loss.kind, loss.resolved_at) == (AlertState.RESOLVED, "lost", at(60))
    assert loss.facts["resolved_because"] == "rule 'Lost records' changed from lost to lag_records"
    assert (lag.state, lag.kind, lag.summary) == (AlertState.FIRING, "lag_records", "lag 500 records > 100")
    assert report.resolved == ["orders/Lost records"] and report.fired == ["orders/Lost records"]
    events = [(e["event_action"], e["dedup_key"]) for e in receiver.bodies()]
    assert events == [("trigger", dedup_key(loss)), ("resolve", dedup_key(loss)), ("trigger", dedup_key(lag))]
    assert dedup_key(loss) != dedup_key(lag)
    assert receiver.bodies()[2]["payload"]["class"] == "lag_records"
