"""Read-only pages: overview, pipeline page, action log. Thin: read through dashboard.status, render."""
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET

from consumers.access import can_operate
from consumers.engine.transforms import JSON
from consumers.models import ActionLog, Pipeline
from consumers.operations.actions import cluster_problem
from consumers.reconciliation import monitored
from dashboard import consumer_rows, status, timeline
from dashboard.views.actions import action_buttons
from dashboard.views.common import BadPage, CountedUpToPaginator, htmx_bad_request, page_of, render_page
from dashboard.views.topic_checks import topic_check_context

ACTION_LOG_PAGE_SIZE = 50
# "Page N of M" counted every entry of the log, each page (36 ms with 200,000 entries): a longer log shows "of more
# than 200", and its pages past the 200th are counted as far as the page asked for.
ACTION_LOG_COUNTED_PAGES = 200


@require_GET
@login_required
def overview(request):
    context = {"nav": "overview", "rows": consumer_rows.pipeline_cells(status.pipeline_rows()),
               "watch_rows": consumer_rows.watch_cells(monitored.watches()),
               "groups": consumer_rows.group_cells(status.external_group_rows()),
               "last_check": status.last_reconciliation()}
    return render_page(request, "overview.html", context, fragment="live")


@require_GET
@login_required
def pipeline_detail(request, name):
    pipeline = get_object_or_404(Pipeline.objects.select_related("health"), name=name)
    partitions = status.partition_rows(pipeline)
    # A cluster that cannot be used (a secret file removed, say) leaves the status ERR with the reason nowhere
    # else on the page: said here, read as start and rewind read it before they refuse (no connection).
    context = {"nav": "overview", "pipeline": pipeline, "row": status.pipeline_row(pipeline),
               "partitions": partitions, "can_operate": can_operate(request.user),
               "action_buttons": action_buttons(pipeline), "cluster_problem": cluster_problem(pipeline)}
    if request.htmx and request.GET.get("fragment") in ("live", "head"):
        return render_page(request, "pipeline.html", context, fragment=request.GET["fragment"])
    range_name = request.GET.get("range") or status.DEFAULT_CHART_RANGE
    chart_error = status.unknown_chart_range(range_name)
    if chart_error and request.htmx:  # the whole page would land inside whatever element asked
        return htmx_bad_request(chart_error)
    runs = status.recent_runs(pipeline)
    context.update({
        "runs": runs, "summary": status.pipeline_summary(pipeline, runs),
        "dead_letters": status.recent_dead_letters(pipeline), "actions": status.recent_actions(pipeline),
        "timelines": [(t, timeline.svg_shapes(t)) for t in timeline.ledger_timelines(pipeline, partitions)],
        "chart": None if chart_error else status.chart_series(pipeline, range_name=range_name),
        "chart_error": chart_error, "chart_ranges": [("15m", "15 min"), ("1h", "1 h"), ("24h", "24 h")],
        **topic_check_context(pipeline),
    })
    if pipeline.transform == JSON:
        context["json_columns"], context["json_problem"] = status.json_mapping(pipeline)
    return render_page(request, "pipeline.html", context, status=400 if chart_error else 200)


@require_GET
@login_required
def action_log(request):
    actions = ActionLog.objects.select_related("pipeline").order_by("-created_at")
    pipeline = request.GET.get("pipeline", "")
    pipelines, deleted = status.action_log_pipelines()
    error = status.unknown_action_log_pipeline(pipeline, (pipelines, deleted)) if pipeline else ""
    if pipeline:
        actions = actions.of_pipeline_named(pipeline)  # a deleted pipeline's entries too
    page = None
    if not error:
        try:
            asked = request.GET.get("page")
            paginator = CountedUpToPaginator(actions, ACTION_LOG_PAGE_SIZE, ACTION_LOG_COUNTED_PAGES, asked)
            page = page_of(paginator, asked)
        except BadPage as exc:
            error = str(exc)
    context = {"nav": "action_log", "page": page, "pipeline": pipeline, "error": error,
               "pipelines": pipelines, "deleted_pipelines": deleted}
    return render_page(request, "action_log.html", context, fragment="entries", status=400 if error else 200)
