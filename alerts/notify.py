"""Alert emails: rendered into the outbox when an alert changes state, sent (and retried) from there.

Queueing happens inside evaluation's transaction, so an email exists if and only if its state change
committed. Sending is separate: a claimed row is sent with Django's email framework (plain text + HTML);
a failure is recorded on the row and retried with exponential backoff, and never stops evaluation.
"""
import logging
from datetime import timedelta
from urllib.parse import quote

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection
from django.db import IntegrityError, transaction
from django.db.models import F
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from alerts.models import Notification, NotificationKind

logger = logging.getLogger("tally.alerts")

# Per delivery run: enough for a burst of alerts, small enough that one run stays short when SMTP is slow.
DELIVERY_BATCH = 50
# A claimed row is not picked again for this long, so two senders never send the same email at once.
CLAIM_SECONDS = 120
RETRY_BASE_SECONDS = 30
RETRY_MAX_SECONDS = 3600


def max_attempts() -> int:
    return getattr(settings, "ALERT_SEND_MAX_ATTEMPTS", 10)


def retry_delay(attempts: int) -> timedelta:
    """30 s, 60 s, 120 s, ... capped at an hour: an SMTP outage does not turn into a hammering loop."""
    return timedelta(seconds=min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2 ** max(0, attempts - 1)))


def absolute_url(path: str) -> str:
    return settings.TALLY_BASE_URL.rstrip("/") + path


def pipeline_url(pipeline) -> str:
    """The pipeline's page; its URL name belongs to the dashboard, so try the likely names."""
    for name, kwargs in (("pipeline", {"name": pipeline.name}), ("pipeline_detail", {"name": pipeline.name})):
        try:
            return absolute_url(reverse(name, kwargs=kwargs))
        except NoReverseMatch:
            continue
    return absolute_url(f"/pipelines/{quote(pipeline.name)}/")


def alerts_url(alert) -> str:
    try:
        path = reverse("alerts:list")
    except NoReverseMatch:
        path = "/alerts/"
    return absolute_url(f"{path}?pipeline={quote(alert.pipeline.name)}")


SUBJECT_PREFIX = {NotificationKind.FIRED: "FIRING", NotificationKind.REMINDER: "STILL FIRING",
                  NotificationKind.RESOLVED: "RESOLVED"}


def render(alert, kind: str, sequence: int, now) -> dict:
    context = {
        "alert": alert, "rule": alert.rule, "pipeline": alert.pipeline, "kind": kind, "sequence": sequence,
        "facts": alert.facts, "partitions": sorted((alert.facts.get("partitions") or {}).items(),
                                                   key=lambda item: int(item[0]) if item[0].isdigit() else 0),
        "now": now, "pipeline_url": pipeline_url(alert.pipeline), "alerts_url": alerts_url(alert),
        "firing_for": now - alert.started_at,
    }
    subject = f"[Tally] {SUBJECT_PREFIX[kind]}: {alert.pipeline.name}: {alert.summary}"
    return {"subject": subject[:300].replace("\n", " "),
            "body_text": render_to_string("emails/alert.txt", context),
            "body_html": render_to_string("emails/alert.html", context)}


def queue(alert, kind: str, sequence: int, now) -> Notification | None:
    """Put one email in the outbox; None if this state already has its email (the unique key says so)."""
    recipients = alert.rule.recipient_list()
    if not recipients:
        logger.warning("alert %s (%s) has no recipients: set ALERT_RECIPIENTS or the rule's recipients",
                       alert.pk, alert.summary)
    try:
        with transaction.atomic():
            return Notification.objects.create(alert=alert, kind=kind, sequence=sequence, recipients=recipients,
                                               created_at=now, next_attempt_at=now,
                                               **render(alert, kind, sequence, now))
    except IntegrityError:
        return None


def _claim(notification_id: int, now) -> bool:
    """Conditional UPDATE: only one sender gets the row (row count 1); others move on."""
    return bool(Notification.objects.filter(
        pk=notification_id, delivered_at__isnull=True, failed_at__isnull=True, next_attempt_at__lte=now,
    ).update(attempts=F("attempts") + 1, next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS)))


def send(notification: Notification, connection=None) -> None:
    message = EmailMultiAlternatives(subject=notification.subject, body=notification.body_text,
                                     from_email=settings.DEFAULT_FROM_EMAIL, to=notification.recipients,
                                     connection=connection)
    message.attach_alternative(notification.body_html, "text/html")
    message.send(fail_silently=False)


def deliver_due(now=None, limit: int = DELIVERY_BATCH) -> dict:
    """Send due outbox rows. Returns counts {"sent", "failed", "gave_up"}; never raises for a send error."""
    now = now or timezone.now()
    counts = {"sent": 0, "failed": 0, "gave_up": 0}
    due = list(Notification.objects.filter(delivered_at__isnull=True, failed_at__isnull=True, next_attempt_at__lte=now)
               .order_by("next_attempt_at", "pk").values_list("pk", flat=True)[:limit])
    connection = None
    for notification_id in due:
        if not _claim(notification_id, now):
            continue
        notification = Notification.objects.get(pk=notification_id)
        if not notification.recipients:
            Notification.objects.filter(pk=notification_id).update(failed_at=now, last_error="no recipients")
            counts["gave_up"] += 1
            continue
        try:
            connection = connection or get_connection(timeout=getattr(settings, "EMAIL_TIMEOUT", 10))
            send(notification, connection)
        except Exception as error:  # noqa: BLE001 - any SMTP/socket error is recorded and retried
            connection = None
            give_up = notification.attempts >= max_attempts()
            Notification.objects.filter(pk=notification_id).update(
                last_error=f"{type(error).__name__}: {error}"[:2000],
                next_attempt_at=now + retry_delay(notification.attempts),
                failed_at=now if give_up else None)
            counts["gave_up" if give_up else "failed"] += 1
            logger.warning("alert email %s attempt %s failed: %s", notification_id, notification.attempts, error)
            continue
        Notification.objects.filter(pk=notification_id).update(delivered_at=now, last_error="")
        counts["sent"] += 1
    if connection is not None:
        try:
            connection.close()
        except Exception:  # noqa: BLE001 - closing a dead connection is not worth failing for
            pass
    return counts
