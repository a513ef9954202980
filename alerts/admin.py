"""Admin for alert rules, alerts, mutes and the email outbox."""
from django.contrib import admin

from alerts.models import Alert, AlertRule, Mute, Notification


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "pipeline", "threshold", "interval_seconds", "reminder_seconds", "enabled")
    list_filter = ("kind", "enabled", "pipeline")
    search_fields = ("name", "recipients")


class NotificationInline(admin.TabularInline):
    model = Notification
    extra = 0
    fields = ("kind", "sequence", "recipients", "attempts", "next_attempt_at", "delivered_at", "failed_at",
              "last_error")
    readonly_fields = fields
    can_delete = False


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ("pipeline", "rule", "state", "summary", "started_at", "resolved_at")
    list_filter = ("state", "rule__kind", "pipeline")
    readonly_fields = ("facts", "started_at", "last_seen_at", "notified_at", "next_reminder_at", "reminders_sent",
                       "acknowledged_at", "acknowledged_by", "resolved_at")
    inlines = [NotificationInline]


@admin.register(Mute)
class MuteAdmin(admin.ModelAdmin):
    list_display = ("rule", "pipeline", "until", "created_by", "reason")


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ("alert", "kind", "sequence", "attempts", "next_attempt_at", "delivered_at", "failed_at")
    list_filter = ("kind",)
    readonly_fields = ("alert", "kind", "sequence", "recipients", "subject", "body_text", "body_html", "created_at",
                       "attempts", "next_attempt_at", "last_error", "delivered_at", "failed_at")
