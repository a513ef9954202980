"""The JSON API (Django REST framework function views): the dashboard's data and actions for scripts.

Reads go through dashboard.status (the pages' numbers); actions through consumers.operations.actions,
consumers.operations.rewind, consumers.operations.group_reset and consumers.operations.dead_letters (which write
the action log). Bodies are parsed by dashboard.api.parsers (size, depth, storable strings) and checked by the
strict serializers of dashboard.api.inputs before the domain's own checks: 400 for bad input, 409 when the
action is refused (wrong state, another action running, target outside the log), 403 for viewers.
"""
from django.contrib.auth import get_user_model
from django.core.paginator import EmptyPage, Paginator
from django.db import transaction
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.http import urlencode
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer, extend_schema
from knox.models import AuthToken
from rest_framework import status as http
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.decorators import api_view, permission_classes
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.throttling import AnonRateThrottle, ScopedRateThrottle
from rest_framework.views import APIView

from consumers.access import can_operate, record_refusal, role_of
from consumers.api_base import (
    REFUSED,
    UNAVAILABLE,
    OperatorForWrites,
    RefusalSerializer,
    answers,
    refuse,
    refuse_fields,
)
from consumers.kafka import clusters
from consumers.kafka.errors import ClusterConfigError
from consumers.models import ActionLog, ActionResult, Pipeline, TopicCheckJob, TopicCheckStatus
from consumers.operations import (
    actions,
    cluster_status,
    dead_letter_batches,
    dead_letter_queries,
    group_reset,
    pipeline_setup,
)
from consumers.operations import dead_letters as dead_letter_ops
from consumers.operations import groups as kafka_groups
from consumers.operations import pipeline_preview as pipeline_preview_ops
from consumers.operations import rewind as rewind_ops
from consumers.operations.errors import NotFound, Refused, Unavailable
from consumers.operations.pipeline_setup import Invalid, PipelineSpec
from dashboard import status, timeline, tokens
from dashboard.api import schemas
from dashboard.api.inputs import (
    ActionLogQuery,
    DeadLetterDiscardInput,
    DeadLetterQuery,
    DeadLetterReplayInput,
    EmptyInput,
    GroupResetInput,
    PipelineInput,
    ReconcileInput,
    RewindInput,
    field_errors,
    refuse_invalid,
)
from dashboard.lockout import locked_out, lockout_message

TOPIC_CHECKS_SHOWN = 20
UNKNOWN_GROUP = OpenApiResponse(RefusalSerializer, description="Kafka has no such consumer group on the cluster (a "
                                                               "reset would create it); audited, nothing changed")
KAFKA_REFUSED = OpenApiResponse(RefusalSerializer, description="Kafka did not answer or refused a request; audited, "
                                                               "nothing changed")
# replay and discard: one call, or "all matching" in batches; a batch after the first that fails stops there (409).
DEAD_LETTER_ANSWERS = answers(schemas.DeadLetterActionSerializer,
                              extra={409: PolymorphicProxySerializer("DeadLetterRefusal", [
                                  schemas.DeadLetterStoppedSerializer, RefusalSerializer], None)})
# A replay from Kafka reads the records before anything changes: Kafka down is a 503, as for a rewind.
REPLAY_ANSWERS = {**DEAD_LETTER_ANSWERS, 503: KAFKA_REFUSED}
OPERATE = [IsAuthenticated, OperatorForWrites]
# A trace is a read: refused, it changes nothing and is not audited.
TRACE_ANSWERS = {
    400: schemas.TraceErrorSerializer,
    409: OpenApiResponse(schemas.TraceErrorSerializer, description="The Kafka cluster it names is no longer "
                                                                   "configured, or its settings are wrong"),
    503: OpenApiResponse(schemas.TraceErrorSerializer, description="Kafka cannot be read now"),
}


def refusal_response(exc: Refused, status: int | None = None) -> Response:
    entry = getattr(exc, "action_log", None)
    return Response({"error": str(exc), "action_id": entry.pk if entry else None},
                    status=status or http.HTTP_409_CONFLICT)


def _status_of(entry: ActionLog) -> int:
    """503 when the action was recorded but could not be carried out (the task broker is down)."""
    return http.HTTP_503_SERVICE_UNAVAILABLE if entry.result == ActionResult.FAILED else http.HTTP_200_OK


def _action_json(entry: ActionLog) -> dict:
    return {"id": entry.pk, "created_at": entry.created_at.isoformat(), "actor": entry.actor, "action": entry.action,
            "pipeline": entry.pipeline_name or None, "group": entry.group_id or None,
            "cluster": entry.cluster or None, "dry_run": entry.dry_run, "result": entry.result, "params": entry.params,
            "offsets_before": entry.offsets_before, "offsets_after": entry.offsets_after, "message": entry.message,
            "finished_at": entry.finished_at.isoformat() if entry.finished_at else None}


@extend_schema(responses=answers(schemas.ApiRootSerializer))
@api_view(["GET"])
def api_root(request):
    def url(name, **kwargs):
        return request.build_absolute_uri(reverse(f"api:{name}", kwargs=kwargs))

    return Response({"pipelines": url("pipelines"), "groups": url("groups"), "watches": url("watches"),
                     "clusters": url("clusters"),
                     "action_log": url("action_log"),
                     "me": url("me"), "token": url("token"), "schema": url("schema"), "docs": url("docs"),
                     "alerts": request.build_absolute_uri(reverse("alerts_api:list"))})


@extend_schema(responses=answers(schemas.MeSerializer))
@api_view(["GET"])
def me(request):
    user = request.user
    return Response({"username": user.username, "role": role_of(user), "can_operate": can_operate(user)})


@extend_schema(operation_id="pipelines_list", responses=answers(schemas.PipelineListSerializer), methods=["GET"])
@extend_schema(operation_id="pipelines_create", responses=answers(schemas.PipelineSettingsSerializer, status=201),
               methods=["POST"], request=PipelineInput)
@api_view(["GET", "POST"])
@permission_classes(OPERATE)
def pipeline_list(request):
    """GET: every pipeline and watched group. POST: create a pipeline (stopped), as `pipeline create`: 201 with
    the pipeline, 400 naming each field pipeline_setup refuses (the topic, the table, the mapping, the key)."""
    if request.method == "GET":
        return Response({"pipelines": [row.as_json() for row in status.pipeline_rows()],
                         "groups": [g.as_json() for g in status.external_group_rows()]})
    spec = _pipeline_spec(request, "create")
    if isinstance(spec, Response):
        return spec
    try:
        pipeline = pipeline_setup.create(spec, actor=request.user.username)
    except Invalid as exc:
        return _setup_refused(request, "create", exc)
    return Response(_pipeline_settings(pipeline), status=http.HTTP_201_CREATED)


@extend_schema(operation_id="pipelines_preview", responses=answers(schemas.PreviewSerializer), request=PipelineInput)
@api_view(["POST"])
@permission_classes(OPERATE)
def pipeline_preview(request):
    """What a `transform: "json"` pipeline would write: the table's columns with their sources (the mapping
    given plus what is proposed) and the topic's first records, each as its row or its dead letter. Nothing is
    created or written."""
    spec = _pipeline_spec(request, "preview")
    if isinstance(spec, Response):
        return spec
    try:
        return Response(pipeline_preview_ops.preview(spec).as_json())
    except Invalid as exc:
        return _setup_refused(request, "preview", exc)


def _pipeline_spec(request, action: str):
    body = PipelineInput(data=request.data)
    if not body.is_valid():
        return refuse_invalid(request, body, action)
    return PipelineSpec(**body.validated_data)


def _setup_refused(request, action: str, exc: Invalid) -> Response:
    return refuse_fields(request, exc.problems, action)


def _pipeline_settings(pipeline: Pipeline) -> dict:
    return {"name": pipeline.name, "topic": pipeline.topic, "sink_table": pipeline.sink_table,
            "mode": PipelineSpec.of(pipeline).mode, "transform": pipeline.transform, "group": pipeline.group_id,
            "engine": pipeline.engine, "map": pipeline.json_map, "upsert_key": pipeline.upsert_key,
            "delete_on_tombstone": pipeline.delete_on_tombstone, "desired_state": pipeline.desired_state}


@extend_schema(operation_id="pipelines_detail", responses=answers(schemas.PipelineDetailSerializer))
@api_view(["GET"])
def pipeline_detail(request, name):
    pipeline = get_object_or_404(Pipeline.objects.select_related("health"), name=name)
    partitions = status.partition_rows(pipeline)
    data = status.pipeline_row(pipeline).as_json()
    data.update(
        transform=pipeline.transform, batch_size=pipeline.batch_size, isolation_level=pipeline.isolation_level,
        on_log_truncated=pipeline.on_log_truncated, parallel_runs=pipeline.parallel_runs,
        kafka_client=pipeline.kafka_client, waiting_for_worker=pipeline.waiting_for_worker(),
        map=pipeline.json_map, upsert_key=pipeline.upsert_key,
        delete_on_tombstone=pipeline.delete_on_tombstone,
        # Why a pipeline in ERR is there, as its page says: the last failure, and a cluster it cannot use.
        last_error=pipeline.last_error or None, cluster_problem=actions.cluster_problem(pipeline),
        partitions=[p.as_json() for p in partitions],
        ledger=[t.as_json() for t in timeline.ledger_timelines(pipeline, partitions)],
        runs=[{"id": r.pk, "epoch": r.epoch, "worker": f"{r.host}:{r.pid}", "state": r.liveness.label,
               "stored_state": r.state, **r.liveness.as_json(),
               "assigned_partitions": r.assigned_partitions, "records_processed": r.records_processed,
               "started_at": r.started_at.isoformat(), "heartbeat_at": r.heartbeat_at.isoformat(),
               "ended_at": r.ended_at.isoformat() if r.ended_at else None, "end_reason": r.end_reason}
              for r in status.recent_runs(pipeline)],
        recent_actions=[_action_json(a) for a in status.recent_actions(pipeline, limit=10)])
    return Response(data)


@extend_schema(methods=["GET"], responses=answers(schemas.ReconciliationSerializer))
@extend_schema(responses=answers(schemas.ReconciliationSerializer), methods=["POST"], request=ReconcileInput)
@api_view(["GET", "POST"])
@permission_classes(OPERATE)
def reconciliation(request, name):
    """GET: the last stored reconciliation (read-only). POST (operators), body {"full": bool}: reconcile
    now (incremental; full re-verifies everything) and return the fresh report."""
    from consumers.reconciliation.reconcile import reconcile_pipeline, report_json

    pipeline = get_object_or_404(Pipeline, name=name)
    if request.method == "GET":
        return Response(status.stored_reconciliation(pipeline))
    body = ReconcileInput(data=request.data)
    if not body.is_valid():
        return refuse_invalid(request, body, "reconcile", pipeline)
    report = reconcile_pipeline(pipeline, full=body.validated_data["full"])
    return Response(report_json([report]))


@extend_schema(responses=answers(schemas.DeadLetterPageSerializer), parameters=[DeadLetterQuery])
@api_view(["GET"])
def dead_letters(request, name):
    """The pipeline's dead letters in (partition, offset) order, filtered like the dead-letter page:
    ?state=pending|discarded|replayed|any (default pending), ?error=TEXT (contains, any case), ?partition=P,
    ?offset_from=N&offset_to=M (inclusive); one page of ?limit=N (default 100, at most 10000), ?page=N."""
    pipeline = get_object_or_404(Pipeline, name=name)
    query = DeadLetterQuery(data=request.query_params)
    if not query.is_valid():
        return Response({"errors": field_errors(query.errors)}, status=http.HTTP_400_BAD_REQUEST)
    params = query.validated_data
    paginator = Paginator(dead_letter_queries.dead_letters(pipeline, query.filters()), params["limit"])
    filters = {k: v for k, v in params.items() if k not in ("limit", "page") and v not in (None, "")}
    try:
        page = paginator.page(params["page"])
    except EmptyPage:  # past the last page: nothing, said plainly (a client pages until `next` is null)
        rows, following = [], None
    else:
        rows = [dead_letter_queries.export_row(row) for row in page.object_list]
        following = None
        if page.has_next():
            path = reverse("api:dead_letters", kwargs={"name": pipeline.name})
            query_string = urlencode({**filters, "limit": params["limit"], "page": page.number + 1})
            following = request.build_absolute_uri(f"{path}?{query_string}")
    return Response({"pipeline": pipeline.name, "filters": filters, "count": paginator.count, "page": params["page"],
                     "pages": paginator.num_pages, "next": following, "dead_letters": rows})


def _dead_letter_action(request, name, action: str, serializer_class, call) -> Response:
    pipeline = get_object_or_404(Pipeline, name=name)
    body = serializer_class(data=request.data)
    if not body.is_valid():
        return refuse_invalid(request, body, action, pipeline)
    data = body.validated_data
    if "filter" in data:   # "all matching": any number, in audited batches of 1,000
        kind = "replay" if action == dead_letter_ops.REPLAY else "discard"
        ended = dead_letter_batches.attempt(action, lambda: dead_letter_batches.act_on_matching(
            pipeline, kind, body.filters(), data["count"], actor=request.user.username,
            reason=data.get("reason", ""), source=data.get("source", "stored")))
    else:
        ended = dead_letter_batches.attempt(action, lambda: call(pipeline, data, request.user.username))
    if ended.refusal:  # Kafka down (a replay from Kafka): audited by the operation, nothing was changed
        return refusal_response(ended.refusal, status=http.HTTP_503_SERVICE_UNAVAILABLE
                        if isinstance(ended.refusal, Unavailable) else None)
    if ended.stopped:
        return Response({"error": ended.stopped.message(), **ended.stopped.as_dict()}, status=http.HTTP_409_CONFLICT)
    if ended.failed:
        return Response({"error": ended.failed}, status=http.HTTP_409_CONFLICT)
    return Response(ended.result.as_dict())


@extend_schema(responses=REPLAY_ANSWERS, request=DeadLetterReplayInput)
@api_view(["POST"])
@permission_classes(OPERATE)
def replay_dead_letters(request, name):
    """Body: {"ids": [..], "source": "stored" (default) or "kafka" (re-read the records)}. Replays them through the
    pipeline's current transform, exactly once → counts per result (replayed, still_bad, already_in_sink, gone,
    discarded, not_yet_consumed) and one outcome per dead letter. Ids that are not this pipeline's: 409; Kafka
    down (source "kafka"): 503.
    Instead of ids, {"filter": {error, partition, offset_from, offset_to}, "count": N}: every pending dead letter the
    filter matches (as the list shows them), in batches of 1,000 → totals and one action id per batch; 409 when it
    matches nothing or not N (some came or went since the client counted). A batch after the first refused (Kafka
    down too) or failed: 409 saying what the batches before it did (they stay done) and why the rest was not."""
    return _dead_letter_action(request, name, dead_letter_ops.REPLAY, DeadLetterReplayInput,
                               lambda pipeline, data, actor: dead_letter_ops.replay(pipeline, data["ids"], actor=actor,
                                                                                    source=data["source"]))


@extend_schema(responses=DEAD_LETTER_ANSWERS, request=DeadLetterDiscardInput)
@api_view(["POST"])
@permission_classes(OPERATE)
def discard_dead_letters(request, name):
    """Body: {"ids": [..], "reason": "why"} (reason required). Discarded dead letters stay, with the reason, and are
    never replayed → counts (discarded, already_discarded, gone). Ids that are not this pipeline's: 409. Instead of
    ids, {"filter": {...}, "count": N} as for replay."""
    return _dead_letter_action(request, name, dead_letter_ops.DISCARD, DeadLetterDiscardInput,
                               lambda pipeline, data, actor: dead_letter_ops.discard(pipeline, data["ids"],
                                                                                     data["reason"], actor=actor))


@extend_schema(responses=answers(PolymorphicProxySerializer("TraceAnswer", [schemas.TraceSerializer,
                                                                             schemas.KeyTraceSerializer], None),
                                 extra=TRACE_ANSWERS),
               parameters=[OpenApiParameter("partition", int), OpenApiParameter("offset", int),
                                            OpenApiParameter("key", str)])
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
    except tracing.REFUSALS as exc:
        return Response({"error": str(exc), "field": getattr(exc, "field", "") or None},
                        status=tracing.refusal_status(exc))


@extend_schema(responses=answers(schemas.ActionSerializer, extra={409: REFUSED, 503: schemas.ActionSerializer}),
               request=EmptyInput, parameters=[OpenApiParameter("action", str, OpenApiParameter.PATH,
                                                                 enum=list(actions.ACTIONS))])
@api_view(["POST"])
@permission_classes(OPERATE)
def pipeline_action(request, name, action):
    pipeline = get_object_or_404(Pipeline, name=name)
    if action not in actions.ACTIONS:
        error = f"Unknown action {action!r}: use one of {', '.join(actions.ACTIONS)}."
        refuse(request, f"not found: {error}")
        return Response({"error": error}, status=http.HTTP_404_NOT_FOUND)
    body = EmptyInput(data=request.data)
    if not body.is_valid():
        return refuse_invalid(request, body, action, pipeline)
    try:
        entry = actions.perform(action, pipeline, actor=request.user.username)
    except Refused as exc:
        return refusal_response(exc)
    return Response(_action_json(entry), status=_status_of(entry))


@extend_schema(responses=answers(schemas.RewindSerializer, extra={409: REFUSED, 503: KAFKA_REFUSED}),
               request=RewindInput)
@api_view(["POST"])
@permission_classes(OPERATE)
def pipeline_rewind(request, name):
    """Body: {"mode", "value", "partitions": [..], "rollback_sink": bool, "dry_run": bool (default true)}.
    Types are strict: a boolean is true or false, anything else is a 400 naming the field."""
    pipeline = get_object_or_404(Pipeline, name=name)
    body = RewindInput(data=request.data)
    if not body.is_valid():
        return refuse_invalid(request, body, "rewind", pipeline)
    data = body.validated_data
    try:
        result = rewind_ops.rewind(pipeline, data["mode"], data["value"] or None, partitions=data["partitions"],
                                rollback_sink=data["rollback_sink"], dry_run=data["dry_run"],
                                actor=request.user.username)
    except Unavailable as exc:  # Kafka down or refusing a request: audited by the operation, nothing was changed
        return refusal_response(exc, status=http.HTTP_503_SERVICE_UNAVAILABLE)
    except Refused as exc:
        return refusal_response(exc)
    return Response(result.as_dict())


CLUSTER_PARAMETER = OpenApiParameter("cluster", str, description="A Kafka cluster's name (default: default)")


def _cluster_param(request) -> str:
    """?cluster=NAME, validated: a 400 naming the field for a cluster that is not configured."""
    name = request.query_params.get("cluster") or clusters.DEFAULT
    try:
        clusters.get(name)
    except ClusterConfigError as exc:
        raise ValidationError({"cluster": [exc.problem]}) from None
    return name


@extend_schema(operation_id="clusters_list", responses=answers(schemas.ClusterListSerializer))
@api_view(["GET"])
def cluster_list(request):
    """Every configured cluster, checked now: settings without secrets, reachable, the failed step and why; and the
    cluster names pipelines or watches use that are not configured."""
    states, error, unconfigured = cluster_status.cluster_states()
    return Response({"clusters": [s.as_json() for s in states], "error": error or None,
                     "not_configured": [u.as_json() for u in unconfigured]})


@extend_schema(operation_id="groups_list", responses=answers(schemas.GroupListSerializer, extra={503: UNAVAILABLE}))
@api_view(["GET"])
def group_list(request):
    """Every configured cluster's groups; a 503 with the reasons when no cluster answered, never a 500."""
    found, errors = kafka_groups.groups_of_every_cluster(include_pipelines=True)
    if errors and not found and _every_cluster_failed(errors):
        return Response({"error": "; ".join(errors.values())}, status=http.HTTP_503_SERVICE_UNAVAILABLE)
    owners = {(c, g): n for c, g, n in Pipeline.objects.values_list("cluster", "group_id", "name")}
    return Response({"groups": [{"group_id": g, "cluster": c, "pipeline": owners.get((c, g))} for c, g in found],
                     "errors": errors})


def _every_cluster_failed(errors: dict[str, str]) -> bool:
    try:
        return set(clusters.names()) <= set(errors)
    except ClusterConfigError:   # the file is broken: only the default cluster was asked
        return clusters.DEFAULT in errors


@extend_schema(operation_id="groups_detail", responses=answers(schemas.GroupDetailSerializer),
               parameters=[CLUSTER_PARAMETER])
@api_view(["GET"])
def group_detail(request, group_id):
    cluster = _cluster_param(request)
    report = kafka_groups.describe(group_id, cluster=cluster)
    if report.unknown:  # Kafka would describe any id as a group without members
        return Response({"error": kafka_groups.unknown_group_message(group_id, cluster)},
                        status=http.HTTP_404_NOT_FOUND)
    return Response(report.as_json())


@extend_schema(responses=answers(schemas.GroupResetSerializer, extra={404: UNKNOWN_GROUP, 409: REFUSED,
                                                                       503: KAFKA_REFUSED}),
               request=GroupResetInput, parameters=[CLUSTER_PARAMETER])
@api_view(["POST"])
@permission_classes(OPERATE)
def group_reset_view(request, group_id):
    """Body: {"topic", "mode", "value", "partitions": [..], "execute": bool (default false: a dry run)}."""
    # Every refusal names the cluster asked for, as the operation's own refusals do.
    asked = {"cluster": request.query_params.get("cluster") or clusters.DEFAULT}
    try:
        cluster = _cluster_param(request)
    except ValidationError as exc:
        return refuse_fields(request, exc.detail, group_reset.ACTION, group_id=group_id, params=asked)
    body = GroupResetInput(data=request.data)
    if not body.is_valid():
        return refuse_fields(request, body.errors, group_reset.ACTION, group_id=group_id, params=asked)
    data = body.validated_data
    try:
        result = group_reset.reset_group(group_id, data["topic"], data["mode"], data["value"] or None,
                                         partitions=data["partitions"], execute=data["execute"],
                                         actor=request.user.username, cluster=cluster)
    except NotFound as exc:
        return refusal_response(exc, status=http.HTTP_404_NOT_FOUND)
    except Unavailable as exc:  # Kafka down or refusing a request: audited by the operation, nothing was changed
        return refusal_response(exc, status=http.HTTP_503_SERVICE_UNAVAILABLE)
    except Refused as exc:
        return refusal_response(exc)
    return Response(result.as_dict())


@extend_schema(responses=answers(schemas.ActionLogSerializer), parameters=[ActionLogQuery])
@api_view(["GET"])
def action_log(request):
    """?pipeline=NAME, ?group=ID, ?action=rewind, ?limit=N (1..500)."""
    query = ActionLogQuery(data=request.query_params)
    if not query.is_valid():
        return Response({"errors": field_errors(query.errors)}, status=http.HTTP_400_BAD_REQUEST)
    params = query.validated_data
    entries = ActionLog.objects.select_related("pipeline").order_by("-created_at")
    if params.get("pipeline"):
        entries = entries.of_pipeline_named(params["pipeline"])  # a deleted pipeline's entries too
    if params.get("group"):
        entries = entries.filter(group_id=params["group"])
    if params.get("action"):
        entries = entries.filter(action=params["action"])
    return Response({"actions": [_action_json(e) for e in entries[:params["limit"]]]})


def _topic_check_json(job: TopicCheckJob) -> dict:
    return {"id": job.pk, "pipeline": job.pipeline.name if job.pipeline_id else None, "status": job.status,
            "table": job.table, "key_column": job.key_column, "progress": job.progress,
            "progress_message": job.progress_message, "error": job.error or None, "result": job.result,
            "requested_by": job.requested_by, "created_at": job.created_at.isoformat(),
            "finished_at": job.finished_at.isoformat() if job.finished_at else None}


@extend_schema(methods=["GET"], responses=answers(schemas.TopicCheckListSerializer))
@extend_schema(responses=answers(schemas.TopicCheckSerializer, status=202,
                                 extra={409: REFUSED, 503: schemas.TopicCheckSerializer}),
               methods=["POST"], request=EmptyInput)
@api_view(["GET", "POST"])
@permission_classes(OPERATE)
def pipeline_topic_checks(request, name):
    """GET: the pipeline's topic checks (latest first). POST (operators): queue a topic check of the pipeline's
    own sink table; nothing in the body chooses what is read."""
    from consumers.reconciliation.topic_check import TopicCheckError, request_topic_check

    pipeline = get_object_or_404(Pipeline, name=name)
    if request.method == "GET":
        jobs = TopicCheckJob.objects.of_pipelines().filter(pipeline=pipeline).order_by("-created_at")
        return Response({"topic_checks": [_topic_check_json(job) for job in jobs[:TOPIC_CHECKS_SHOWN]]})
    body = EmptyInput(data=request.data)
    if not body.is_valid():
        return refuse_invalid(request, body, "topic_check", pipeline)
    try:
        with transaction.atomic():
            job = request_topic_check(pipeline, requested_by=request.user.username)
    except TopicCheckError as exc:
        record_refusal(request.user, "topic_check", str(exc), pipeline=pipeline)
        return Response({"error": str(exc)}, status=http.HTTP_409_CONFLICT)
    job.refresh_from_db()
    failed = job.status == TopicCheckStatus.FAILED  # the task broker is down: said at once, not "queued"
    return Response(_topic_check_json(job),
                    status=http.HTTP_503_SERVICE_UNAVAILABLE if failed else http.HTTP_202_ACCEPTED)


class ObtainToken(APIView):
    """POST username and password -> {"token", "expiry"}: a new token at each call, shown in this answer only
    (knox keeps its digest), living TALLY_API_TOKEN_TTL_DAYS, at most TALLY_API_TOKEN_LIMIT live ones per user
    (409 past it). DELETE revokes the token the request is sent with. Throttled per address (scope "token"), and
    django-axes locks a user name and address out after repeated failures, like the login form. Each token made
    or revoked and each refusal is in the action log; a refused login says the same whether the user exists or
    not."""

    throttle_classes = [AnonRateThrottle, ScopedRateThrottle]
    throttle_scope = "token"
    parser_classes = api_settings.DEFAULT_PARSER_CLASSES  # the bounded JSON parser, as every other endpoint

    def get_permissions(self):
        # Signing in needs no login; revoking a token needs the token.
        return [IsAuthenticated()] if self.request.method == "DELETE" else []

    @extend_schema(request=AuthTokenSerializer, responses=answers(schemas.TokenSerializer, extra={409: REFUSED}))
    def post(self, request, *args, **kwargs):
        credentials = AuthTokenSerializer(data=request.data, context={"request": request, "view": self})
        if not credentials.is_valid():
            return _refused_login(request, credentials)
        try:
            token, key = tokens.issue(credentials.validated_data["user"])
        except tokens.TooManyTokens as refusal:
            return Response({"error": str(refusal), "action_id": getattr(refusal.action_log, "pk", None)},
                            status=http.HTTP_409_CONFLICT)
        return Response({"token": key, "expiry": token.expiry})

    @extend_schema(request=None, responses=answers(None, status=http.HTTP_204_NO_CONTENT))
    def delete(self, request, *args, **kwargs):
        if not isinstance(request.auth, AuthToken):
            message = "No token to revoke: send the token to revoke as `Authorization: Token …`."
            record_refusal(request.user, "revoke_token", message, params={"via": "api"})
            return Response({"error": message}, status=http.HTTP_400_BAD_REQUEST)
        tokens.revoke(request.auth, request.user)
        return Response(status=http.HTTP_204_NO_CONTENT)


def _refused_login(request, credentials) -> Response:
    """The refusal, audited (the answer is the same whether the user exists or not); django-axes marks the request
    it saw (DRF's wrapper) locked out, and then it says so."""
    params = {"via": "api", "username": _account_named(request.data)}
    if getattr(request, "axes_locked_out", False) or getattr(request._request, "axes_locked_out", False):
        record_refusal(None, "make_token", lockout_message(), params=params)
        return locked_out(request._request)
    record_refusal(None, "make_token", "login refused: " + "; ".join(
        f"{field}: {' '.join(map(str, problems))}" for field, problems in credentials.errors.items()), params=params)
    return Response(credentials.errors, status=http.HTTP_400_BAD_REQUEST)


def _account_named(data) -> str | None:
    """The user name a refused login gave, when it is an account's: whom the failures aim at. Any other text is
    not kept: viewers read the action log, and a password typed into the user-name field must not reach it."""
    name = data.get("username") if isinstance(data, dict) else None
    if not isinstance(name, str) or not get_user_model().objects.filter(username=name).exists():
        return None
    return name


obtain_token = ObtainToken.as_view()
