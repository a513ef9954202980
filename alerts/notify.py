"""Alert emails' content (subject, plain text and HTML) and the links every notification carries.

alerts/outbox.py queues the rendered email with the other channels' messages and delivers them.
"""
import logging
from urllib.parse import quote

from django.conf import settings
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse

from alerts.models import NotificationKind

logger = logging.getLogger("tally.alerts")


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
    return absolute_url(f"{path}?pipeline={quote(alert.pipeline_label)}")


def subject_url(alert) -> str:
    """The page of what the alert is about: its pipeline's, or its watch's."""
    if alert.watch_id:
        return absolute_url(f"/watches/{quote(alert.pipeline_label)}/")
    return pipeline_url(alert.pipeline)


SUBJECT_PREFIX = {NotificationKind.FIRED: "FIRING", NotificationKind.REMINDER: "STILL FIRING",
                  NotificationKind.RESOLVED: "RESOLVED", NotificationKind.ACKNOWLEDGED: "ACKNOWLEDGED"}


def subject(alert, kind: str) -> str:
    """One line: a summary quoting an error may hold "\r\n" (or any line break), and Django refuses a header with
    "\r" or "\n" in it (BadHeaderError), so the email would never go. Joined first, then cut."""
    text = f"[Tally] {SUBJECT_PREFIX[kind]}: {alert.pipeline_label}: {alert.summary}"
    return " ".join(text.splitlines())[:300]


def render(alert, kind: str, sequence: int, now) -> dict:
    context = {
        "alert": alert, "rule": alert.rule, "pipeline": alert.subject, "kind": kind, "sequence": sequence,
        "facts": alert.facts, "partitions": sorted((alert.facts.get("partitions") or {}).items(),
                                                   key=lambda item: int(item[0]) if item[0].isdigit() else 0),
        "now": now, "pipeline_url": subject_url(alert), "alerts_url": alerts_url(alert),
        "firing_for": now - alert.started_at,
    }
    return {"subject": subject(alert, kind),
            "body_text": render_to_string("emails/alert.txt", context),
            "body_html": render_to_string("emails/alert.html", context)}
