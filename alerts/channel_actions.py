"""Adding, changing, deleting and testing channels: one place for the command, the page, the admin and the
API. Everything is validated before anything is written, and every change goes to the action log with the
channel's masked settings only: no secret ever reaches the log, a page or an answer."""
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from alerts import payloads
from alerts.channels import DeliveryFailed, Session, kind_of, redact
from alerts.models import Alert, AlertRule, Channel, Notification, NotificationKind
from consumers.models import ActionLog, ActionResult, error_text
from consumers.operations.errors import Invalid

SETTINGS = ("kind", "url", "recipients", "routing_key", "secret", "enabled")


class ChannelInvalid(Invalid):
    """The channel's settings are wrong: `problems` maps each field to its message."""


def _problems(error: ValidationError) -> dict:
    if hasattr(error, "error_dict"):
        return {field: " ".join(m for e in errors for m in e.messages) for field, errors in error.error_dict.items()}
    return {"channel": " ".join(error.messages)}


def rules_named(names: list[str]) -> list[AlertRule]:
    """The rules with these names (a name may be shared by a global rule and a pipeline's); unknown names refused."""
    rules = list(AlertRule.objects.filter(name__in=names))
    missing = sorted(set(names) - {rule.name for rule in rules})
    if missing:
        raise ChannelInvalid({"rules": f"No alert rule named {', '.join(map(repr, missing))}."})
    return rules


def log(action: str, actor: str, channel: Channel | None, message: str, result=ActionResult.DONE,
        params: dict | None = None) -> ActionLog:
    now = timezone.now()
    shown = channel.as_json() if channel is not None and channel.pk else {}
    shown = {key: shown[key] for key in ("name", "kind", "url", "to", "routing_key", "signed", "rules", "enabled")
             if key in shown}
    return ActionLog.objects.create(action=action, actor=(actor or "cli")[:150], params={**shown, **(params or {})},
                                    result=result, message=error_text(message), created_at=now, finished_at=now)


def save(channel: Channel, actor: str, rules: list[AlertRule] | None = None) -> Channel:
    """Validate and save a new or changed channel (and its routing, when `rules` is given); logged."""
    created = channel.pk is None
    try:
        channel.full_clean()
    except ValidationError as error:
        raise ChannelInvalid(_problems(error)) from None
    closed = close_incidents_before_change(channel)
    with transaction.atomic():
        channel.save()
        if rules is not None:
            channel.rules.set(rules)
        log("alert_channel_add" if created else "alert_channel_change", actor, channel,
            f"alert channel {channel.name!r} ({channel.kind}) {'added' if created else 'changed'}"
            + (f"; with its old settings, {closed}" if closed else ""))
    return channel


# What a channel's incidents are reached by: changed, they would be resolved elsewhere, or nowhere.
INCIDENT_SETTINGS = ("kind", "url", "routing_key")


def close_incidents_before_change(channel: Channel) -> str:
    """A saved channel about to change its kind, URL or routing key first resolves the incidents it opened, with its
    old settings, as delete() does: the resolves still to come would go through the new settings (another
    integration, or a webhook), and the incidents would stay open for good. Call it after validation, before the
    save. Returns what was said about them ("" when nothing was open)."""
    old = Channel.objects.filter(pk=channel.pk).first() if channel.pk else None
    if old is None or all(getattr(old, field) == getattr(channel, field) for field in INCIDENT_SETTINGS):
        return ""
    return close_open_incidents(old)


def delete(channel: Channel, actor: str) -> str:
    """Delete the channel and its outbox; logged. A kind that opens incidents (PagerDuty) first resolves those it
    opened and has not heard resolve: the resolve waiting in its outbox would go with it, and the incident would
    stay open for good. Returns what was said about them ("" when nothing was open)."""
    closed = close_open_incidents(channel)
    with transaction.atomic():
        log("alert_channel_delete", actor, channel,
            f"alert channel {channel.name!r} ({channel.kind}) deleted" + (f"; {closed}" if closed else ""))
        channel.delete()
    return closed


# How a failed try's reason starts when the receiver answered 4xx (alerts/channels/http.py, Answer), 429 aside: "slow
# down" says nothing of what an earlier try (a 500, a timeout) may have opened.
REFUSED_ANSWER = r"^HTTP 4([01][0-9]|2[0-8]|[3-9][0-9]): "


def incidents_opened(channel: Channel) -> list[str]:
    """The dedup_keys of the alerts whose "fired" (or a reminder) reached the channel, or may have, and whose resolve
    has not. A try that failed counts (a receiver may open the incident and still answer 500, or time out), unless
    its last answer was a 4xx other than 429: the receiver refused the event (a wrong key, a bad message), as it
    refused every try of that same event, so it opened nothing, and a resolve with that key would only be refused
    too."""
    may_have_opened = Q(delivered_at__isnull=False) | (Q(attempts__gt=0) & ~Q(last_error__regex=REFUSED_ANSWER))
    heard = Notification.objects.filter(may_have_opened, channel=channel,
                                        kind__in=(NotificationKind.FIRED, NotificationKind.REMINDER))
    resolved = Notification.objects.filter(channel=channel, delivered_at__isnull=False,
                                           kind=NotificationKind.RESOLVED)
    alerts = Alert.objects.filter(pk__in=heard.values("alert_id")).exclude(pk__in=resolved.values("alert_id"))
    return [payloads.dedup_key(alert) for alert in alerts.order_by("pk")]


def close_open_incidents(channel: Channel) -> str:
    close = getattr(kind_of(channel), "close_incident", None)
    if close is None:
        return ""
    said = []
    with Session() as session:
        for key in incidents_opened(channel):
            try:
                close(channel, key, session)
                said.append(f"resolved the incident {key}")
            except DeliveryFailed as error:
                said.append(f"the incident {key} stays open ({error}): resolve it in PagerDuty")
    return redact("; ".join(said), channel.secret_values())


def test(channel: Channel, actor: str) -> tuple[bool, str]:
    """Send a test message now (not through the outbox) and return (answered 2xx, the receiver's answer)."""
    with Session() as session:
        try:
            session.pace(channel, timezone.now())
            answer = str(kind_of(channel).test(channel, session))
            ok = True
        except DeliveryFailed as error:
            answer, ok = str(error), False
        except Exception as error:  # noqa: BLE001 - whatever went wrong is the answer the operator needs
            answer, ok = f"{type(error).__name__}: {error}", False
    answer = redact(answer, channel.secret_values())
    log("alert_channel_test", actor, channel, f"test of alert channel {channel.name!r}: {answer}",
        ActionResult.DONE if ok else ActionResult.FAILED)
    return ok, answer
