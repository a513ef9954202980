"""Retention of alert history: resolved alerts (with their emails) and ended mutes older than
TALLY_RETAIN_ALERTS_DAYS are deleted, in batches (consumers/operations/retention.py does the same for the
consumers' tables). Open alerts -- firing or acknowledged -- are never deleted, whatever their age."""
from datetime import datetime

from django.utils import timezone

from alerts.models import Alert, AlertState, Mute
from consumers.operations.retention import Kind, delete_in_batches

ALERTS = Kind("alert history", "TALLY_RETAIN_ALERTS_DAYS")


def expired_alerts(now: datetime):
    return Alert.objects.filter(state=AlertState.RESOLVED, resolved_at__lt=ALERTS.cutoff(now))


def expired_mutes(now: datetime):
    return Mute.objects.filter(until__lt=ALERTS.cutoff(now))


def apply(now: datetime | None = None) -> dict[str, int]:
    now = now or timezone.now()
    return {"alerts": delete_in_batches(expired_alerts(now)), "mutes": delete_in_batches(expired_mutes(now))}


def counts(now: datetime | None = None) -> list[dict]:
    now = now or timezone.now()
    return [{"name": ALERTS.name, "setting": ALERTS.setting, "days": ALERTS.days(), "rows": Alert.objects.count(),
             "past_retention": expired_alerts(now).count()}]
