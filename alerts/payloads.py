"""The JSON every non-email channel is built from (and the webhook's body): one notification, rendered
when it is queued, so a retry hours later still carries the original times and values.

Its shape is documented, with a JSON schema, in docs/alerts.md; tests validate real payloads against it.
"""
from alerts.models import Installation, NotificationKind, RuleKind
from alerts.notify import alerts_url, subject_url

SCHEMA_VERSION = 1
SEVERITY = {
    # What PagerDuty and the webhook's receivers page on: data went wrong, or a consumer is down.
    RuleKind.LOST: "critical", RuleKind.DUPLICATED: "critical", RuleKind.PHANTOM: "critical",
    RuleKind.GAP: "critical", RuleKind.STATUS: "error", RuleKind.NO_CONSUMER: "error",
    RuleKind.LAG_RECORDS: "warning", RuleKind.LAG_SECONDS: "warning", RuleKind.DEAD_LETTERS: "warning",
}
EVENT_TEXT = {NotificationKind.FIRED: "firing", NotificationKind.REMINDER: "still firing",
              NotificationKind.RESOLVED: "resolved", NotificationKind.ACKNOWLEDGED: "acknowledged"}


def _iso(moment):
    return moment.isoformat() if moment else None


def cluster_name(monitored) -> str:
    """The Kafka cluster of a pipeline or watch (both keep its name)."""
    return monitored.cluster or "default"


def dedup_key(alert) -> str:
    """One per incident (alert), the same for its trigger, reminders and resolve: PagerDuty's dedup_key. It names
    the installation: alert ids alone repeat across installations sharing an integration key, and in a database
    created again. An alert opened before keeps the key its incident was opened with."""
    return alert.legacy_dedup_key or f"tally-{Installation.current().key.hex}-alert-{alert.pk}"


def build(alert, kind: str, sequence: int, now) -> dict:
    pipeline, rule = alert.subject, alert.rule   # the pipeline, or the watch (a group Tally does not run)
    facts = alert.facts or {}
    values = {key: facts[key] for key in ("value", "threshold", "count", "status", "interval_seconds")
              if facts.get(key) is not None}
    return {
        "version": SCHEMA_VERSION,
        "id": f"{dedup_key(alert)}/{kind}/{sequence}",
        "event": kind,
        "reminder": sequence,
        "dedup_key": dedup_key(alert),
        "summary": alert.summary,
        "severity": SEVERITY.get(alert.kind, "error"),
        "state": alert.state,
        "fired_at": _iso(alert.started_at),
        "event_at": _iso(now),
        "resolved_at": _iso(alert.resolved_at),
        "acknowledged_by": alert.acknowledged_by or None,
        "rule": {"name": alert.rule_label, "kind": alert.kind,
                 "threshold": rule.threshold if rule is not None else None},
        "target": {"type": "watch" if alert.watch_id else "pipeline", "name": pipeline.name, "topic": pipeline.topic,
                   "group": pipeline.group_id or pipeline.name, "cluster": cluster_name(pipeline)},
        "cluster": cluster_name(pipeline),
        "values": values,
        "facts": facts,
        "links": {"pipeline": subject_url(alert), "alerts": alerts_url(alert)},
    }


def headline(payload: dict) -> str:
    """One line, for chat and incident titles: "FIRING orders: 3 lost records (…)"."""
    event = EVENT_TEXT.get(payload["event"], payload["event"]).upper()
    return f"{event} {payload['target']['name']}: {payload['summary']}"


def channel_test_payload(channel, now=None) -> dict:
    """What `alert_channel test` sends: the payload's shape with event "test", about no real pipeline."""
    from django.utils import timezone

    from alerts.notify import absolute_url

    now = now or timezone.now()
    # Named after the installation, as real alerts' keys are: installations sharing an integration key and a
    # channel name would otherwise fold their tests into one incident, and either's resolve would close it.
    key = f"tally-{Installation.current().key.hex}-test-{channel.name}-{now.timestamp():.0f}"
    return {
        "version": SCHEMA_VERSION, "id": f"{key}/test/0", "event": "test", "reminder": 0, "dedup_key": key,
        "summary": f"Test of the alert channel {channel.name}: nothing is wrong.", "severity": "info",
        "state": "resolved", "fired_at": _iso(now), "event_at": _iso(now), "resolved_at": None,
        "acknowledged_by": None, "rule": {"name": "test", "kind": "test", "threshold": None},
        "target": {"type": "pipeline", "name": "(test)", "topic": "", "group": "", "cluster": "default"},
        "cluster": "default", "values": {}, "facts": {},
        "links": {"pipeline": absolute_url("/"), "alerts": absolute_url("/alerts/")},
    }
