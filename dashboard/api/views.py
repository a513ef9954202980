"""The JSON API (Django REST framework function views): the dashboard's data and actions for scripts.

Reads go through dashboard.status (the pages' numbers); actions through consumers.operations.actions,
consumers.operations.rewind and consumers.operations.group_reset (which write the action log). Input is validated
by the dashboard's forms, so the API and the pages refuse the same things with the same messages: 400 for bad
input, 409 when the action is refused (wrong state, another action running, target outside the log), 403 for
viewers.
"""
from django.shortcuts import get_object_or_404
from django.urls import reverse
from rest_framework import status as http
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from consumers.kafka.admin import KafkaAdminError
from consumers.models import ActionLog, Pipeline
from consumers.operations import actions, group_reset
from consumers.operations import groups as kafka_groups
from consumers.operations import rewind as rewinds
from consumers.operations.offset_specs import Refused
from dashboard import status, timeline
from dashboard.api.permissions import OperatorForWrites
from dashboard.forms import GroupResetForm, RewindForm
from dashboard.roles import can_operate

ACTION_LOG_LIMIT_MAX = 500
OPERATE = [IsAuthenticated, OperatorForWrites]


def _truthy(value) -> bool:
    return str(value).lower() in ("1", "true", "yes", "on")


def _form_data(request) -> dict:
    """Request data for a Django form: lists of partitions become "0,2"; booleans become "on"/""."""
    data = {}
    for key, value in request.data.items():
        if key == "partitions" and isinstance(value, list):
            value = ",".join(map(str, value))
        elif isinstance(value, bool):
            value = "on" if value else ""
        data[key] = "" if value is None else value
    return data


def _refused(exc: Refused) -> Response:
    entry = getattr(exc, "action_log", None)
    return Response({"error": str(exc), "action_id": entry.pk if entry else None}, status=http.HTTP_409_CONFLICT)


def _action_json(entry: ActionLog) -> dict:
    return {"id": entry.pk, "created_at": entry.created_at.isoformat(), "actor": entry.actor, "action": entry.action,
            "pipeline": entry.pipeline.name if entry.pipeline_id else None, "group": entry.group_id or None,
            "dry_run": entry.dry_run, "result": entry.result, "params": entry.params,
            "offsets_before": entry.offsets_before, "offsets_after": entry.offsets_after, "message": entry.message,
            "finished_at": entry.finished_at.isoformat() if entry.finished_at else None}


@api_view(["GET"])
def api_root(request):
    def url(name, **kwargs):
        return request.build_absolute_uri(reverse(f"api:{name}", kwargs=kwargs))

    return Response({"pipelines": url("pipelines"), "groups": url("groups"), "action_log": url("action_log"),
                     "me": url("me"), "token": url("token"),
                     "alerts": request.build_absolute_uri(reverse("alerts_api:list"))})


@api_view(["GET"])
def me(request):
    user = request.user
    return Response({"username": user.username, "role": "operator" if can_operate(user) else "viewer",
                     "can_operate": can_operate(user)})


@api_view(["GET"])
def pipeline_list(request):
    return Response({"pipelines": [row.as_json() for row in status.pipeline_rows()],
                     "groups": [g.as_json() for g in status.external_group_rows()]})


@api_view(["GET"])
def pipeline_detail(request, name):
    pipeline = get_object_or_404(Pipeline.objects.select_related("health"), name=name)
    partitions = status.partition_rows(pipeline)
    data = status.pipeline_row(pipeline).as_json()
    data.update(
        transform=pipeline.transform, batch_size=pipeline.batch_size,
        partitions=[p.as_json() for p in partitions],
        ledger=[t.as_json() for t in timeline.ledger_timelines(pipeline, partitions)],
        runs=[{"id": r.pk, "epoch": r.epoch, "worker": f"{r.host}:{r.pid}", "state": r.state,
               "assigned_partitions": r.assigned_partitions, "records_processed": r.records_processed,
               "started_at": r.started_at.isoformat(), "heartbeat_at": r.heartbeat_at.isoformat(),
               "ended_at": r.ended_at.isoformat() if r.ended_at else None, "end_reason": r.end_reason}
              for r in status.recent_runs(pipeline)],
        recent_actions=[_action_json(a) for a in status.recent_actions(pipeline, limit=10)])
    return Response(data)


@api_view(["GET"])
def reconciliation(request, name):
    """Runs reconciliation now (incremental; `?full=1` re-verifies everything) and returns its report."""
    from consumers.reconciliation.reconcile import reconcile_pipeline, report_json

    pipeline = get_object_or_404(Pipeline, name=name)
    report = reconcile_pipeline(pipeline, full=_truthy(request.query_params.get("full", "")))
    return Response(report_json([report]))


@api_view(["GET"])
def dead_letters(request, name):
    pipeline = get_object_or_404(Pipeline, name=name)
    return Response({"dead_letters": [
        {"partition": d.partition, "offset": d.offset, "error": d.error, "created_at": d.created_at.isoformat(),
         "key": bytes(d.key).decode("utf-8", "replace") if d.key is not None else None,
         "value": bytes(d.value).decode("utf-8", "replace") if d.value is not None else None}
        for d in status.recent_dead_letters(pipeline, limit=100)]})


@api_view(["GET"])
def trace_record(request, name):
    """Where one record went: `?partition=P&offset=N`, or `?key=K` (a bounded scan of the newest records)."""
    from consumers.reconciliation import trace as tracing

    pipeline = get_object_or_404(Pipeline, name=name)
    try:
        partition, offset, key = tracing.parse_request(request.query_params)
        if key is not None:
            records, scanned = tracing.find_by_key(pipeline, key)
            traces = [tracing.trace(pipeline, r.partition, r.offset) for r in records[-10:]]
            return Response({"key": key, "scanned": scanned, "traces": [t.as_json() for t in traces]})
        return Response(tracing.trace(pipeline, partition, offset).as_json())
    except tracing.TraceRefused as exc:
        return Response({"error": str(exc), "field": exc.field or None}, status=http.HTTP_400_BAD_REQUEST)


@api_view(["POST"])
@permission_classes(OPERATE)
def pipeline_action(request, name, action):
    pipeline = get_object_or_404(Pipeline, name=name)
    if action not in actions.ACTIONS:
        return Response({"error": f"Unknown action {action!r}: use one of {', '.join(actions.ACTIONS)}."},
                        status=http.HTTP_404_NOT_FOUND)
    try:
        entry = actions.perform(action, pipeline, actor=request.user.username)
    except Refused as exc:
        return _refused(exc)
    return Response(_action_json(entry))


@api_view(["POST"])
@permission_classes(OPERATE)
def pipeline_rewind(request, name):
    """Body: {"mode", "value", "partitions": [..], "rollback_sink": bool, "dry_run": bool (default true)}."""
    pipeline = get_object_or_404(Pipeline, name=name)
    form = RewindForm(_form_data(request))
    if not form.is_valid():
        return Response({"errors": form.errors.get_json_data()}, status=http.HTTP_400_BAD_REQUEST)
    data = form.cleaned_data
    dry_run = _truthy(request.data.get("dry_run", True))
    try:
        result = rewinds.rewind(pipeline, data["mode"], data["value"] or None, partitions=data["partitions"] or None,
                                rollback_sink=data["rollback_sink"], dry_run=dry_run, actor=request.user.username)
    except Refused as exc:
        return _refused(exc)
    return Response(result.as_dict())


@api_view(["GET"])
def group_list(request):
    try:
        names = kafka_groups.list_groups(include_pipelines=True)
    except KafkaAdminError as exc:  # e.g. the broker does not implement ListGroups: say so, never a 500
        return Response({"error": str(exc)}, status=503)
    owners = dict(Pipeline.objects.values_list("group_id", "name"))
    return Response({"groups": [{"group_id": n, "pipeline": owners.get(n)} for n in names]})


@api_view(["GET"])
def group_detail(request, group_id):
    return Response(kafka_groups.describe(group_id).as_json())


@api_view(["POST"])
@permission_classes(OPERATE)
def group_reset_view(request, group_id):
    """Body: {"topic", "mode", "value", "partitions": [..], "execute": bool (default false: a dry run)}."""
    form = GroupResetForm(_form_data(request))
    if not form.is_valid():
        return Response({"errors": form.errors.get_json_data()}, status=http.HTTP_400_BAD_REQUEST)
    data = form.cleaned_data
    try:
        result = group_reset.reset_group(group_id, data["topic"], data["mode"], data["value"] or None,
                                         partitions=data["partitions"] or None,
                                         execute=_truthy(request.data.get("execute", False)),
                                         actor=request.user.username)
    except Refused as exc:
        return _refused(exc)
    return Response(result.as_dict())


@api_view(["GET"])
def action_log(request):
    """?pipeline=NAME, ?group=ID, ?action=rewind, ?limit=N (max 500)."""
    entries = ActionLog.objects.select_related("pipeline").order_by("-created_at")
    params = request.query_params
    if params.get("pipeline"):
        entries = entries.filter(pipeline__name=params["pipeline"])
    if params.get("group"):
        entries = entries.filter(group_id=params["group"])
    if params.get("action"):
        entries = entries.filter(action=params["action"])
    try:
        limit = max(1, min(int(params.get("limit", 100)), ACTION_LOG_LIMIT_MAX))
    except ValueError:
        return Response({"error": "limit must be an integer"}, status=http.HTTP_400_BAD_REQUEST)
    return Response({"actions": [_action_json(e) for e in entries[:limit]]})
