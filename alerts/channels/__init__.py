"""Notification channels: one module per kind behind one small protocol (alerts/channels/base.py says it),
and the session a delivery run shares between them (one SMTP connection, one HTTP connection pool, and the pace
of each channel whose kind asks for one)."""
import time
from datetime import timedelta

import requests
from django.conf import settings
from django.core.mail import get_connection
from django.db import transaction
from django.db.models import Q

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
    """Connections reused across one delivery run; closed at its end. It also paces the sends to a channel whose
    kind takes messages no faster than its SEND_INTERVAL_SECONDS (Slack: a second per webhook). A burst over that
    pace is answered with 429s, and each message refused so waited for a later run. `sleep` is injected by tests."""

    def __init__(self, sleep=time.sleep):
        self._smtp = None
        self._http = None
        self._sleep = sleep

    def pace(self, channel, now) -> None:
        """Wait, if need be, until the channel's kind takes another message; call right before sending to it, with
        the run's clock. The pace is kept on the rows of every channel of its kind with its URL (`next_send_at`),
        taken under their row locks (in pk order), so delivery runs that overlap, test messages and channels that
        share a webhook share it: each send gets its own slot, an interval after the last."""
        from alerts.models import Channel

        interval = timedelta(seconds=getattr(kind_of(channel), "SEND_INTERVAL_SECONDS", 0))
        if not interval:
            return
        # The receiver's limit is per URL: channels that share one (a second name, other rules) share its pace.
        sharing = Channel.objects.filter(Q(pk=channel.pk) | Q(kind=channel.kind, url=channel.url))
        with transaction.atomic():
            dues = list(sharing.select_for_update().order_by("pk").values_list("next_send_at", flat=True))
            due = max((d for d in dues if d is not None), default=None)
            # Never more than one interval ahead: a clock set back must not hold the channel for its difference
            slot = now if due is None else min(max(now, due), now + interval)
            sharing.update(next_send_at=slot + interval)
        if slot > now:
            self._sleep((slot - now).total_seconds())

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
