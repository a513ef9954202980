"""The outbox: every notification is a row, written in evaluation's transaction when an alert changes state,
then delivered here, retried with backoff until the receiver answers, and never sent again once it did.

Queue (inside evaluation's transaction, so a message exists if and only if its state change committed):
  one row for the rule's own email recipients (`channel=None`) and one per channel routed to the rule,
  each unique per (alert, channel, kind, sequence). A "resolved" goes to the channels that heard the alert
  fire, even during a mute: whoever was told an incident opened is told it closed (PagerDuty resolves it).
  A channel routed to a firing alert after it fired gets its "fired" then (`queue_for_new_channels`), and an
  operator's acknowledge goes to the channels that heard the alert fire (or hold its "fired") and whose kind
  acknowledges (`queue_acknowledged`: PagerDuty, Slack), disabled ones included.
Deliver (`deliver_due`, from `check_alerts` and the Celery task), in order per channel:
  1. pick due rows, oldest first; a channel's row waits while an older one of the same channel is pending,
     so a receiver that was down gets fired, reminder, resolved in that order once it is back (a channel
     whose oldest row waits for its retry is left out of the pick, so its backlog never starves the others);
  2. claim the row with a conditional UPDATE (one sender wins; the claim pushes `next_attempt_at` ahead);
  3. send it through its kind (alerts/channels/); a 2xx (or SMTP's acceptance) sets `delivered_at` and the
     row is never picked again; a failure records the scrubbed reason and the next attempt time, or gives the
     row up at once when the receiver refused the message itself (a 400, 413 or 422: sent again, it would be
     refused again, and it would hold the channel's later messages behind it);
  4. a channel whose tries keep failing is marked failing, and the admins get one email per failing spell; a
     rate limit (429) is not a failure: its row waits as asked, and the channel's count is left as it was, until
     the row has waited longer than the longest wait a receiver may ask for (an hour).
A disabled channel's unsent reminders are dropped (given up, saying so) before the pick, and so is the unsent
"fired" of an alert that has resolved since: only its resolves and acknowledges go out meanwhile, and nothing holds
them back but their own alert's rows. The rule's own emails keep the same order per alert.
A crash between the receiver's 2xx and step 3's UPDATE sends that row again after the claim expires: the
payload's `id` (and the webhook's `X-Tally-Delivery`) lets a receiver drop the repeat.
"""
import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from alerts import notify, payloads
from alerts.channels import KINDS, DeliveryFailed, Session, kind_of, redact
from alerts.channels.base import short
from alerts.channels.http import longest_send_seconds
from alerts.models import Channel, ChannelKind, Notification, NotificationKind
from consumers.models import error_text

logger = logging.getLogger("tally.alerts")

# Per delivery run: enough for a burst of alerts, small enough that one run stays short when receivers are slow.
DELIVERY_BATCH = 50
# Rows picked per row a run may try: the rows behind a channel's failed one are picked and skipped.
PICKED_PER_TRIED = 20
# A claimed row is not picked again for this long, so two senders never send the same message at once. It must
# outlast the claim's send, or another run sends the message again meanwhile: a pace wait (Slack: 1 s at most,
# Session.pace) and one HTTP send (5 s to connect and three times the 10 s timeout at most, http.longest_send_seconds),
# 36 s with the defaults. A timeout raised so far that this is not well above that lengthens it (claim_seconds).
CLAIM_SECONDS = 120
CLAIM_MARGIN = 3
# Email retries start at 30 s (mail servers greylist for about that long); HTTP receivers at 5 s.
EMAIL_RETRY_BASE_SECONDS = 30
HTTP_RETRY_BASE_SECONDS = 5
RETRY_MAX_SECONDS = 300
# A receiver's Retry-After (429, 503) is honoured when it asks for longer than the backoff, up to this: a
# receiver asking for days would otherwise hold its channel's messages long after it is back.
RETRY_AFTER_MAX_SECONDS = 3600
DROPPED_WHILE_DISABLED = "dropped: the channel was disabled (a reminder is not held for it)"


def claim_seconds() -> float:
    """How long a claim holds its row: CLAIM_SECONDS, or longer when ALERT_CHANNEL_TIMEOUT_SECONDS is set so high
    that the longest send with its pace wait comes within CLAIM_MARGIN times of it."""
    pace = max(getattr(kind, "SEND_INTERVAL_SECONDS", 0) for kind in KINDS.values())
    return max(CLAIM_SECONDS, CLAIM_MARGIN * (longest_send_seconds() + pace))


def max_attempts() -> int:
    """Attempts for the rules' own emails before giving up."""
    return getattr(settings, "ALERT_SEND_MAX_ATTEMPTS", 10)


def channel_give_up_after() -> timedelta:
    """A channel's message is retried for this long (every 5 minutes at most) before it is given up."""
    return timedelta(hours=getattr(settings, "ALERT_CHANNEL_GIVE_UP_HOURS", 72))


def failing_after() -> int:
    """Consecutive failed attempts after which a channel shows as failing and the admins are told."""
    return getattr(settings, "ALERT_CHANNEL_FAILING_AFTER", 5)


def retry_delay(attempts: int, base: int = EMAIL_RETRY_BASE_SECONDS) -> timedelta:
    """base, 2 x base, 4 x base, ... capped at 5 minutes: an outage is not hammered, and a receiver that comes
    back gets its messages within 5 minutes."""
    return timedelta(seconds=min(RETRY_MAX_SECONDS, base * 2 ** max(0, attempts - 1)))


# --- queueing ---------------------------------------------------------------------------------------------

def routed_channels(alert, kind: str):
    """The channels a notification of `kind` goes to. Fired and reminders: the enabled channels chosen for
    the rule, and those with no routing (every rule). Resolved: the channels that heard it fire."""
    if kind == NotificationKind.RESOLVED:
        heard = Notification.objects.filter(alert=alert, channel__isnull=False,
                                            kind__in=(NotificationKind.FIRED, NotificationKind.REMINDER))
        return Channel.objects.filter(pk__in=heard.values("channel_id")).order_by("pk")
    return (Channel.objects.filter(enabled=True).filter(Q(rules=alert.rule) | Q(rules__isnull=True))
            .distinct().order_by("pk"))


def _create(alert, channel, kind, sequence, now, **content) -> Notification | None:
    try:
        with transaction.atomic():
            return Notification.objects.create(alert=alert, channel=channel, kind=kind, sequence=sequence,
                                               created_at=now, next_attempt_at=now, **content)
    except IntegrityError:
        return None  # this state already has its message on this channel


def queue(alert, kind: str, sequence: int, now, email: bool = True) -> list[Notification]:
    """Put this state's messages in the outbox; returns the rows created (none if they all existed).
    `email=False` skips the rule's own recipients (a mute holds them; channels still hear a resolve)."""
    channels = list(routed_channels(alert, kind))
    rendered = notify.render(alert, kind, sequence, now)
    payload = payloads.build(alert, kind, sequence, now)
    created = []
    recipients = alert.rule.recipient_list()
    if email and (recipients or not channels):
        if not recipients:
            logger.warning("alert %s (%s) has no recipients: set ALERT_RECIPIENTS, the rule's recipients or "
                           "a channel", alert.pk, alert.summary)
        created.append(_create(alert, None, kind, sequence, now, recipients=recipients, payload=payload,
                               **rendered))
    created += _to_channels(alert, channels, kind, sequence, now, rendered, payload)
    return [row for row in created if row is not None]


def queue_for_new_channels(alert, now) -> list[Notification]:
    """A firing alert's "fired" message for the channels it routes to that have heard nothing of it: one added,
    enabled or routed to the rule after the alert fired would otherwise wait for the next reminder (or, for a
    rule without reminders, never hear of it). Returns the rows created."""
    heard = Notification.objects.filter(alert=alert, channel__isnull=False).values("channel_id")
    channels = list(routed_channels(alert, NotificationKind.FIRED).exclude(pk__in=heard))
    if not channels:
        return []
    rendered = notify.render(alert, NotificationKind.FIRED, 0, now)
    payload = payloads.build(alert, NotificationKind.FIRED, 0, now)
    return [row for row in _to_channels(alert, channels, NotificationKind.FIRED, 0, now, rendered, payload)
            if row is not None]


def queue_acknowledged(alert, now) -> list[Notification]:
    """An operator's acknowledge, for the channels that heard the alert fire and whose kind has a word for it
    (PagerDuty acknowledges the incident; Slack gets a line). Email and webhooks get nothing: the next message
    they see is the resolve. Returns the rows created.
    Disabled channels too: one holding the alert's "fired" sends it once enabled again, and without its acknowledge
    behind it PagerDuty would page for an alert someone has taken. Held behind that "fired", it goes after it, or
    is dropped with it if the alert resolves first (_drop_held_rows_of_disabled_channels); behind a "fired" already
    sent, it goes at once, as a resolve would."""
    kinds = [name for name, module in KINDS.items() if getattr(module, "ACKNOWLEDGES", False)]
    channels = list(routed_channels(alert, NotificationKind.RESOLVED).filter(kind__in=kinds))
    if not channels:
        return []
    kind = NotificationKind.ACKNOWLEDGED
    rendered = {"subject": notify.subject(alert, kind), "body_text": "", "body_html": ""}
    return [row for row in _to_channels(alert, channels, kind, 0, now, rendered, payloads.build(alert, kind, 0, now))
            if row is not None]


def _to_channels(alert, channels, kind, sequence, now, rendered: dict, payload: dict) -> list:
    created = []
    for channel in channels:
        is_email = channel.kind == ChannelKind.EMAIL
        content = rendered if is_email else {"subject": rendered["subject"], "body_text": "", "body_html": ""}
        created.append(_create(alert, channel, kind, sequence, now, payload=payload,
                               recipients=channel.recipient_list() if is_email else [], **content))
    return created


# --- delivering -------------------------------------------------------------------------------------------

def _claim(notification_id: int, now) -> bool:
    """Conditional UPDATE: only one sender gets the row (row count 1); others move on."""
    return bool(Notification.objects.filter(
        pk=notification_id, delivered_at__isnull=True, failed_at__isnull=True, next_attempt_at__lte=now,
    ).update(attempts=F("attempts") + 1, next_attempt_at=now + timedelta(seconds=claim_seconds())))


# What a disabled channel still sends (see deliver_due); the rest of its rows are held while it is disabled.
SENT_WHILE_DISABLED = (NotificationKind.RESOLVED, NotificationKind.ACKNOWLEDGED)


def _older_pending(pk, channel_id, alert_id, created_at):
    """The pending rows a row waits behind (each argument a value, or an OuterRef in a query):
    - on its channel, the older ones, but for a row held on a disabled channel of another alert: that row is not
      sent while the channel is disabled, and the resolves of the alerts it heard fire must still go;
    - for the rule's own recipients (`channel=None`), the older ones of its alert, so an inbox reads fired before
      resolved after a mail outage. The two are chosen by the caller: `channel_id` alone, or `alert_id` alone."""
    older = Q(created_at__lt=created_at) | Q(created_at=created_at, pk__lt=pk)
    pending = Notification.objects.filter(older, delivered_at__isnull=True, failed_at__isnull=True)
    if channel_id is None:
        return pending.filter(channel__isnull=True, alert_id=alert_id)
    held_of_another_alert = (Q(channel__enabled=False) & ~Q(kind__in=SENT_WHILE_DISABLED)
                             & ~Q(alert_id=alert_id))
    return pending.filter(channel_id=channel_id).exclude(held_of_another_alert)


def _waits_behind_older(notification_id: int, channel_id: int | None, alert_id: int, created_at) -> bool:
    return _older_pending(notification_id, channel_id, alert_id, created_at).exists()


DROPPED_UNHEARD = "dropped: the channel was disabled, and the alert resolved before this was sent"
DROPPED_NEVER_TOLD = "dropped: the channel was disabled before it was told the alert fired"


def _drop_held_rows_of_disabled_channels(now) -> int:
    """A disabled channel's unsent reminders are dropped, not held: a reminder repeats what the receiver heard
    already, held it would hold the alert's resolve behind it (an incident left open while the channel is
    disabled), and sent once the channel is enabled again it could follow that resolve (PagerDuty would open a
    new incident). Its "fired" is held while the alert fires (the receiver has not heard of it yet), and dropped
    once the alert has resolved, rather than sent after its resolve once the channel is enabled again. A row
    waiting for its retry (or being sent) is dropped once it is due again."""
    unsent = Notification.objects.filter(channel__enabled=False, delivered_at__isnull=True, failed_at__isnull=True,
                                         next_attempt_at__lte=now)
    reminders = unsent.filter(kind=NotificationKind.REMINDER).update(
        failed_at=now, last_error=DROPPED_WHILE_DISABLED, answer=short(DROPPED_WHILE_DISABLED))
    resolved = Notification.objects.filter(alert_id=OuterRef("alert_id"), channel_id=OuterRef("channel_id"),
                                           kind=NotificationKind.RESOLVED)
    unheard = unsent.filter(Exists(resolved), kind=NotificationKind.FIRED)
    # Never tried, the receiver cannot have heard of the alert: its resolve (and acknowledge) go too. Tried and
    # failed, it may have (a 500 after the incident opened): the resolve goes.
    never_told = unheard.filter(alert_id=OuterRef("alert_id"), channel_id=OuterRef("channel_id"), attempts=0)
    closing = Notification.objects.filter(Exists(never_told), kind__in=SENT_WHILE_DISABLED, delivered_at__isnull=True,
                                          failed_at__isnull=True).update(
        failed_at=now, last_error=DROPPED_NEVER_TOLD, answer=short(DROPPED_NEVER_TOLD))
    fired = unheard.update(failed_at=now, last_error=DROPPED_UNHEARD, answer=short(DROPPED_UNHEARD))
    return reminders + closing + fired


def deliver_due(now=None, limit: int = DELIVERY_BATCH, session: Session | None = None) -> dict:
    """Send due outbox rows. Returns counts {"sent", "failed", "gave_up"}; never raises for a send error.
    `session`: the run's connections (tests pass one whose waits they record). `now` fixes the run's clock
    (tests pass it). Without it, each claim and each outcome is stamped when it
    happens: a run slowed by its receivers claims its last rows minutes after it started, and a claim counted
    from the run's start would expire while its row is being sent, for a run started meanwhile to send it again."""
    clock = timezone.now if now is None else lambda: now
    now = clock()
    counts = {"sent": 0, "failed": 0, "gave_up": 0}
    _drop_held_rows_of_disabled_channels(now)
    # A channel whose oldest message waits for its retry (or is being sent) holds all of its messages: they are
    # left out here, so a backlog behind a receiver that is down never fills the batch and starves the others.
    waiting = Notification.objects.filter(channel_id=OuterRef("channel_id"), delivered_at__isnull=True,
                                          failed_at__isnull=True, next_attempt_at__gt=now)
    # A disabled channel holds what is new, but still hears the "resolved" of an alert it heard fire (in order,
    # behind anything older it holds): a channel disabled because its only rule was deleted would otherwise leave
    # the PagerDuty incident that rule opened open for good. An acknowledge queued before it was disabled goes
    # too, and its reminders were dropped above: held, either would hold that resolve behind it.
    held = Q(channel__enabled=False) & ~Q(kind__in=SENT_WHILE_DISABLED)
    # A row behind an older one that cannot go in this run (held, or waiting for its retry) is left out of the pick
    # too: picked and skipped at every run, such rows would fill the batch and starve every other channel. A row
    # behind one that is due stays in: the loop sends the older first, then it.
    behind_held = _older_pending(OuterRef("pk"), OuterRef("channel_id"), OuterRef("alert_id"),
                                 OuterRef("created_at")).filter(held)
    behind_waiting_email = _older_pending(OuterRef("pk"), None, OuterRef("alert_id"),
                                          OuterRef("created_at")).filter(next_attempt_at__gt=now)
    # `limit` counts the rows tried, not the rows picked: when a channel's oldest row fails, the rest of its rows
    # in the pick are skipped, and they must not use up the run while other channels wait.
    due = list(Notification.objects.filter(delivered_at__isnull=True, failed_at__isnull=True, next_attempt_at__lte=now)
               .exclude(held).exclude(Exists(waiting))
               .exclude(Q(channel__isnull=False) & Exists(behind_held))
               .exclude(Q(channel__isnull=True) & Exists(behind_waiting_email))
               .order_by("created_at", "pk")
               .values_list("pk", "channel_id", "alert_id", "created_at")[:limit * PICKED_PER_TRIED])
    blocked = set()  # channels that must wait: an older message is pending or just failed
    tried = 0
    with session or Session() as session:
        for notification_id, channel_id, alert_id, created_at in due:
            if tried == limit:
                break
            if (channel_id is not None and channel_id in blocked) or _waits_behind_older(
                    notification_id, channel_id, alert_id, created_at):
                blocked.add(channel_id)
                continue
            tried += 1
            if not _claim(notification_id, clock()):
                blocked.add(channel_id)
                continue
            notification = Notification.objects.select_related("channel").filter(pk=notification_id).first()
            if notification is None:
                continue  # its channel was deleted meanwhile, and its outbox with it
            outcome = _send(notification, session, clock)
            counts[outcome] += 1
            if outcome == "failed":   # it waits for its retry: the channel's newer rows wait behind it
                blocked.add(channel_id)
    return counts


def _send(notification: Notification, session: Session, clock) -> str:
    channel = notification.channel
    secrets = channel.secret_values() if channel is not None else []
    try:
        if channel is not None:
            session.pace(channel, clock())
        answer = kind_of(channel).send(channel, notification, session)
    except Exception as error:  # noqa: BLE001 - any failure is recorded and retried; the run goes on
        reason = str(error) if isinstance(error, DeliveryFailed) else f"{type(error).__name__}: {error}"
        reason = error_text(redact(reason, secrets))
        now = clock()   # the backoff counts from the failure, which may have taken the whole timeout
        give_up = getattr(error, "final", False) or _gives_up(notification, now)
        Notification.objects.filter(pk=notification.pk).update(
            last_error=reason, answer=short(reason), next_attempt_at=now + _delay(notification, now, error),
            failed_at=now if give_up else None)
        logger.warning("alert notification %s (%s) attempt %s failed: %s", notification.pk,
                       channel.name if channel else "email", notification.attempts, reason)
        if channel is not None and not _only_throttled(notification, error, now):
            _channel_failed(channel, reason, now)
        return "gave_up" if give_up else "failed"
    now = clock()
    Notification.objects.filter(pk=notification.pk).update(delivered_at=now, last_error="",
                                                           answer=short(str(answer)))
    if channel is not None:
        Channel.objects.filter(pk=channel.pk).update(consecutive_failures=0, failing_since=None,
                                                     admins_told_at=None, last_success_at=now, last_error="")
    return "sent"


def _delay(notification: Notification, now, error: Exception) -> timedelta:
    """The backoff, or the receiver's Retry-After when it asks for longer (at most RETRY_AFTER_MAX_SECONDS)."""
    channel = notification.channel
    email = channel is None or channel.kind == ChannelKind.EMAIL
    backoff = retry_delay(notification.attempts, EMAIL_RETRY_BASE_SECONDS if email else HTTP_RETRY_BASE_SECONDS)
    asked = getattr(error, "retry_after", None)
    if asked is None:
        return backoff
    longest = timedelta(seconds=RETRY_AFTER_MAX_SECONDS)
    # Seconds are capped before they become a timedelta: a receiver's 10**20 would overflow one.
    wait = asked - now if isinstance(asked, datetime) else timedelta(seconds=min(asked, RETRY_AFTER_MAX_SECONDS))
    return max(backoff, min(wait, longest))


def _only_throttled(notification: Notification, error: Exception, now) -> bool:
    """A rate limit (429) is the receiver asking us to wait, not the channel failing: the row waits (in order, the
    channel's newer rows behind it), and the channel's failure count is neither raised nor cleared. Until the row
    has waited longer than any wait a receiver may ask for (RETRY_AFTER_MAX_SECONDS): a receiver that keeps
    answering 429 gets nothing through, and its rows would be given up without the admins hearing of it."""
    return (getattr(error, "throttled", False)
            and now - notification.created_at < timedelta(seconds=RETRY_AFTER_MAX_SECONDS))


def _gives_up(notification: Notification, now) -> bool:
    if notification.channel_id is None:
        return notification.attempts >= max_attempts()
    return now - notification.created_at >= channel_give_up_after()


# --- a channel that keeps failing -------------------------------------------------------------------------

def _channel_failed(channel: Channel, reason: str, now) -> None:
    rows = Channel.objects.filter(pk=channel.pk)
    rows.update(consecutive_failures=F("consecutive_failures") + 1, last_error=short(reason)[:500])
    rows.filter(consecutive_failures__gte=failing_after(), failing_since__isnull=True).update(failing_since=now)
    # One email per failing spell: whoever sets admins_told_at sends it.
    if rows.filter(failing_since__isnull=False, admins_told_at__isnull=True).update(admins_told_at=now):
        if not tell_admins(Channel.objects.get(pk=channel.pk)):
            rows.update(admins_told_at=None)  # not told after all: the next failing attempt tries again


def admin_addresses() -> list[str]:
    """settings.ADMINS and the active superusers' addresses."""
    listed = [entry[1] if isinstance(entry, (list, tuple)) else entry for entry in getattr(settings, "ADMINS", [])]
    users = get_user_model().objects.filter(is_superuser=True, is_active=True).exclude(email="")
    return list(dict.fromkeys([*listed, *users.values_list("email", flat=True)]))


def tell_admins(channel: Channel) -> bool:
    addresses = admin_addresses()
    if not addresses:
        logger.warning("alert channel %s is failing and no admin has an email address", channel.name)
        return True  # nobody to tell: telling again would not help
    page = notify.absolute_url(f"/alerts/channels/#channel-{channel.name}")
    try:
        send_mail(f"[Tally] alert channel {channel.name} is failing",
                  f"The alert channel {channel.name} ({channel.kind}) failed {channel.consecutive_failures} "
                  f"times in a row since {channel.failing_since:%Y-%m-%d %H:%M:%S} UTC.\n"
                  f"Last answer: {channel.last_error}\n\nIts notifications wait in the outbox and are retried "
                  f"every 5 minutes at most; they go out, in order, once the receiver answers.\n{page}\n",
                  settings.DEFAULT_FROM_EMAIL, addresses)
    except Exception as error:  # noqa: BLE001 - the mail server may be what is down
        logger.warning("cannot tell the admins that channel %s is failing: %s", channel.name, error)
        return False
    return True
