"""Rewind from the browser: form -> dry-run preview (before / after / records to reprocess or skip) ->
confirmation -> execution. consumers.operations.rewind does the work and writes the action log; this view only
validates input (dashboard.forms), checks the role and shows the outcome."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_http_methods
from django_htmx.http import HttpResponseClientRedirect

from consumers.access import can_operate, form_errors, record_refusal
from consumers.models import Pipeline
from consumers.offset_move_forms import RewindForm
from consumers.operations import rewind as rewind_ops
from consumers.operations.errors import Refused, Unavailable
from dashboard.views.actions import refuse_viewer
from dashboard.views.common import render_page


@require_http_methods(["GET", "POST"])
@login_required
def rewind(request, name):
    pipeline = get_object_or_404(Pipeline, name=name)
    operator = can_operate(request.user)
    context = {"nav": "overview", "pipeline": pipeline, "can_operate": operator}
    if request.method == "GET":
        return render_page(request, "rewind.html", {**context, "form": RewindForm(initial=_suggested(request))})
    if not operator:
        return refuse_viewer(request, pipeline, fragment="panel")
    form = RewindForm(request.POST)
    if not form.is_valid():
        record_refusal(request.user, "rewind", f"bad input: {form_errors(form)}", pipeline=pipeline)
        return render_page(request, "rewind.html", {**context, "form": form}, fragment="panel", status=422)
    data = form.cleaned_data
    execute = request.POST.get("step") == "execute"
    try:
        result = rewind_ops.rewind(pipeline, data["mode"], data["value"] or None, partitions=data["partitions"] or None,
                                rollback_sink=data["rollback_sink"], dry_run=not execute,
                                actor=request.user.username)
    except Refused as exc:  # audited by the operation; Kafka down (Unavailable) is a 503, as the API's
        form.add_error(None, str(exc))
        return render_page(request, "rewind.html", {**context, "form": form}, fragment="panel",
                           status=503 if isinstance(exc, Unavailable) else 422)
    if execute:
        messages.success(request, f"Rewind done on {pipeline.name}: {result.message}"
                                  + (" The pipeline was resumed." if result.resumed else ""))
        if request.htmx:
            return HttpResponseClientRedirect(pipeline_url(pipeline))
        return redirect("pipeline", name=pipeline.name)
    context.update(form=form, preview=result.as_dict(), carry=form.hidden_copy(), rollback_sink=data["rollback_sink"])
    return render_page(request, "rewind.html", context, fragment="panel")


def pipeline_url(pipeline) -> str:
    from django.urls import reverse

    return reverse("pipeline", kwargs={"name": pipeline.name})


def _suggested(request) -> dict:
    """A rewind the pipeline page suggests (e.g. to the log end for a position ahead of it): prefilled
    from the query string, only with values the form knows; nothing happens before the operator confirms."""
    initial = {}
    mode = request.GET.get("mode", "")
    if mode in dict(RewindForm.base_fields["mode"].choices):
        initial["mode"] = mode
    partitions = request.GET.get("partitions", "")
    if partitions and all(part.strip().isdigit() for part in partitions.split(",")):
        initial["partitions"] = partitions
    return initial
