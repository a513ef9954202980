"""Email: the rendered subject and bodies of the outbox row, sent with Django's email framework (SMTP).
A rule's own recipients (`channel=None`) and email channels both go this way."""
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import EmailMultiAlternatives
from django.core.validators import validate_email

from alerts.channels.base import Answer, DeliveryFailed, unused_settings


def _send(subject, text, html, recipients, session) -> Answer:
    message = EmailMultiAlternatives(subject=subject, body=text, from_email=settings.DEFAULT_FROM_EMAIL,
                                     to=recipients, connection=session.smtp)
    if html:
        message.attach_alternative(html, "text/html")
    try:
        message.send(fail_silently=False)
    except Exception as error:  # noqa: BLE001 - any SMTP/socket error is the receiver's answer
        session.drop_smtp()
        raise DeliveryFailed(f"{type(error).__name__}: {error}") from None
    return Answer(None, f"accepted by the mail server for {', '.join(recipients)}")


def send(channel, notification, session) -> Answer:
    if not notification.recipients:
        raise DeliveryFailed("no recipients")
    return _send(notification.subject, notification.body_text, notification.body_html, notification.recipients,
                 session)


def test(channel, session) -> Answer:
    return _send(f"[Tally] test of alert channel {channel.name}",
                 f"This is a test of the alert channel {channel.name}.\n"
                 "When a rule routed here fires, its email comes to this address.", "",
                 channel.recipient_list(), session)


MAX_LOCAL_PART = 64  # RFC 5321 4.5.3.1.1; Django's validate_email checks only the whole address's length


def address_problem(address: str) -> str | None:
    """Why a mail server would refuse this address, or None: the one check for rules' and channels' recipients."""
    try:
        validate_email(address)
    except ValidationError:
        return f"{address!r} is not an email address."
    if len(address.rpartition("@")[0]) > MAX_LOCAL_PART:
        return f"{address!r}: the part before @ is longer than {MAX_LOCAL_PART} characters."
    return None


def mask(channel) -> dict:
    return {"to": channel.recipient_list()}


def problems(channel) -> dict:
    found = {}
    addresses = channel.recipient_list()
    if not addresses:
        found["recipients"] = "An email channel needs at least one address (--to)."
    for address in addresses:
        if problem := address_problem(address):
            found["recipients"] = problem
    found.update(unused_settings(channel, ("url", "routing_key", "secret"),
                                 "An email channel takes no URL, routing key or secret."))
    return found


def secret_values(channel) -> list[str]:
    return []
