"""Consumer groups Tally does not run: list, detail (state, members, lag per partition) and the offset
reset form (dry run first, then confirm). Kafka is asked live, with the admin module's timeouts."""
from dataclasses import dataclass

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from consumers import group_reset as group_resets
from consumers import kafka_admin
from consumers.models import AuditJob, Pipeline
from consumers.offset_specs import Refused
from dashboard import status
from dashboard.forms import GroupResetForm
from dashboard.roles import can_operate
from dashboard.views.actions import refuse_viewer
from dashboard.views.common import render_page


@dataclass
class GroupPartition:
    topic: str
    partition: int
    committed: int | None
    log_start: int | None
    high_watermark: int | None

    @property
    def lag(self) -> int | None:
        if self.high_watermark is None:
            return None
        return self.high_watermark - (self.committed if self.committed is not None else (self.log_start or 0))


def group_offsets(group_id: str) -> list[GroupPartition]:
    """Committed offset, log start and high watermark of every partition the group has committed on."""
    with kafka_admin.admin_session() as admin:
        committed = admin.list_group_offsets({group_id: None}).get(group_id, {})
    by_topic: dict[str, dict[int, int | None]] = {}
    for tp, meta in committed.items():
        by_topic.setdefault(tp.topic, {})[tp.partition] = meta.offset if meta.offset >= 0 else None
    rows = []
    for topic, offsets in sorted(by_topic.items()):
        marks = kafka_admin.watermarks(topic, sorted(offsets))
        rows += [GroupPartition(topic, p, offsets[p], marks[p].log_start, marks[p].high) for p in sorted(offsets)]
    return rows


def _pipeline_groups() -> dict[str, str]:
    return dict(Pipeline.objects.values_list("group_id", "name"))


@require_GET
@login_required
def group_list(request):
    error = ""
    try:
        names = kafka_admin.list_groups()
    except Exception as exc:  # Kafka down: show the page with the reason, not a 500
        names, error = [], f"Kafka did not answer: {exc}"
    pipelines = _pipeline_groups()
    sampled = {g.group_id: g for g in status.external_group_rows()}
    groups = [{"group_id": n, "pipeline": pipelines.get(n), "sample": sampled.get(n)} for n in names]
    return render_page(request, "groups.html", {"nav": "groups", "groups": groups, "error": error})


def _detail_context(request, group_id, form=None, preview=None, carry=None):
    context = {"nav": "groups", "group_id": group_id, "pipeline": Pipeline.objects.filter(group_id=group_id).first(),
               "can_operate": can_operate(request.user), "preview": preview, "carry": carry, "error": ""}
    try:
        context["description"] = kafka_admin.describe_group(group_id)
        context["partitions"] = group_offsets(group_id)
    except Exception as exc:
        context.update(description=None, partitions=[], error=f"Kafka did not answer: {exc}")
    topics = sorted({p.topic for p in context["partitions"]})
    context["topics"] = topics
    context["form"] = form or GroupResetForm(topics=topics, initial={"topic": topics[0] if topics else ""})
    context["actions"] = list(status.recent_actions(None, limit=200))
    context["actions"] = [a for a in context["actions"] if a.group_id == group_id][:20]
    context["audits"] = list(AuditJob.objects.filter(group_id=group_id)[:5])
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
