"""Celery tasks of alerts: evaluation and the outbox (emails and channels). Thin wrappers over plain functions."""
from celery import shared_task
from celery.signals import task_success

# Alerts are evaluated right after each reconciliation (its beat task), so an incident is emailed within
# one reconciliation interval; the "alerts-evaluate" beat entry is the backstop when no reconciliation runs.
RECONCILE_TASKS = ("consumers.reconcile_all", "consumers.reconcile_pipeline")


@shared_task(name="tally.alerts.evaluate")
def evaluate_alerts_task():
    """Evaluate every alert rule once, then deliver the due notifications (emails and channels).
    Idempotent: safe to run any time, twice, or right after a reconciliation."""
    from alerts.evaluate import evaluate_all
    from alerts.outbox import deliver_due

    report = evaluate_all()
    emails = deliver_due()
    return {"firing": len(report.firing), "fired": len(report.fired), "resolved": len(report.resolved), **emails}


@shared_task(name="tally.alerts.deliver")
def deliver_alert_emails_task():
    """Deliver due outbox rows (first attempts and retries whose backoff has passed), emails and channels."""
    from alerts.outbox import deliver_due

    return deliver_due()


@task_success.connect
def evaluate_alerts_after_reconciliation(sender=None, **kwargs):
    if getattr(sender, "name", None) in RECONCILE_TASKS:
        evaluate_alerts_task.delay()


@shared_task(name="tally.alerts.apply_retention")
def apply_alert_retention_task() -> dict:
    """Delete resolved alerts (with their emails) and ended mutes past TALLY_RETAIN_ALERTS_DAYS."""
    from alerts.retention import apply

    return apply()
