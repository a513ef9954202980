"""Notification channels: one module per kind behind one small protocol (alerts/channels/base.py says it),
and the session a delivery run shares between them (one SMTP connection, one HTTP connection pool, and the pace
of each channel whose kind asks for one)."""
import time

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
    """Connections reused across one delivery run; closed at its end. It also paces the run's sends to a channel
    whose kind takes messages no faster than its SEND_INTERVAL_SECONDS (Slack: a second per webhook). A burst over
    that pace is answered with 429s, and each message refused so waited for a later run. `clock` and `sleep` are
    injected by tests."""

    def __init__(self, clock=time.monotonic, sleep=time.sleep):
        self._smtp = None
        self._http = None
        self._clock, self._sleep = clock, sleep
        self._last_send: dict[int, float] = {}   # channel id -> when this run last sent to it

    def pace(self, channel) -> None:
        """Wait, if need be, until the channel's kind takes another message; call right before sending to it."""
        interval = getattr(kind_of(channel), "SEND_INTERVAL_SECONDS", 0)
        if not interval:
            return
        last = self._last_send.get(channel.pk)
        if last is not None and (wait := last + interval - self._clock()) > 0:
            self._sleep(wait)
        self._last_send[channel.pk] = self._clock()

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
