"""The alerts page: list and filter (everyone signed in), acknowledge and mute (operators only).

Plain forms with CSRF tokens and redirects, so the page works without JavaScript; with htmx the filter
form swaps only the table (`list.html#alert_table`).
"""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from alerts import evaluate
from alerts.models import Alert, Mute
from alerts.pages import mute_input
from alerts.queries import (
    PAGE_SIZE,
    STATE_FILTERS,
    filtered_alerts,
    unknown_state_message,
)
from consumers.access import can_operate, record_refusal, role_of
from consumers.models import Pipeline, Watch


@require_GET
@login_required
@vary_on_headers("HX-Request")
def alert_list(request):
    state = request.GET.get("state", "open")
    pipeline = request.GET.get("pipeline", "")
    now = timezone.now()
    error = "" if state in STATE_FILTERS else unknown_state_message(state)
    alerts = [] if error else list(filtered_alerts(state, pipeline)[:PAGE_SIZE])
    mutes = list(Mute.objects.filter(until__gt=now).select_related("rule", "pipeline", "watch"))
    for alert in alerts:
        covering = [m.until for m in mutes if m.covers(alert)]
        alert.muted_until = max(covering) if covering and alert.is_open else None
    pipelines = list(Pipeline.objects.order_by("name").values_list("name", flat=True))
    watches = list(Watch.objects.order_by("name").values_list("name", flat=True))
    # Alerts outlive their pipeline or watch and are still found by its name: the filter offers those names too.
    deleted = sorted(set(Alert.objects.filter(pipeline__isnull=True, watch__isnull=True).exclude(pipeline_name="")
                         .values_list("pipeline_name", flat=True)) - set(pipelines) - set(watches))
    context = {
        "alerts": alerts, "state": state, "pipeline": pipeline, "error": error,
        "states": STATE_FILTERS, "pipelines": pipelines, "watches": watches, "deleted": deleted,
        "mutes": mutes,
        "can_operate": can_operate(request.user), "now": now, "nav": "alerts",
    }
    htmx = getattr(request, "htmx", None)  # a history restore (back to a pushed filter) needs the whole page
    partial = htmx and not htmx.history_restore_request
    template = "alerts/list.html#alert_table" if partial else "alerts/list.html"
    return render(request, template, context, status=400 if error else 200)


def _back(request):
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        return redirect(target)
    return redirect(reverse("alerts:list"))


def _alert_for_operator(request, alert_id, action: str, message: str) -> Alert:
    """The alert an operator acts on. Viewers are refused, and the refusal is audited like on every other door."""
    alert = get_object_or_404(Alert, pk=alert_id)
    if not can_operate(request.user):
        record_refusal(request.user, action, f"{role_of(request.user)} role: {message}", pipeline=alert.pipeline,
                       params={"alert": alert.pk, "path": request.path})
        raise PermissionDenied(message)
    return alert


@require_POST
@login_required
def alert_acknowledge(request, alert_id):
    alert = _alert_for_operator(request, alert_id, "acknowledge_alert", "Only operators can acknowledge alerts.")
    if evaluate.acknowledge(alert, request.user.get_username()):
        messages.success(request, f"Acknowledged: {alert.pipeline_label}: {alert.summary}")
    else:
        messages.info(request, f"Not firing any more ({alert.state}): nothing to acknowledge.")
    return _back(request)


@require_POST
@login_required
def alert_mute(request, alert_id):
    alert = _alert_for_operator(request, alert_id, "mute_alert", "Only operators can mute alerts.")
    asked = mute_input(request, "mute_alert", pipeline=alert.pipeline, params={"alert": alert.pk})
    if asked is None:
        return _back(request)
    minutes, reason = asked
    try:
        mute = evaluate.mute(alert, minutes, request.user.get_username(), reason)
    except evaluate.AlertGone as exc:
        messages.error(request, str(exc))
        return _back(request)
    messages.success(request, f"Muted '{alert.rule.name}' on {mute.scope_label} until {mute.until:%Y-%m-%d %H:%M} UTC.")
    return _back(request)
