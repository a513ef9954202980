"""Alerts: rules, the alerts they raise (firing -> acknowledged -> resolved), mutes, channels and the outbox.

The database keeps alerts honest: at most one open alert per (rule, pipeline) and per (rule, watch) (partial
unique indexes), state changes are conditional UPDATEs, and every notification (an email to the rule's recipients
or a channel's message) is an outbox row unique per (alert, kind, sequence) and channel, so one state never
produces two messages however often evaluation runs.
"""
import uuid
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone


class RuleKind(models.TextChoices):
    LAG_RECORDS = "lag_records", "lag above N records"
    LAG_SECONDS = "lag_seconds", "lag above N seconds"
    LOST = "lost", "any lost record"
    DUPLICATED = "duplicated", "any duplicated record"
    PHANTOM = "phantom", "phantom rows"
    GAP = "gap", "a gap in the ledger"
    STATUS = "status", "status STALL / STOP / ERR"
    DEAD_LETTERS = "dead_letters", "dead letters above N per interval"
    NO_CONSUMER = "no_consumer", "should run but no live consumer"


# Kinds that compare a measured value with `threshold`; the others fire on "any".
THRESHOLD_KINDS = {RuleKind.LAG_RECORDS, RuleKind.LAG_SECONDS, RuleKind.DEAD_LETTERS}
DEFAULT_STATUSES = "STALL,STOP,ERR"


class AlertRule(models.Model):
    """A condition to watch. `pipeline=None` makes it global; a pipeline's own rule of the same kind
    replaces the global one for that pipeline (so a pipeline can tune or disable a global rule)."""

    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=20, choices=RuleKind.choices)
    pipeline = models.ForeignKey("consumers.Pipeline", null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="alert_rules", help_text="Empty: applies to every pipeline.")
    threshold = models.FloatField(null=True, blank=True,
                                  help_text="N for lag (records or seconds) and dead letters per interval.")
    interval_seconds = models.PositiveIntegerField(default=300, help_text="Window for dead letters per interval.")
    statuses = models.CharField(max_length=50, default=DEFAULT_STATUSES, blank=True,
                                help_text="For the status rule: comma-separated statuses that fire.")
    recipients = models.TextField(blank=True, default="",
                                  help_text="Comma-separated addresses; empty: settings.ALERT_RECIPIENTS.")
    reminder_seconds = models.PositiveIntegerField(default=3600,
                                                   help_text="Reminder interval while firing; 0: no reminders.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "dashboard_alertrule"  # created when alerts lived in the dashboard app
        ordering = ["kind", "name"]

    def __str__(self):
        scope = self.pipeline.name if self.pipeline_id else "all pipelines"
        return f"{self.name} ({self.get_kind_display()}, {scope})"

    def recipient_list(self) -> list[str]:
        own = [address.strip() for address in self.recipients.replace(";", ",").split(",") if address.strip()]
        return own or list(settings.ALERT_RECIPIENTS)

    def status_set(self) -> set[str]:
        return {status.strip().upper() for status in (self.statuses or DEFAULT_STATUSES).split(",") if status.strip()}


class Installation(models.Model):
    """This installation of Tally: one row, made with a random key by the migration that creates the database's
    tables, so two installations (or a database created again) never share it. PagerDuty's dedup_keys name it,
    so installations sharing an integration key never fold into or close each other's incidents. A copied database
    holds the original's key until `manage.py installation new-key` (alerts/installation.py)."""

    ONE = 1
    id = models.PositiveSmallIntegerField(primary_key=True, default=ONE)   # one row: its key is the primary key's
    key = models.UUIDField(default=uuid.uuid4, editable=False)

    @classmethod
    def current(cls) -> "Installation":
        """The row; made again if it is missing (a flushed test database is a new installation)."""
        return cls.objects.get_or_create(pk=cls.ONE)[0]


class AlertState(models.TextChoices):
    FIRING = "firing", "firing"
    ACKNOWLEDGED = "acknowledged", "acknowledged"
    RESOLVED = "resolved", "resolved"


OPEN_STATES = (AlertState.FIRING, AlertState.ACKNOWLEDGED)


class Alert(models.Model):
    """An alert is history: it outlives its rule and its pipeline (deleting either leaves the link empty and the
    names below), and an alert still open when they go is resolved first (alerts/signals.py)."""

    rule = models.ForeignKey(AlertRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts")
    pipeline = models.ForeignKey("consumers.Pipeline", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="alerts")
    # Or the watch it is about (a consumer group Tally does not run); pipeline_name then keeps the watch's name.
    watch = models.ForeignKey("consumers.Watch", null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="alerts")
    # What rule and pipeline (or watch) the alert was about, kept when they are deleted.
    rule_name = models.CharField(max_length=100, blank=True, default="")
    rule_kind = models.CharField(max_length=20, blank=True, default="", choices=RuleKind.choices)
    pipeline_name = models.CharField(max_length=100, blank=True, default="")
    state = models.CharField(max_length=15, choices=AlertState.choices, default=AlertState.FIRING)
    summary = models.CharField(max_length=300)
    facts = models.JSONField(default=dict, help_text="What evaluation saw last: partitions, offsets, counts.")
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    # When the "fired" email was queued (None while muted: it is queued when the mute ends).
    notified_at = models.DateTimeField(null=True, blank=True)
    next_reminder_at = models.DateTimeField(null=True, blank=True)
    reminders_sent = models.PositiveIntegerField(default=0)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)
    # The PagerDuty dedup_key of an alert opened before keys named the installation: its incident closes with the
    # key it was opened with. Empty for the others (alerts.payloads.dedup_key derives theirs).
    legacy_dedup_key = models.CharField(max_length=100, blank=True, default="")

    class Meta:
        db_table = "dashboard_alert"  # created when alerts lived in the dashboard app
        ordering = ["-started_at"]
        constraints = [models.UniqueConstraint(fields=["rule", "pipeline"], condition=Q(state__in=OPEN_STATES),
                                               name="uniq_open_alert_per_rule_pipeline"),
                       models.UniqueConstraint(fields=["rule", "watch"], condition=Q(state__in=OPEN_STATES),
                                               name="uniq_open_alert_per_rule_watch")]
        indexes = [models.Index(fields=["state", "-started_at"], name="alert_state_idx")]

    def __str__(self):
        return f"[{self.state}] {self.pipeline_label}: {self.summary}"

    def save(self, *args, **kwargs):
        if kwargs.get("update_fields") is None:
            self.remember_names()
        super().save(*args, **kwargs)

    def remember_names(self) -> None:
        if self.rule_id and self.rule:
            self.rule_name, self.rule_kind = self.rule.name, self.rule.kind
        if self.pipeline_id and self.pipeline:
            self.pipeline_name = self.pipeline.name
        elif self.watch_id and self.watch:
            self.pipeline_name = self.watch.name

    @property
    def subject(self):
        """What the alert is about: its pipeline or its watch (None once deleted)."""
        return self.pipeline if self.pipeline_id else (self.watch if self.watch_id else None)

    @property
    def pipeline_label(self) -> str:
        return self.subject.name if self.subject is not None else self.pipeline_name

    @property
    def rule_label(self) -> str:
        return self.rule.name if self.rule_id else self.rule_name

    @property
    def kind(self) -> str:
        """What it fired for: the kind kept when it opened (its rule's kind may have been edited since)."""
        return self.rule_kind or (self.rule.kind if self.rule_id else "")

    @property
    def is_gone(self) -> bool:
        """Its rule or its pipeline was deleted: history only, nothing to mute."""
        return self.rule_id is None or (self.pipeline_id is None and self.watch_id is None)

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES

    def acknowledge(self, user: str, now=None) -> bool:
        """firing -> acknowledged (stops reminders). False if it was not firing any more."""
        now = now or timezone.now()
        changed = Alert.objects.filter(pk=self.pk, state=AlertState.FIRING).update(
            state=AlertState.ACKNOWLEDGED, acknowledged_at=now, acknowledged_by=user[:150])
        self.refresh_from_db()
        return bool(changed)

    def active_mute(self, now=None):
        return Mute.active_for(self.rule, pipeline=self.pipeline, watch=self.watch, now=now).first()

    def as_json(self) -> dict:
        return {
            "id": self.pk, "state": self.state, "pipeline": self.pipeline_label, "rule": self.rule_label,
            "kind": self.kind, "pipeline_deleted": self.pipeline_id is None and self.watch_id is None,
            "watch": self.pipeline_label if self.watch_id else None, "summary": self.summary,
            "facts": self.facts,
            "started_at": self.started_at.isoformat(), "last_seen_at": self.last_seen_at.isoformat(),
            "acknowledged_at": self.acknowledged_at.isoformat() if self.acknowledged_at else None,
            "acknowledged_by": self.acknowledged_by or None,
            "resolved_at": self.resolved_at.isoformat() if self.resolved_at else None,
            "reminders_sent": self.reminders_sent,
        }


class Mute(models.Model):
    """Silences notifications for a period. Empty rule: every rule. A pipeline or a watch: only its alerts; neither:
    every pipeline and every watch. Alerts are still evaluated and listed while muted; only their emails are held
    (and channels hear nothing new, except the "resolved" of an alert they heard fire)."""

    rule = models.ForeignKey(AlertRule, null=True, blank=True, on_delete=models.CASCADE, related_name="mutes")
    pipeline = models.ForeignKey("consumers.Pipeline", null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="alert_mutes")
    watch = models.ForeignKey("consumers.Watch", null=True, blank=True, on_delete=models.CASCADE,
                              related_name="alert_mutes")
    until = models.DateTimeField()
    reason = models.CharField(max_length=200, blank=True, default="")
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "dashboard_mute"  # created when alerts lived in the dashboard app
        ordering = ["-until"]

    def __str__(self):
        return f"mute {self.rule or 'all rules'} / {self.scope_label} until {self.until:%Y-%m-%d %H:%M}"

    @property
    def scope_label(self) -> str:
        if self.pipeline_id:
            return self.pipeline.name
        return f"watch {self.watch.name}" if self.watch_id else "all pipelines and watches"

    @classmethod
    def active_for(cls, rule, *, pipeline=None, watch=None, now=None):
        """The mutes that hold `rule`'s notifications about the pipeline or the watch."""
        now = now or timezone.now()
        scope = Q(pipeline__isnull=True, watch__isnull=True)
        if pipeline is not None:
            scope |= Q(pipeline=pipeline)
        if watch is not None:
            scope |= Q(watch=watch)
        return cls.objects.filter(Q(rule=rule) | Q(rule__isnull=True), scope, until__gt=now)

    def covers(self, alert: "Alert") -> bool:
        """active_for's rule for one alert, on mutes already read (the alerts page lists many)."""
        if self.rule_id not in (None, alert.rule_id):
            return False
        if self.pipeline_id is None and self.watch_id is None:
            return True
        return (self.pipeline_id is not None and self.pipeline_id == alert.pipeline_id) or \
            (self.watch_id is not None and self.watch_id == alert.watch_id)

    @classmethod
    def mute(cls, *, rule, pipeline=None, watch=None, minutes: int, user: str = "", reason: str = "",
             now=None) -> "Mute":
        now = now or timezone.now()
        return cls.objects.create(rule=rule, pipeline=pipeline, watch=watch, until=now + timedelta(minutes=minutes),
                                  created_by=user[:150], reason=reason[:200], created_at=now)


class NotificationKind(models.TextChoices):
    FIRED = "fired", "fired"
    REMINDER = "reminder", "reminder"
    RESOLVED = "resolved", "resolved"
    # An operator took the alert: told to the channels that heard it fire and have a word for it (PagerDuty).
    ACKNOWLEDGED = "acknowledged", "acknowledged"


class ChannelKind(models.TextChoices):
    EMAIL = "email", "email"
    WEBHOOK = "webhook", "webhook (JSON POST)"
    SLACK = "slack", "Slack (incoming webhook)"
    PAGERDUTY = "pagerduty", "PagerDuty (Events API v2)"


PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"


class Channel(models.Model):
    """Where notifications go besides the rules' own email recipients. The secrets (a token in the URL, the
    PagerDuty routing key, the webhook's HMAC secret) are written once and never shown again: pages, the
    command, the API and the action log use `as_json()`, which masks them (alerts/channels/)."""

    name = models.SlugField(max_length=100, unique=True, help_text="Letters, digits, '-' and '_'.")
    kind = models.CharField(max_length=20, choices=ChannelKind.choices)
    url = models.CharField(max_length=2000, blank=True, default="",
                           help_text="Webhook, Slack incoming-webhook or PagerDuty events URL (a secret: never "
                                     "shown again).")
    recipients = models.TextField(blank=True, default="", help_text="Email: comma-separated addresses.")
    routing_key = models.CharField(max_length=200, blank=True, default="",
                                   help_text="PagerDuty: the integration's routing key (a secret).")
    secret = models.CharField(max_length=200, blank=True, default="",
                              help_text="Webhook: HMAC-SHA256 signing secret (a secret); empty: unsigned.")
    rules = models.ManyToManyField(AlertRule, blank=True, related_name="channels",
                                   help_text="The rules whose notifications come here; none: every rule's.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Delivery health, kept by alerts/outbox.py: consecutive failed attempts, since when the channel is
    # failing, and when the admins were told (once per failing spell).
    consecutive_failures = models.PositiveIntegerField(default=0)
    failing_since = models.DateTimeField(null=True, blank=True)
    admins_told_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    # The pace of a kind that takes messages no faster than its SEND_INTERVAL_SECONDS (alerts.channels.Session):
    # kept here, not in the run, because two delivery runs may overlap; channels of one URL keep the same value.
    next_send_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} ({self.kind})"

    def clean(self):
        from alerts.channels import problems

        found = problems(self)
        if found:
            raise ValidationError(found)

    def recipient_list(self) -> list[str]:
        return [a.strip() for a in self.recipients.replace(";", ",").split(",") if a.strip()]

    @property
    def is_failing(self) -> bool:
        return self.failing_since is not None

    def secret_values(self) -> list[str]:
        """Every secret string this channel holds, for scrubbing error texts (alerts.channels.redact)."""
        from alerts.channels import kind_of

        return kind_of(self).secret_values(self)

    def as_json(self) -> dict:
        """What anyone may see: the kind's masked settings, routing and delivery health; no secret."""
        from alerts.channels import kind_of

        return {"name": self.name, "kind": self.kind, "enabled": self.enabled, **kind_of(self).mask(self),
                "rules": sorted(rule.name for rule in self.rules.all()) or "all",
                "state": "failing" if self.is_failing else "ok",
                "failing_since": self.failing_since.isoformat() if self.failing_since else None,
                "consecutive_failures": self.consecutive_failures,
                "last_success_at": self.last_success_at.isoformat() if self.last_success_at else None,
                "last_error": self.last_error or None}


class Notification(models.Model):
    """The outbox: one row per message to send, rendered when queued, sent (and retried with backoff) by
    `alerts.outbox.deliver_due`. `channel=None` is the rule's own email recipients; one row per channel
    otherwise. Unique per (alert, channel, kind, sequence): never two messages for the same state."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="notifications")
    channel = models.ForeignKey(Channel, null=True, blank=True, on_delete=models.CASCADE,
                                related_name="notifications")
    kind = models.CharField(max_length=15, choices=NotificationKind.choices)
    sequence = models.PositiveIntegerField(default=0, help_text="Reminder number; 0 for fired/resolved.")
    recipients = models.JSONField(default=list)
    subject = models.CharField(max_length=300)
    body_text = models.TextField()
    body_html = models.TextField()
    payload = models.JSONField(default=dict, blank=True,
                               help_text="The webhook payload (docs/alerts.md), rendered when queued.")
    created_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True, help_text="Gave up after the last attempt.")
    answer = models.CharField(max_length=500, blank=True, default="", help_text="The receiver's last answer.")

    class Meta:
        db_table = "dashboard_notification"  # created when alerts lived in the dashboard app
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["alert", "kind", "sequence"], condition=Q(channel__isnull=True),
                                    name="uniq_notification_state"),
            models.UniqueConstraint(fields=["alert", "channel", "kind", "sequence"],
                                    condition=Q(channel__isnull=False), name="uniq_channel_notification_state"),
        ]
        indexes = [models.Index(fields=["next_attempt_at"], name="notification_due_idx",
                                condition=Q(delivered_at__isnull=True, failed_at__isnull=True))]

    def __str__(self):
        return f"{self.kind} #{self.sequence} for alert {self.alert_id}"
