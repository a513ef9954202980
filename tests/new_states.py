"""The states Tally learnt lately, made the way Tally makes them, for the tests that visit every page and call
every API operation after them: topic checks failed because their worker stopped answering, running with a
heartbeat, queued; an alert acknowledged while PagerDuty and Slack are routed (acknowledged messages delivered and
failed) and one with more notifications than a page; a watch never checked and one with a partition added since
its check; a JSON pipeline mapping an epoch in seconds; a pipeline whose cluster's password file is gone.
No tests here."""
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from alerts import channel_actions, evaluate, outbox
from alerts.models import Alert, AlertRule, AlertState, Channel, Notification, NotificationKind, RuleKind
from consumers.models import Pipeline, Status, TopicCheckJob, Watch, WatchPartition
from tests.receivers import Receiver
from tests.views_helpers import make_pipeline

MANY_NOTIFICATIONS = 60  # more than the API's default page of 50


@dataclass
class NewStates:
    pipeline: Pipeline          # with its three topic checks
    acknowledged: Alert         # routed to PagerDuty and Slack
    noisy: Alert                # MANY_NOTIFICATIONS reminders
    json_pipeline: Pipeline     # created_at=ts::seconds
    broken: Pipeline | None     # its cluster's password file removed (None unless asked)


def topic_checks(pipeline: Pipeline, now) -> None:
    """A check failed because its worker stopped answering (as the beat's pass ends it), one running with a
    fresh heartbeat, one queued."""
    common = {"pipeline": pipeline, "topic": pipeline.topic, "group_id": pipeline.group_id or "g",
              "table": pipeline.sink_table, "key_column": "value", "requested_by": "otto"}
    stale = TopicCheckJob.objects.create(**common, created_at=now - timedelta(minutes=30))
    TopicCheckJob.objects.filter(pk=stale.pk).claim(now - timedelta(minutes=29))
    assert TopicCheckJob.objects.fail_stale(now) == 1
    running = TopicCheckJob.objects.create(**common, created_at=now - timedelta(minutes=2))
    TopicCheckJob.objects.filter(pk=running.pk).claim(now - timedelta(minutes=1))
    TopicCheckJob.objects.filter(pk=running.pk).heartbeat(now)
    TopicCheckJob.objects.filter(pk=running.pk).update(progress=0.4, progress_message="reading partition 1")
    TopicCheckJob.objects.create(**common, created_at=now)


def alerts(pipeline: Pipeline, now) -> tuple[Alert, Alert]:
    """An alert that fired to PagerDuty and Slack and was acknowledged: PagerDuty took the acknowledge, Slack
    answered 500 until the outbox gave it up (and the channel shows failing); and an alert with
    MANY_NOTIFICATIONS reminders."""
    pager_receiver, chat_receiver = Receiver().start(), Receiver().start()
    try:
        return _acknowledged(pipeline, now, pager_receiver, chat_receiver), _noisy(pipeline, now)
    finally:
        pager_receiver.stop()
        chat_receiver.stop()


def _acknowledged(pipeline: Pipeline, now, pager_receiver, chat_receiver) -> Alert:
    rule = AlertRule.objects.create(name="loss", kind=RuleKind.LOST, pipeline=pipeline, recipients="ops@example.com")
    channel_actions.save(Channel(name="pager", kind="pagerduty", url=f"{pager_receiver.url}/v2/enqueue",
                                 routing_key="RK-secret"), "test", None)
    channel_actions.save(Channel(name="chat", kind="slack", url=f"{chat_receiver.url}/services/T/B/secret"),
                         "test", None)
    # Days ago: the outbox gives a channel's message up after ALERT_CHANNEL_GIVE_UP_HOURS (72) of failures.
    started, taken = now - timedelta(days=4), now - timedelta(days=3, hours=12)
    alert = Alert.objects.create(rule=rule, pipeline=pipeline, state=AlertState.FIRING, summary="3 lost",
                                 started_at=started, last_seen_at=now)
    outbox.queue(alert, NotificationKind.FIRED, 0, started)
    assert outbox.deliver_due(now=started) == {"sent": 3, "failed": 0, "gave_up": 0}
    assert evaluate.acknowledge(alert, "olga", now=taken)
    chat_receiver.status = 500
    assert outbox.deliver_due(now=taken) == {"sent": 1, "failed": 1, "gave_up": 0}
    for hours in (1, 2, 3, 4):
        outbox.deliver_due(now=taken + timedelta(hours=hours))
    assert outbox.deliver_due(now=taken + timedelta(hours=73)) == {"sent": 0, "failed": 0, "gave_up": 1}
    told = Notification.objects.filter(alert=alert, kind=NotificationKind.ACKNOWLEDGED)
    assert sorted((n.channel.name, n.delivered_at is not None, n.failed_at is not None) for n in told) == [
        ("chat", False, True), ("pager", True, False)]
    return Alert.objects.get(pk=alert.pk)


def _noisy(pipeline: Pipeline, now) -> Alert:
    rule = AlertRule.objects.create(name="lagging", kind=RuleKind.LAG_RECORDS, threshold=10, pipeline=pipeline)
    started = now - timedelta(hours=1)
    noisy = Alert.objects.create(rule=rule, pipeline=pipeline, state=AlertState.FIRING, summary="lag 40",
                                 started_at=started, last_seen_at=now)
    Notification.objects.bulk_create(
        Notification(alert=noisy, kind=NotificationKind.REMINDER, sequence=n, subject=f"reminder {n}", body_text="",
                     body_html="", created_at=started + timedelta(seconds=n), next_attempt_at=started,
                     attempts=1, delivered_at=started + timedelta(seconds=n))
        for n in range(1, MANY_NOTIFICATIONS + 1))
    return noisy


def watches(now) -> None:
    """`never`: no check yet. `grown`: checked (OK) before its topic grew a partition, which nobody checked."""
    never = Watch.objects.create(name="never", group_id="never-group", topic="orders-topic")
    WatchPartition.objects.create(watch=never, partition=0, start_offset=0, settled_offset=0)
    grown = Watch.objects.create(name="grown", group_id="grown-group", topic="orders-topic", status=Status.OK,
                                 checked_at=now - timedelta(minutes=5), lag_records=0, lag_seconds=0)
    WatchPartition.objects.create(watch=grown, partition=0, start_offset=0, settled_offset=10, committed=10,
                                  high_watermark=10, log_start=0, lag_records=0, lag_seconds=0, checked=10,
                                  status=Status.OK, checked_at=now - timedelta(minutes=5))
    WatchPartition.objects.create(watch=grown, partition=1, start_offset=0, settled_offset=0)


def json_pipeline() -> Pipeline:
    pipeline = make_pipeline("events-json", partitions=1, topic="events")
    Pipeline.objects.filter(pk=pipeline.pk).update(transform="json", json_map={"created_at": "ts::seconds"})
    return Pipeline.objects.get(pk=pipeline.pk)


def broken_cluster(settings, tmp_path) -> Pipeline:
    """A pipeline of the cluster `payments`, whose SASL password file was removed."""
    clusters = tmp_path / "clusters.toml"
    clusters.write_text('[clusters.payments]\nbootstrap_servers = "127.0.0.1:9"\n'
                        'security_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "PLAIN"\n'
                        f'sasl_username = "tally"\nsasl_password_file = "{tmp_path / "gone"}"\n')
    settings.TALLY_KAFKA_CLUSTERS = str(clusters)
    return make_pipeline("payments-orders", partitions=1, topic="payments", with_history=False)


def make_new_states(settings=None, tmp_path=None) -> NewStates:
    now = timezone.now()
    pipeline = make_pipeline("orders")
    topic_checks(pipeline, now)
    acknowledged, noisy = alerts(pipeline, now)
    watches(now)
    broken = broken_cluster(settings, tmp_path) if settings is not None else None
    if broken is not None:
        from consumers.reconciliation.reconcile import reconcile_pipeline

        Pipeline.objects.filter(pk=broken.pk).update(cluster="payments")
        broken.refresh_from_db()
        reconcile_pipeline(broken)   # as beat does: Kafka cannot be asked, and the pipeline's health says so
    return NewStates(pipeline, acknowledged, noisy, json_pipeline(), broken)
