"""Topic checks from the browser: request one (operators) and watch the jobs' progress and results.
consumers.reconciliation.topic_check stores and runs the job (a Celery task); this view only validates and lists."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.shortcuts import redirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from consumers.models import TopicCheckJob, TopicCheckStatus
from dashboard.forms import TopicCheckRequestForm
from dashboard.roles import can_operate
from dashboard.views.actions import refuse_viewer
from dashboard.views.common import render_page

JOBS_SHOWN = 5
# The topic check's value parser that reads a record the way each built-in transform does.
PARSER_FOR_TRANSFORM = {"int_value": "int_value", "json_event": "json_id", "csv_ints": "csv_ints"}


def jobs_for(topic: str = "", group_id: str = ""):
    jobs = TopicCheckJob.objects.all()
    if topic:
        jobs = jobs.filter(topic=topic)
    if group_id:
        jobs = jobs.filter(group_id=group_id)
    return list(jobs.order_by("-created_at")[:JOBS_SHOWN])


def topic_check_context(topic: str, group_id: str) -> dict:
    jobs = jobs_for(topic, group_id)
    return {"topic_checks": jobs, "topic_check_topic": topic, "topic_check_group": group_id,
            "topic_checks_active": any(j.status in (TopicCheckStatus.QUEUED, TopicCheckStatus.RUNNING) for j in jobs)}


def topic_check_form_defaults(table: str, parser: str) -> dict:
    from consumers.reconciliation.topic_check import VALUE_PARSERS

    return {"topic_check_table": table, "topic_check_parser": parser, "topic_check_parsers": list(VALUE_PARSERS)}


@require_GET
@login_required
def topic_check_jobs(request):
    """The jobs of one topic and group; htmx polls this fragment while one is queued or running."""
    context = topic_check_context(request.GET.get("topic", ""), request.GET.get("group", ""))
    return render_page(request, "topic_checks.html", {"nav": "overview", **context}, fragment="jobs")


@require_POST
@login_required
def request_topic_check(request):
    from consumers.reconciliation.topic_check import TopicCheckError
    from consumers.reconciliation.topic_check import request_topic_check as queue_topic_check

    back = request.POST.get("next", "/")
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        back = "/"
    if not can_operate(request.user):
        return refuse_viewer(request, None)
    form = TopicCheckRequestForm(request.POST)
    if not form.is_valid():
        errors = "; ".join(f"{field}: {' '.join(e)}" for field, e in form.errors.items())
        messages.error(request, f"The topic check was not requested: {errors}")
        return redirect(back)
    data = form.cleaned_data
    try:
        with transaction.atomic():
            job = queue_topic_check(data["topic"], data["group_id"], data["table"], data["key_column"],
                                    data["value_parser"], requested_by=request.user.username)
    except TopicCheckError as exc:
        messages.error(request, f"The topic check was not requested: {exc}")
    else:
        messages.success(request, f"Topic check #{job.pk} queued: {job.topic} / {job.group_id} → {job.table}.")
    return redirect(back)
