"""The JSON API of watches: list, create (operators), detail with partitions and ranges, check now (operators),
delete (operators). Creation goes through consumers.operations.watch_setup, the validation the command, the
form and the file share: 400 names each bad field, and nothing is written before it passes."""
from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework import status as http
from rest_framework.decorators import api_view, permission_classes, renderer_classes
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from consumers.api_base import REFUSALS, REFUSED, answers, refuse_fields
from consumers.models import RANGES_SHOWN, Watch, WatchRange
from consumers.operations import watch_setup
from consumers.operations.errors import Refused
from consumers.reconciliation import monitored, watch_audit, watch_listing, watch_results, watch_trace
from dashboard.api import schemas
from dashboard.api.inputs import (
    StrictBooleanField,
    StrictIntegerField,
    StrictSerializer,
    StrictStringField,
    refuse_invalid,
)
from dashboard.api.renderers import CSVRenderer
from dashboard.api.views import OPERATE, TRACE_ANSWERS, refusal_response


class WatchCreateInput(StrictSerializer):
    name = StrictStringField(max_length=100)
    group = StrictStringField(max_length=255)
    topic = StrictStringField(max_length=249)
    cluster = StrictStringField(max_length=100, required=False, default="default")
    sink_table = StrictStringField(max_length=watch_setup.MAX_LENGTHS["sink_table"], required=False, default="",
                                   allow_blank=True, help_text="table (on the search_path) or schema.table")
    record_id = StrictStringField(max_length=300, required=False, default="", allow_blank=True)
    row_id = StrictStringField(max_length=200, required=False, default="", allow_blank=True)
    start_from = StrictStringField(max_length=40, required=False, default="earliest")
    settle_seconds = StrictIntegerField(min_value=0, max_value=watch_setup.MAX_SETTLE_SECONDS, required=False,
                                        default=30)
    ignore = serializers.ListField(child=StrictStringField(max_length=300), required=False, default=list,
                                   max_length=watch_setup.MAX_IGNORES)
    keyed = StrictBooleanField(required=False, default=False)


class WatchCheckInput(StrictSerializer):
    settle_seconds = StrictIntegerField(min_value=0, max_value=watch_setup.MAX_SETTLE_SECONDS, required=False,
                                        allow_null=True, default=None)


def watch_json(watch: Watch) -> dict:
    return {**monitored.of_watch(watch).as_json(), **watch_setup.describe(watch), "last_error": watch.last_error}


def range_json(r: WatchRange) -> dict:
    return {"partition": r.partition, "start": r.start, "end": r.end, "records": r.records, "ignored": r.ignored,
            "superseded": r.superseded, "unreadable": r.unreadable, "lost": r.lost, "duplicated": r.duplicated,
            "phantom": r.phantom, "lost_offsets": r.lost_offsets, "duplicated_offsets": r.duplicated_offsets,
            "phantom_offsets": r.phantom_offsets, "note": r.note, "checked_at": r.checked_at.isoformat()}


@extend_schema(methods=["GET"], responses=answers(schemas.WatchListSerializer), operation_id="watches_list")
@extend_schema(methods=["POST"], request=WatchCreateInput, operation_id="watches_create",
               responses=answers(schemas.WatchCreatedSerializer, status=201))
@api_view(["GET", "POST"])
@permission_classes(OPERATE)
def watch_list(request):
    """GET: every watch with its status, lag and findings. POST (operators): create a watch."""
    if request.method == "GET":
        return Response({"watches": [watch_json(w) for w in Watch.objects.order_by("name")]})
    body = WatchCreateInput(data=request.data)
    if not body.is_valid():
        return refuse_invalid(request, body, "create_watch")
    data = dict(body.validated_data)
    try:
        watch, notes = watch_setup.create(watch_setup.WatchSpec(**data), actor=request.user.username)
    except watch_setup.Invalid as exc:
        return refuse_fields(request, exc.problems, "create_watch", params={"watch": data["name"]})
    return Response({**watch_json(watch), "notes": notes}, status=http.HTTP_201_CREATED)


@extend_schema(methods=["GET"], responses=answers(schemas.WatchDetailSerializer), operation_id="watches_detail")
@extend_schema(methods=["DELETE"], responses=answers(schemas.WatchDeletedSerializer), operation_id="watches_delete")
@api_view(["GET", "DELETE"])
@permission_classes(OPERATE)
def watch_detail(request, name):
    """GET: the watch, its partitions and its newest ranges with their findings. DELETE (operators)."""
    watch = get_object_or_404(Watch, name=name)
    if request.method == "DELETE":
        watch_setup.delete(name, actor=request.user.username)
        return Response({"deleted": name})
    ranges = WatchRange.objects.filter(watch=watch).newest()[:RANGES_SHOWN]
    lost, duplicated = watch_listing.listed_offsets(watch)
    return Response({**watch_json(watch),
                     "partitions": [watch_results.partition_json(wp) for wp in watch.partitions.order_by("partition")],
                     "lost_offsets": lost, "duplicated_offsets": duplicated, "last_notes": watch.last_notes,
                     "ranges": [range_json(r) for r in ranges]})


@extend_schema(request=WatchCheckInput, responses=answers(schemas.WatchCheckSerializer, extra={409: REFUSED}),
               operation_id="watches_check")
@api_view(["POST"])
@permission_classes(OPERATE)
def watch_check(request, name):
    """Operators: check now (audit what settled since the last check); the answer is `watch check --json`'s. 409 when
    the watch's cluster is no longer configured: audited, nothing changed."""
    watch = get_object_or_404(Watch, name=name)
    body = WatchCheckInput(data=request.data)
    if not body.is_valid():
        return refuse_invalid(request, body, watch_audit.CHECK)
    try:
        report = watch_audit.check_now(watch, actor=request.user.username,
                                       settle_seconds=body.validated_data["settle_seconds"])
    except Refused as exc:
        return refusal_response(exc)
    return Response(report.as_json())


@extend_schema(responses=answers(schemas.WatchTraceSerializer, extra=TRACE_ANSWERS),
               parameters=[OpenApiParameter("partition", int), OpenApiParameter("offset", int)],
               operation_id="watches_trace")
@api_view(["GET"])
@permission_classes(OPERATE)
def watch_trace_record(request, name):
    """One record of the watch's topic: `?partition=P&offset=N` -> its value, the row id it names, the rows of the
    table with that id now, and what the audit found there."""
    watch = get_object_or_404(Watch, name=name)
    try:
        partition, offset, _ = watch_trace.parse_request({k: v for k, v in request.query_params.items() if k != "key"})
        return Response(watch_trace.trace(watch, partition, offset).as_json())
    except watch_trace.REFUSALS as exc:
        return Response({"error": str(exc), "field": getattr(exc, "field", "") or None},
                        status=watch_trace.refusal_status(exc))


@extend_schema(responses={(200, "text/csv"): str, **REFUSALS}, operation_id="watches_findings_csv")
@api_view(["GET"])
@permission_classes(OPERATE)
@renderer_classes([JSONRenderer, CSVRenderer])
def watch_findings_csv(request, name):
    """Every finding of the watch as CSV: partition, offset, kind, extra_rows, checked_at."""
    watch = get_object_or_404(Watch, name=name)
    response = StreamingHttpResponse(watch_trace.findings_csv(watch), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{watch.name}-findings.csv"'
    return response
