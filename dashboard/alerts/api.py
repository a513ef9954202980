"""Alerts in the JSON API: list (any signed-in user), acknowledge and mute (operators; 403 otherwise)."""
import json

from django.http import JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET, require_POST

from dashboard.alerts import evaluate
from dashboard.alerts.queries import PAGE_SIZE, can_operate, filtered_alerts, parse_minutes
from dashboard.models import Alert


def _require_login(request):
    if not request.user.is_authenticated:
        return JsonResponse({"error": "authentication required"}, status=401)
    return None


def _body(request) -> dict:
    if request.content_type == "application/json":
        try:
            data = json.loads(request.body or b"{}")
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}
    return request.POST.dict()


@require_GET
def alert_list(request):
    if denied := _require_login(request):
        return denied
    alerts = filtered_alerts(request.GET.get("state", "open"), request.GET.get("pipeline", ""))[:PAGE_SIZE]
    return JsonResponse({"alerts": [alert.as_json() for alert in alerts]})


@require_GET
def alert_detail(request, alert_id):
    if denied := _require_login(request):
        return denied
    alert = get_object_or_404(Alert.objects.select_related("rule", "pipeline"), pk=alert_id)
    data = alert.as_json()
    data["notifications"] = [{"kind": n.kind, "sequence": n.sequence, "attempts": n.attempts,
                              "delivered_at": n.delivered_at.isoformat() if n.delivered_at else None,
                              "last_error": n.last_error or None}
                             for n in alert.notifications.order_by("created_at")]
    return JsonResponse(data)


@require_POST
def alert_acknowledge(request, alert_id):
    if denied := _require_login(request):
        return denied
    if not can_operate(request.user):
        return JsonResponse({"error": "operators only"}, status=403)
    alert = get_object_or_404(Alert, pk=alert_id)
    if not evaluate.acknowledge(alert, request.user.get_username()):
        return JsonResponse({"error": f"alert is {alert.state}, not firing", "alert": alert.as_json()}, status=409)
    return JsonResponse({"alert": alert.as_json()})


@require_POST
def alert_mute(request, alert_id):
    if denied := _require_login(request):
        return denied
    if not can_operate(request.user):
        return JsonResponse({"error": "operators only"}, status=403)
    alert = get_object_or_404(Alert, pk=alert_id)
    body = _body(request)
    minutes = parse_minutes(body.get("minutes"))
    if minutes is None:
        return JsonResponse({"error": "minutes must be an integer from 1 to 43200"}, status=400)
    mute = evaluate.mute(alert, minutes, request.user.get_username(), str(body.get("reason", "")))
    return JsonResponse({"mute": {"id": mute.pk, "rule": alert.rule.name, "pipeline": alert.pipeline.name,
                                  "until": mute.until.isoformat()}, "alert": alert.as_json()})
