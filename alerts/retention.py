"""Retention of alert history: resolved alerts (with their emails) and ended mutes older than
TALLY_RETAIN_ALERTS_DAYS are deleted, in batches (consumers/operations/retention.py does the same for the
consumers' tables). Open alerts -- firing or acknowledged -- are never deleted, whatever their age; the reminders
they sent longer ago than that are (an alert left firing is reminded hourly by default: 24 rendered messages a day
per receiver). Its "fired" messages stay, and each channel's newest reminder: a resolve goes to the channels that
heard the alert (outbox.routed_channels)."""
from datetime import datetime

from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from alerts.models import Alert, AlertState, Mute, Notification, NotificationKind
from consumers.operations.retention import Kind, delete_in_batches

ALERTS = Kind("alert history", "TALLY_RETAIN_ALERTS_DAYS")


def expired_alerts(now: datetime):
    return Alert.objects.filter(state=AlertState.RESOLVED, resolved_at__lt=ALERTS.cutoff(now))


def expired_mutes(now: datetime):
    return Mute.objects.filter(until__lt=ALERTS.cutoff(now))


def expired_reminders(now: datetime):
    """Reminders sent (or given up) before the cutoff, but a channel's newest one of its alert."""
    newer = Notification.objects.filter(alert=OuterRef("alert"), channel=OuterRef("channel"),
                                        kind=NotificationKind.REMINDER, sequence__gt=OuterRef("sequence"))
    return (Notification.objects.filter(kind=NotificationKind.REMINDER, created_at__lt=ALERTS.cutoff(now))
            .filter(Q(delivered_at__isnull=False) | Q(failed_at__isnull=False))
            .filter(Q(channel__isnull=True) | Exists(newer)))


def apply(now: datetime | None = None) -> dict[str, int]:
    now = now or timezone.now()
    return {"alerts": delete_in_batches(expired_alerts(now)), "mutes": delete_in_batches(expired_mutes(now)),
            "notifications": delete_in_batches(expired_reminders(now))}


def counts(now: datetime | None = None) -> list[dict]:
    now = now or timezone.now()
    return [{"name": ALERTS.name, "setting": ALERTS.setting, "days": ALERTS.days(), "rows": Alert.objects.count(),
             "past_retention": expired_alerts(now).count()}]
