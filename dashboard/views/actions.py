"""Operator actions from the pipeline page: start, stop, pause, resume, restart. The work and the action log
log entry are consumers.operations.actions'; this view checks the role, calls it and shows the outcome. Also
the one refusal of a viewer's POST on a page (`refuse_viewer`), and the add pages' door (`add_page`)."""
import functools

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods, require_POST

from consumers.access import can_operate, record_refusal, refused_action
from consumers.models import ActionResult, Pipeline
from consumers.operations import actions
from dashboard.views.common import render_page

ACTION_BUTTONS = [("start", "Start"), ("pause", "Pause"), ("resume", "Resume"), ("restart", "Restart"),
                  ("stop", "Stop")]
VIEWER_REFUSAL = ("You are a viewer: only operators can start, stop, pause, resume, restart or rewind "
                  "pipelines. Ask an administrator for the operators role.")


def action_buttons(pipeline: Pipeline) -> list[dict]:
    """Every action button, with the reason it is disabled in the pipeline's current state ("" if allowed)."""
    buttons = []
    for verb, label in ACTION_BUTTONS:
        transition = actions.TRANSITIONS[verb]
        allowed = pipeline.desired_state in transition.allowed_from
        reason = "" if allowed else f"Cannot {verb}: {transition.refusal} ({pipeline.desired_state})."
        buttons.append({"verb": verb, "label": label, "reason": reason})
    return buttons


def refuse_viewer(request, pipeline, fragment="outcome", params: dict | None = None):
    """403 with the reason, on the page (htmx swaps 403s: see the htmx-config in base.html); the refusal
    is written to the action log, with the path and `params`."""
    match = request.resolver_match
    kwargs = match.kwargs if match else {}
    record_refusal(request.user, kwargs.get("action") or refused_action(request),
                   "viewer role: " + VIEWER_REFUSAL, pipeline=pipeline, group_id=kwargs.get("group_id", ""),
                   params={"path": request.path, **(params or {})})
    messages.error(request, VIEWER_REFUSAL)
    return render_page(request, "refused.html", {"pipeline": pipeline}, fragment=fragment, status=403)


def add_page(view):
    """An add page (a pipeline, a watch): its form shown to everyone signed in, its POST taken from operators
    only. A viewer's POST is refused (403, audited) before the view runs; the view is told `operator`, for the
    page to say why its button is disabled."""
    @require_http_methods(["GET", "POST"])
    @login_required
    @functools.wraps(view)
    def page(request):
        operator = can_operate(request.user)
        if request.method == "POST" and not operator:
            return refuse_viewer(request, None)
        return view(request, operator)
    return page


@require_POST
@login_required
def pipeline_action(request, name, action):
    pipeline = Pipeline.objects.filter(name=name).first()
    if pipeline is None or action not in actions.ACTIONS:
        error = (f"No pipeline named {name!r}." if pipeline is None else
                 f"Unknown action {action!r}: use one of {', '.join(actions.ACTIONS)}.")
        # Audited as the API audits it: a POST that names nothing is still an operator's refused request.
        record_refusal(request.user, action, f"not found: {error}", pipeline=pipeline, params={"path": request.path})
        raise Http404(error)
    if not can_operate(request.user):
        return refuse_viewer(request, pipeline)
    try:
        entry = actions.perform(action, pipeline, actor=request.user.username)
    except actions.ActionRefused as exc:
        messages.error(request, str(exc))
    else:
        if entry.result == ActionResult.FAILED:
            messages.error(request, f"{pipeline.name}: {entry.message}")
        else:
            messages.success(request, f"{pipeline.name}: {entry.message}.")
    if request.htmx:
        response = render_page(request, "pipeline.html", {"pipeline": pipeline}, fragment="outcome")
        response["HX-Trigger"] = "tally:changed"  # the header, status and buttons refresh at once
        return response
    return redirect("pipeline", name=pipeline.name)
