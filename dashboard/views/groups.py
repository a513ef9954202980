"""Consumer groups Tally does not run: list, detail (state, members, lag per partition, from
consumers.operations.groups) and the offset reset form (dry run first, then confirm;
consumers.operations.group_reset)."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from consumers.access import can_operate, form_errors, record_refusal
from consumers.models import Pipeline
from consumers.operations import group_reset as group_resets
from consumers.operations import groups as kafka_groups
from consumers.operations.offset_specs import Refused
from dashboard import status
from dashboard.forms import GroupResetForm
from dashboard.views.actions import refuse_viewer
from dashboard.views.common import render_page
from dashboard.views.topic_checks import topic_check_context


def _pipeline_groups() -> dict[str, str]:
    return dict(Pipeline.objects.values_list("group_id", "name"))


@require_GET
@login_required
def group_list(request):
    error = ""
    try:
        names = kafka_groups.list_groups(include_pipelines=True)
    except Exception as exc:  # Kafka down: show the page with the reason, not a 500
        names, error = [], f"Kafka did not answer: {exc}"
    pipelines = _pipeline_groups()
    # A pipeline's group shows the pipeline's lag (from reconciliation); other groups their last sample.
    sampled = {g.group_id: g for g in status.external_group_rows()}
    sampled.update({row.pipeline.group_id: row for row in status.pipeline_rows()})
    groups = [{"group_id": n, "pipeline": pipelines.get(n), "sample": sampled.get(n)} for n in names]
    return render_page(request, "groups.html", {"nav": "groups", "groups": groups, "error": error})


def _detail_context(request, group_id, form=None, preview=None, carry=None):
    context = {"nav": "groups", "group_id": group_id, "pipeline": Pipeline.objects.filter(group_id=group_id).first(),
               "can_operate": can_operate(request.user), "preview": preview, "carry": carry, "error": ""}
    report = kafka_groups.describe(group_id)
    context.update(description=report, partitions=report.partitions, error="; ".join(report.errors))
    topics = sorted({p.topic for p in context["partitions"]})
    context["topics"] = topics
    context["form"] = form or GroupResetForm(topics=topics, initial={"topic": topics[0] if topics else ""})
    context["actions"] = list(status.recent_actions(None, limit=200))
    context["actions"] = [a for a in context["actions"] if a.group_id == group_id][:20]
    context.update(topic_check_context(context["pipeline"]))  # only a pipeline's group can be checked
    return context


@require_GET
@login_required
def group_detail(request, group_id):
    return render_page(request, "group.html", _detail_context(request, group_id))


@require_POST
@login_required
def group_reset(request, group_id):
    if not can_operate(request.user):
        return refuse_viewer(request, None, fragment="panel")
    form = GroupResetForm(request.POST)
    if not form.is_valid():
        record_refusal(request.user, "reset_group", f"bad input: {form_errors(form)}", group_id=group_id)
        return render_page(request, "group.html", _detail_context(request, group_id, form=form), fragment="panel",
                           status=422)
    data = form.cleaned_data
    execute = request.POST.get("step") == "execute"
    try:
        result = group_resets.reset_group(group_id, data["topic"], data["mode"], data["value"] or None,
                                         partitions=data["partitions"] or None, execute=execute,
                                         actor=request.user.username)
    except Refused as exc:
        form.add_error(None, str(exc))
        return render_page(request, "group.html", _detail_context(request, group_id, form=form), fragment="panel",
                           status=422)
    if execute:
        messages.success(request, f"Offsets of group {group_id} reset: {result.message}")
        return redirect("group", group_id=group_id)
    return render_page(request, "group.html", _detail_context(request, group_id, form=form, preview=result.as_dict(),
                                                              carry=form.hidden_copy()), fragment="panel")
