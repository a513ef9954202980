"""Tracing one record from the pipeline page (consumers.reconciliation.trace does the work; the API and the
command line call it too)."""
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET

from consumers.models import Pipeline
from consumers.reconciliation import trace as tracing
from dashboard.views.common import render_page


@require_GET
@login_required
def trace_record(request, name):
    pipeline = get_object_or_404(Pipeline, name=name)
    context = {"nav": "overview", "pipeline": pipeline, "traces": [], "error": "", "scanned": None,
               "query": {k: request.GET.get(k, "") for k in ("partition", "offset", "key")}}
    status = 200
    if any(context["query"].values()):
        try:
            partition, offset, key = tracing.parse_request(request.GET)
            if key is not None:
                records, context["scanned"] = tracing.find_by_key(pipeline, key)
                context["traces"] = [tracing.trace(pipeline, r.partition, r.offset) for r in records[-10:]]
            else:
                context["traces"] = [tracing.trace(pipeline, partition, offset)]
        except tracing.REFUSALS as exc:  # htmx swaps these statuses too: the form shows why
            context["error"], status = str(exc), tracing.refusal_status(exc, bad_request=422)
    return render_page(request, "trace.html", context, fragment="result", status=status)
