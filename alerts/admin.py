"""Admin for alert rules, alerts, mutes, channels and the outbox. Operators acknowledge and mute alerts from
the alert list, through the same functions as the alerts page (alerts.evaluate). Rules are edited with the
page's form (the same checks) and every change is in the action log; alerts, mutes and the outbox are
read-only here (their changes are the actions, audited); a mute may be lifted (audited)."""
from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode

from alerts import channel_actions, evaluate
from alerts.channel_forms import ChannelForm
from alerts.models import Alert, AlertRule, Channel, Mute, Notification
from alerts.queries import MAX_MUTE_REASON, mute_problem, parse_minutes
from alerts.rule_forms import AlertRuleForm
from consumers.access import AuditedRefusal, can_operate, record_refusal
from consumers.admin_actions import posted_action
from consumers.admin_base import FormRefusalsAudited, ReadOnlyAdmin
from consumers.models import ActionLog, ActionResult

ALERT_ACTIONS = ("acknowledge_alerts", "mute_alerts")


def audit(request, action: str, pipeline, params: dict, message: str) -> None:
    ActionLog.objects.create(pipeline=pipeline, action=action, actor=request.user.get_username(),
                             params={**params, "via": "admin"}, result=ActionResult.DONE, message=message,
                             finished_at=timezone.now())


@admin.register(AlertRule)
class AlertRuleAdmin(FormRefusalsAudited, admin.ModelAdmin):
    form = AlertRuleForm  # the rules page's form: the same checks on recipients and statuses

    def refused_as(self, object_id) -> str:
        return "alert_rule"

    def refusal_params(self, request) -> dict:
        return {"rule": request.POST.get("name", "")[:200], "via": "admin"}
    list_display = ("name", "kind", "pipeline", "threshold", "interval_seconds", "reminder_seconds", "enabled")
    list_filter = ("kind", "enabled", "pipeline")
    search_fields = ("name", "recipients")

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        verb = "changed" if change else "created"
        audit(request, "alert_rule", obj.pipeline, {"rule": obj.name, "kind": obj.kind,
                                                     "changed": sorted(form.changed_data)},
              f"alert rule {obj.name!r} {verb} in the admin")

    def delete_model(self, request, obj):
        audit(request, "alert_rule", obj.pipeline, {"rule": obj.name, "kind": obj.kind, "deleted": True},
              f"alert rule {obj.name!r} deleted in the admin")
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for rule in queryset.select_related("pipeline"):
            self.delete_model(request, rule)


class NotificationInline(admin.TabularInline):
    model = Notification
    extra = 0
    fields = ("channel", "kind", "sequence", "recipients", "attempts", "next_attempt_at", "delivered_at", "failed_at",
              "answer")
    readonly_fields = fields
    can_delete = False


class AlertActionForm(ActionForm):
    # Plain text here, checked by the mute action (alerts.queries.mute_problem): an invalid action form only makes
    # Django answer "No action selected.", without the error and without a refusal in the action log.
    minutes = forms.CharField(required=False, initial=60, label="Mute minutes", widget=forms.NumberInput,
                              help_text="For the mute action: 1 minute to 30 days.")
    reason = forms.CharField(required=False, strip=False, label="Mute reason",
                             widget=forms.TextInput(attrs={"maxlength": MAX_MUTE_REASON}))


@admin.action(description="Acknowledge the selected alerts", permissions=["operate"])
def acknowledge_alerts(modeladmin, request, queryset):
    for alert in queryset.select_related("rule", "pipeline"):
        if evaluate.acknowledge(alert, request.user.get_username()):
            modeladmin.message_user(request, f"Acknowledged: {alert.pipeline_label}: {alert.summary}", messages.SUCCESS)
        else:
            modeladmin.message_user(request, f"Pipeline {alert.pipeline_label}: not firing any more ({alert.state}): "
                                             f"nothing to acknowledge.", messages.WARNING)


@admin.action(description="Mute the selected alerts' rules (minutes below)", permissions=["operate"])
def mute_alerts(modeladmin, request, queryset):
    minutes, reason = parse_minutes(request.POST.get("minutes")), request.POST.get("reason", "")
    problem = mute_problem(minutes, reason)
    if problem:
        modeladmin.message_user(request, f"{problem} Nothing was muted.", messages.ERROR)
        for alert in queryset.select_related("pipeline"):
            record_refusal(request.user, "mute_alert", f"bad input: {problem}", pipeline=alert.pipeline,
                           params={"alert": alert.pk, "minutes": request.POST.get("minutes", ""), "via": "admin"})
        return
    for alert in queryset.select_related("rule", "pipeline", "watch"):
        try:
            mute = evaluate.mute(alert, minutes, request.user.get_username(), reason)
        except evaluate.AlertGone as exc:
            modeladmin.message_user(request, str(exc), messages.ERROR)
            continue
        modeladmin.message_user(request, f"Muted '{alert.rule.name}' on {mute.scope_label} until "
                                         f"{mute.until:%Y-%m-%d %H:%M} UTC.", messages.SUCCESS)


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    """Read-only: an alert changes through the evaluator and the audited actions only, never by editing its row."""

    list_display = ("pipeline_label", "rule_label", "state", "summary", "started_at", "resolved_at", "dashboard")
    list_filter = ("state", "rule__kind", "pipeline")
    readonly_fields = ("facts", "started_at", "last_seen_at", "notified_at", "next_reminder_at", "reminders_sent",
                       "acknowledged_at", "acknowledged_by", "resolved_at")
    inlines = [NotificationInline]
    actions = [acknowledge_alerts, mute_alerts]
    operator_actions = ALERT_ACTIONS   # refused per alert below (the site refuses other actions not offered)
    action_form = AlertActionForm

    def has_operate_permission(self, request) -> bool:
        return can_operate(request.user)

    def has_view_permission(self, request, obj=None):
        # Whoever reads pipelines reads their alerts (viewers and operators), as on the alerts page.
        return super().has_view_permission(request, obj) or request.user.has_perm("consumers.view_pipeline")

    def has_module_permission(self, request):
        return super().has_module_permission(request) or request.user.has_perm("consumers.view_pipeline")

    def changelist_view(self, request, extra_context=None):
        action = posted_action(request)
        if action in ALERT_ACTIONS and not can_operate(request.user):
            ids = [i for i in request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME) if i.isascii() and i.isdigit()]
            message = f"{request.user.get_username()} is not an operator: only operators can acknowledge or mute."
            for alert in Alert.objects.filter(pk__in=ids).select_related("pipeline") or [None]:
                record_refusal(request.user, action.removesuffix("s"), message, pipeline=alert and alert.pipeline,
                               params={"alert": alert and alert.pk, "via": "admin"})
            raise AuditedRefusal(message)
        return super().changelist_view(request, extra_context)

    @admin.display(description="dashboard")
    def dashboard(self, obj):
        url = reverse("alerts:list") + "?" + urlencode({"state": "all", "pipeline": obj.pipeline_label})
        return format_html('<a href="{}" class="dashboard-link">{}</a>', url, obj.pipeline_label)


@admin.register(Mute)
class MuteAdmin(admin.ModelAdmin):
    """Mutes are made by the mute actions (bounded, audited); here they are read, or lifted (audited)."""

    list_display = ("rule", "pipeline", "watch", "until", "created_by", "reason")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def delete_model(self, request, obj):
        audit(request, "alert_unmute", obj.pipeline, {"mute": obj.pk, "rule": obj.rule.name if obj.rule else ""},
              f"{obj} lifted in the admin")
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for mute in queryset.select_related("rule", "pipeline", "watch"):
            self.delete_model(request, mute)


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    """The outbox, read-only: the evaluator writes it and the sender marks delivery. Saving a row here would write
    back delivery fields the sender may just have set, and deleting one drops an alert's message unsent: neither
    is an operator's action (retention deletes old rows with their resolved alerts)."""

    list_display = ("alert", "channel", "kind", "sequence", "attempts", "next_attempt_at", "delivered_at", "failed_at")
    list_filter = ("kind", "channel")
    readonly_fields = ("alert", "channel", "kind", "sequence", "recipients", "subject", "body_text", "body_html",
                       "payload", "created_at", "attempts", "next_attempt_at", "answer", "last_error", "delivered_at",
                       "failed_at")


@admin.register(Channel)
class ChannelAdmin(FormRefusalsAudited, admin.ModelAdmin):
    """The page's form (secrets write-only, validated by the kind); changes go to the action log, masked."""

    form = ChannelForm
    list_display = ("name", "kind", "sends_to", "routed_rules", "enabled", "state")
    list_filter = ("kind", "enabled")
    search_fields = ("name",)
    # What a user who may only view a channel is shown: its masked settings (Channel.as_json). Django's read-only
    # display would show the secret fields (a URL with its token, a routing key, a signing secret) as stored.
    VIEW_FIELDS = ("name", "kind", "sends_to", "routing_key_masked", "signed", "routed_rules", "enabled", "state")

    def get_fields(self, request, obj=None):
        if obj is not None and not self.has_change_permission(request, obj):
            return self.VIEW_FIELDS
        return super().get_fields(request, obj)

    @admin.display(description="sends to")
    def sends_to(self, obj):
        shown = obj.as_json()
        return ", ".join(shown.get("to") or []) or shown.get("url", "")

    @admin.display(description="routing key")
    def routing_key_masked(self, obj):
        return obj.as_json().get("routing_key", "")

    @admin.display(description="signed", boolean=True)
    def signed(self, obj):
        return bool(obj.as_json().get("signed"))

    @admin.display(description="rules")
    def routed_rules(self, obj):
        rules = obj.as_json()["rules"]
        return "every rule" if rules == "all" else ", ".join(rules)

    @admin.display(description="state")
    def state(self, obj):
        return "disabled" if not obj.enabled else obj.as_json()["state"]

    def refused_as(self, object_id) -> str:
        return "alert_channel_change" if object_id else "alert_channel_add"

    def refusal_params(self, request) -> dict:
        return {"channel": request.POST.get("name", "")[:200], "via": "admin"}

    def save_model(self, request, obj, form, change):
        # As channel_actions.save does: incidents opened with the old kind, URL or key are resolved with them.
        obj.closed_before_change = channel_actions.close_incidents_before_change(obj)
        obj.save()

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        channel = form.instance
        closed = getattr(channel, "closed_before_change", "")
        channel_actions.log("alert_channel_change" if change else "alert_channel_add", request.user.get_username(),
                            channel, f"alert channel {channel.name!r} ({channel.kind}) "
                                     f"{'changed' if change else 'added'} in the admin"
                                     + (f"; with its old settings, {closed}" if closed else ""))

    def delete_model(self, request, obj):
        channel_actions.delete(obj, request.user.get_username())

    def delete_queryset(self, request, queryset):
        for channel in queryset:
            channel_actions.delete(channel, request.user.get_username())
