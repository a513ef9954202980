"""Alerts in the JSON API (Django REST framework, like the rest of /api/): session or token auth; list and
detail for everyone signed in, acknowledge and mute for operators (403 for viewers)."""
import functools

from django.core.paginator import EmptyPage, Paginator
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.http import urlencode
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework import status as http
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from alerts import evaluate
from alerts.api_schemas import (
    AlertAnswerSerializer,
    AlertDetailSerializer,
    AlertListSerializer,
    AlertRefusedSerializer,
    MutedSerializer,
)
from alerts.models import Alert
from alerts.queries import MAX_MUTE_MINUTES, MAX_MUTE_REASON, PAGE_SIZE, STATE_FILTERS, filtered_alerts
from consumers.api_base import (
    EmptyInput,
    OperatorForWrites,
    StrictIntegerField,
    StrictSerializer,
    StrictStringField,
    answers,
    field_errors,
    refuse_invalid,
)

OPERATE = [IsAuthenticated, OperatorForWrites]
# An alert firing for months has thousands of notifications: the detail answers one page of them.
DEFAULT_NOTIFICATIONS_PER_PAGE = 50
MAX_NOTIFICATIONS_PER_PAGE = 500


class MuteInput(StrictSerializer):
    """Body of a mute: {"minutes": 1..43200 (default 60), "reason": "why"}; strict JSON types."""

    minutes = StrictIntegerField(required=False, default=60, min_value=1, max_value=MAX_MUTE_MINUTES)
    reason = StrictStringField(required=False, default="", allow_blank=True, max_length=MAX_MUTE_REASON)


class AlertListQuery(serializers.Serializer):
    """Query parameters of GET /api/alerts/: the Alerts page's filters."""

    state = serializers.ChoiceField(choices=STATE_FILTERS, required=False, default="open",
                                    help_text="open (firing or acknowledged), a single state, or all")
    pipeline = serializers.CharField(required=False, default="", max_length=100,
                                     help_text="A pipeline's or a watch's name")


class AlertDetailQuery(serializers.Serializer):
    """Query parameters of GET /api/alerts/ID/: which page of its notifications (newest first)."""

    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_NOTIFICATIONS_PER_PAGE,
                                     default=DEFAULT_NOTIFICATIONS_PER_PAGE, help_text="Notifications per page")
    page = serializers.IntegerField(required=False, min_value=1, max_value=2**31 - 1, default=1,
                                    help_text="From 1, newest first")


def _alert(alert_id: int) -> Alert:
    return get_object_or_404(Alert.objects.select_related("rule", "pipeline", "watch"), pk=alert_id)


def _conflict(alert: Alert, error: str) -> Response:
    """409: the alert is not in a state the operation applies to (AlertRefusedSerializer)."""
    return Response({"error": error, "alert": alert.as_json()}, status=http.HTTP_409_CONFLICT)


@extend_schema(operation_id="alerts_list", responses=answers(AlertListSerializer), parameters=[AlertListQuery])
@api_view(["GET"])
def alert_list(request):
    query = AlertListQuery(data=request.query_params)
    if not query.is_valid():
        return Response({"errors": field_errors(query.errors)}, status=http.HTTP_400_BAD_REQUEST)
    alerts = filtered_alerts(query.validated_data["state"], query.validated_data["pipeline"])
    return Response({"alerts": [alert.as_json() for alert in alerts[:PAGE_SIZE]]})


@extend_schema(operation_id="alerts_detail", responses=answers(AlertDetailSerializer), parameters=[AlertDetailQuery])
@api_view(["GET"])
def alert_detail(request, alert_id):
    """The alert, and one page of its notifications, newest first (?limit=N, at most 500; ?page=N), with their
    count and the next page's link (null on the last), as the dead-letter API pages."""
    alert = _alert(alert_id)
    query = AlertDetailQuery(data=request.query_params)
    if not query.is_valid():
        return Response({"errors": field_errors(query.errors)}, status=http.HTTP_400_BAD_REQUEST)
    limit, number = query.validated_data["limit"], query.validated_data["page"]
    paginator = Paginator(alert.notifications.select_related("channel").order_by("-created_at", "-pk"), limit)
    try:
        page = paginator.page(number)
    except EmptyPage:  # past the last page: nothing, said plainly (a client pages until `next` is null)
        rows, following = [], None
    else:
        rows = [_notification_json(n) for n in page.object_list]
        following = None
        if page.has_next():
            path = reverse("alerts_api:detail", kwargs={"alert_id": alert.pk})
            following = request.build_absolute_uri(f"{path}?{urlencode({'limit': limit, 'page': number + 1})}")
    return Response({**alert.as_json(), "notifications_count": paginator.count, "notifications_page": number,
                     "notifications_pages": paginator.num_pages, "notifications_next": following,
                     "notifications": rows})


def _notification_json(n) -> dict:
    return {"channel": n.channel.name if n.channel_id else None, "kind": n.kind, "sequence": n.sequence,
            "attempts": n.attempts, "delivered_at": n.delivered_at.isoformat() if n.delivered_at else None,
            "failed_at": n.failed_at.isoformat() if n.failed_at else None, "last_error": n.last_error or None}


def _alert_action(action: str, body_class, answer):
    """An operator's POST on one alert: a 404 for an unknown alert, a bad body refused (400) and audited as
    `action`; then the view gets the alert and the body's validated data. 409 answers a wrong state."""
    def door(view):
        @extend_schema(request=body_class, responses=answers(answer, extra={409: AlertRefusedSerializer}))
        @api_view(["POST"])
        @permission_classes(OPERATE)
        @functools.wraps(view)
        def checked(request, alert_id):
            alert = _alert(alert_id)
            body = body_class(data=request.data)
            if not body.is_valid():
                return refuse_invalid(request, body, action, alert.pipeline)
            return view(request, alert, body.validated_data)
        return checked
    return door


@_alert_action("acknowledge_alert", EmptyInput, AlertAnswerSerializer)
def alert_acknowledge(request, alert, data):
    if not evaluate.acknowledge(alert, request.user.get_username()):
        return _conflict(alert, f"The alert is {alert.state}, not firing.")
    return Response({"alert": alert.as_json()})


@_alert_action("mute_alert", MuteInput, MutedSerializer)
def alert_mute(request, alert, data):
    try:
        mute = evaluate.mute(alert, data["minutes"], request.user.get_username(), data["reason"])
    except evaluate.AlertGone as exc:
        return _conflict(alert, str(exc))
    return Response({"mute": {"id": mute.pk, "rule": alert.rule.name, "pipeline": alert.pipeline_label,
                              "watch": alert.pipeline_label if alert.watch_id else None,
                              "until": mute.until.isoformat()},
                     "alert": alert.as_json()})
