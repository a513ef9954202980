"""Alert rules for operators: list, create, edit, mute for a while, and send a test email to a rule's
recipients. Everyone signed in may read them; changes are for operators and are written to the action log."""
from collections import defaultdict

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.mail import send_mail
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from alerts.models import AlertRule, Channel, Mute
from alerts.pages import mute_input, render_form
from alerts.rule_forms import AlertRuleForm
from consumers.access import can_operate, form_errors, record_refusal, role_of
from consumers.models import ActionLog, ActionResult


def _log_action(request, rule, action: str, message: str, params: dict | None = None) -> None:
    ActionLog.objects.create(pipeline=rule.pipeline, action=action, actor=request.user.get_username(),
                             params={"rule": rule.name, **(params or {})}, result=ActionResult.DONE,
                             message=message, finished_at=timezone.now())


def _operator_only(request, action: str = "alert_rule") -> None:
    if not can_operate(request.user):
        message = "Only operators can change alert rules."
        record_refusal(request.user, action, f"{role_of(request.user)} role: {message}", params={"path": request.path})
        raise PermissionDenied(message)


@require_GET
@login_required
def rule_list(request):
    now = timezone.now()
    rules = list(AlertRule.objects.select_related("pipeline").order_by("pipeline__name", "kind", "name"))
    # A mute of the whole rule mutes it; a mute of one pipeline or watch leaves it active for the others.
    muted, muted_for = {}, defaultdict(list)
    for mute in (Mute.objects.filter(until__gt=now, rule__isnull=False).select_related("pipeline", "watch")
                 .order_by("until")):
        if mute.pipeline_id or mute.watch_id:
            muted_for[mute.rule_id].append(mute)
        else:
            muted[mute.rule_id] = max(mute.until, muted.get(mute.rule_id, mute.until))
    # Where each rule's notifications go besides its recipients: channels routed to it, and unrouted ones.
    channels = [(c.name, {r.pk for r in c.rules.all()}) for c in Channel.objects.filter(enabled=True)
                .prefetch_related("rules")]
    for rule in rules:
        rule.muted_until = muted.get(rule.pk)
        rule.muted_for = muted_for.get(rule.pk, [])
        rule.channel_names = [name for name, routed in channels if not routed or rule.pk in routed]
    return render(request, "alerts/rules.html", {"rules": rules, "can_operate": can_operate(request.user),
                                                 "nav": "alerts"})


@require_http_methods(["GET", "POST"])
@login_required
def rule_edit(request, rule_id=None):
    rule = get_object_or_404(AlertRule, pk=rule_id) if rule_id else None
    if request.method == "POST":
        _operator_only(request)
    form = AlertRuleForm(request.POST or None, instance=rule)
    if request.method == "POST" and form.is_valid():
        saved = form.save()
        verb = "created" if rule is None else "changed"
        _log_action(request, saved, "alert_rule", f"alert rule {saved.name!r} {verb}", {"kind": saved.kind})
        messages.success(request, f"Alert rule {saved.name!r} {verb}.")
        return redirect("alerts:rules")
    if request.method == "POST":
        record_refusal(request.user, "alert_rule", f"bad input: {form_errors(form)}",
                       pipeline=rule.pipeline if rule else None,
                       params={"rule": rule.name if rule else request.POST.get("name", "")})
    return render_form(request, "alerts/rule_form.html", {"form": form, "rule": rule})


@require_POST
@login_required
def rule_mute(request, rule_id):
    _operator_only(request, "alert_mute")
    rule = get_object_or_404(AlertRule, pk=rule_id)
    asked = mute_input(request, "alert_mute", pipeline=rule.pipeline, params={"rule": rule.name})
    if asked is None:
        return redirect("alerts:rules")
    minutes, reason = asked
    mute = Mute.mute(rule=rule, pipeline=None, minutes=minutes, user=request.user.get_username(), reason=reason)
    _log_action(request, rule, "alert_mute", f"alert rule {rule.name!r} muted until {mute.until:%Y-%m-%d %H:%M} UTC",
           {"minutes": minutes})
    messages.success(request, f"Muted {rule.name!r} until {mute.until:%Y-%m-%d %H:%M} UTC (alerts are still listed).")
    return redirect("alerts:rules")


@require_POST
@login_required
def rule_test(request, rule_id):
    """A test email to the rule's recipients, so an operator knows the address and the mail server work."""
    _operator_only(request, "alert_test")
    rule = get_object_or_404(AlertRule, pk=rule_id)
    recipients = rule.recipient_list()
    if not recipients:
        messages.error(request, f"{rule.name!r} has no recipients and ALERT_RECIPIENTS is empty: add an address.")
        return redirect("alerts:rules")
    try:
        send_mail(f"[Tally] test of alert rule {rule.name}", f"This is a test of the alert rule {rule}.\n"
                  "When it fires, its email comes to this address.", settings.DEFAULT_FROM_EMAIL, recipients)
    except Exception as exc:  # the mail server's answer is what the operator needs to see
        messages.error(request, f"The test email to {', '.join(recipients)} failed: {type(exc).__name__}: {exc}")
        return redirect("alerts:rules")
    _log_action(request, rule, "alert_test", f"test email for {rule.name!r} sent to {', '.join(recipients)}")
    messages.success(request, f"Test email sent to {', '.join(recipients)}.")
    return redirect("alerts:rules")
