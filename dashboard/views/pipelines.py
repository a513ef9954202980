"""Adding a pipeline from the dashboard: the form of consumers.operations.pipeline_setup (same checks as the CLI),
with a preview (consumers.operations.pipeline_preview) of what a `json` pipeline would write, before anything is
created."""
from django.contrib import messages
from django.shortcuts import redirect

from consumers.access import form_errors, record_refusal
from consumers.engine.transforms import JSON
from consumers.form_errors import add_problems
from consumers.operations import pipeline_preview, pipeline_setup
from consumers.operations.pipeline_setup import Invalid, PipelineSpec
from dashboard.forms import PipelineForm
from dashboard.views.actions import add_page
from dashboard.views.common import render_page


@add_page
def new_pipeline(request, operator: bool):
    form = PipelineForm(request.POST or None)
    status, preview = 200, None
    if request.method == "POST" and "preview" in request.POST:
        form, preview, status = _preview(request, form)
    elif request.method == "POST":
        if form.is_valid():
            spec = PipelineSpec(**form.cleaned_data)
            try:
                pipeline = pipeline_setup.create(spec, actor=request.user.username)
            except Invalid as exc:
                add_problems(form, exc)
            else:
                messages.success(request, f"Created pipeline {pipeline.name} (stopped): start it when ready.")
                return redirect("pipeline", name=pipeline.name)
        status = 400
        record_refusal(request.user, "create", f"bad input: {form_errors(form)}",
                       params={"pipeline": request.POST.get("name", "")})
    return render_page(request, "pipeline_new.html", {"nav": "overview", "form": form, "can_operate": operator,
                                                      "preview": preview}, status=status)


def _preview(request, form):
    """(form, preview, status): the form again with the proposed mapping filled in, and what would be written."""
    if not form.is_valid():
        return form, None, 400
    spec = PipelineSpec(**form.cleaned_data)
    if spec.transform != JSON:
        form.add_error("transform", "The preview is of the json transform: set transform to json.")
        return form, None, 400
    try:
        preview = pipeline_preview.preview(spec)
    except Invalid as exc:
        add_problems(form, exc)
        return form, None, 400
    data = request.POST.copy()
    data["map"] = PipelineForm.map_text(preview.mapping)
    form = PipelineForm(data)
    form.is_valid()
    return form, preview, 200
