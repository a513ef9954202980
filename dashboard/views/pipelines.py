"""Adding a pipeline from the dashboard: the form of consumers.operations.pipeline_setup (same checks as the CLI)."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods

from consumers.operations import pipeline_setup
from consumers.operations.pipeline_setup import Invalid, PipelineSpec
from dashboard.forms import PipelineForm
from dashboard.roles import can_operate
from dashboard.views.actions import refuse_viewer
from dashboard.views.common import render_page


@require_http_methods(["GET", "POST"])
@login_required
def new_pipeline(request):
    operator = can_operate(request.user)
    if request.method == "POST" and not operator:
        return refuse_viewer(request, None)
    form = PipelineForm(request.POST or None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            spec = PipelineSpec(**form.cleaned_data)
            try:
                pipeline = pipeline_setup.create(spec, actor=request.user.username)
            except Invalid as exc:
                for field, message in exc.problems.items():
                    form.add_error(field if field in form.fields else None, message)
            else:
                messages.success(request, f"Created pipeline {pipeline.name} (stopped): start it when ready.")
                return redirect("pipeline", name=pipeline.name)
        status = 400
    return render_page(request, "pipeline_new.html", {"nav": "overview", "form": form, "can_operate": operator},
                       status=status)
