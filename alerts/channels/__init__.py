"""Notification channels: one module per kind behind one small protocol (alerts/channels/base.py says it),
and the session a delivery run shares between them (one SMTP connection, one HTTP connection pool)."""
import requests
from django.conf import settings
from django.core.mail import get_connection

from alerts.channels import email, pagerduty, slack, webhook
from alerts.channels.base import MASK, Answer, DeliveryFailed, redact

KINDS = {"email": email, "webhook": webhook, "slack": slack, "pagerduty": pagerduty}

__all__ = ["KINDS", "MASK", "Answer", "DeliveryFailed", "Session", "kind_of", "problems", "redact"]


def kind_of(channel):
    """The kind module of a channel; `None` (a rule's own recipients) is email."""
    return KINDS[channel.kind] if channel is not None else email


def problems(channel) -> dict:
    """Field -> message for every setting that is wrong for the channel's kind (the model's clean())."""
    if channel.kind not in KINDS:
        return {"kind": f"Unknown kind {channel.kind!r}: use {', '.join(KINDS)}."}
    return kind_of(channel).problems(channel)


class Session:
    """Connections reused across one delivery run; closed at its end."""

    def __init__(self):
        self._smtp = None
        self._http = None

    @property
    def smtp(self):
        if self._smtp is None:
            self._smtp = get_connection(timeout=getattr(settings, "EMAIL_TIMEOUT", 10))
        return self._smtp

    def drop_smtp(self) -> None:
        """After an SMTP error the connection is in an unknown state: the next message opens a new one."""
        self._smtp = None

    @property
    def http(self) -> requests.Session:
        if self._http is None:
            self._http = requests.Session()
        return self._http

    def close(self) -> None:
        for connection in (self._smtp, self._http):
            try:
                if connection is not None:
                    connection.close()
            except Exception:  # noqa: BLE001 - closing a dead connection is not worth failing for
                pass
        self._smtp = self._http = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
