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
from alerts.queries import PAGE_SIZE, STATE_FILTERS, can_operate, filtered_alerts, parse_minutes
from consumers.models import Pipeline


@require_GET
@login_required
@vary_on_headers("HX-Request")
def alert_list(request):
    state = request.GET.get("state", "open")
    pipeline = request.GET.get("pipeline", "")
    now = timezone.now()
    alerts = list(filtered_alerts(state, pipeline)[:PAGE_SIZE])
    mutes = list(Mute.objects.filter(until__gt=now).select_related("rule", "pipeline"))
    for alert in alerts:
        covering = [m.until for m in mutes
                    if m.rule_id in (None, alert.rule_id) and m.pipeline_id in (None, alert.pipeline_id)]
        alert.muted_until = max(covering) if covering and alert.is_open else None
    context = {
        "alerts": alerts, "state": state, "pipeline": pipeline,
        "states": STATE_FILTERS, "pipelines": Pipeline.objects.order_by("name").values_list("name", flat=True),
        "mutes": mutes,
        "can_operate": can_operate(request.user), "now": now, "nav": "alerts",
    }
    template = "alerts/list.html#alert_table" if getattr(request, "htmx", False) else "alerts/list.html"
    return render(request, template, context)


def _back(request):
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        return redirect(target)
    return redirect(reverse("alerts:list"))


@require_POST
@login_required
def alert_acknowledge(request, alert_id):
    if not can_operate(request.user):
        raise PermissionDenied("Only operators can acknowledge alerts.")
    alert = get_object_or_404(Alert, pk=alert_id)
    if evaluate.acknowledge(alert, request.user.get_username()):
        messages.success(request, f"Acknowledged: {alert.pipeline_label}: {alert.summary}")
    else:
        messages.info(request, f"Not firing any more ({alert.state}): nothing to acknowledge.")
    return _back(request)


@require_POST
@login_required
def alert_mute(request, alert_id):
    if not can_operate(request.user):
        raise PermissionDenied("Only operators can mute alerts.")
    alert = get_object_or_404(Alert, pk=alert_id)
    minutes = parse_minutes(request.POST.get("minutes"))
    if minutes is None:
        messages.error(request, "Mute for 1 minute to 30 days.")
        return _back(request)
    try:
        mute = evaluate.mute(alert, minutes, request.user.get_username(), request.POST.get("reason", ""))
    except evaluate.AlertGone as exc:
        messages.error(request, str(exc))
        return _back(request)
    messages.success(request, f"Muted '{alert.rule.name}' on {alert.pipeline.name} "
                              f"until {mute.until:%Y-%m-%d %H:%M} UTC.")
    return _back(request)
