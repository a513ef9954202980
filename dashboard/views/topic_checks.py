"""Topic checks from the browser: request one of a pipeline (operators) and watch the jobs' progress and
results. consumers.reconciliation.topic_check stores and runs the job (a Celery task); this view only
validates and lists. A topic check reads only its pipeline's sink table, so its results are as visible as the
pipeline itself."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.shortcuts import redirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from consumers.access import can_operate, record_refusal
from consumers.models import Pipeline, TopicCheckJob, TopicCheckStatus
from dashboard.forms import TopicCheckRequestForm
from dashboard.views.actions import refuse_viewer
from dashboard.views.common import render_page

JOBS_SHOWN = 5
EVERY_PIPELINES_JOBS_SHOWN = 20


def jobs_for(pipeline_name: str):
    """The latest topic checks of one pipeline (jobs of other tables, from before checks took a pipeline,
    are never shown)."""
    if not pipeline_name:
        return []
    jobs = TopicCheckJob.objects.of_pipelines().filter(pipeline__name=pipeline_name).select_related("pipeline")
    return list(jobs.order_by("-created_at")[:JOBS_SHOWN])


def topic_check_context(pipeline: Pipeline | None) -> dict:
    jobs = jobs_for(pipeline.name if pipeline else "")
    return {"topic_checks": jobs, "topic_check_pipeline": pipeline.name if pipeline else "",
            "topic_checks_active": _active(jobs)}


def _active(jobs) -> bool:
    return any(j.status in (TopicCheckStatus.QUEUED, TopicCheckStatus.RUNNING) for j in jobs)


@require_GET
@login_required
def topic_check_jobs(request):
    """The latest checks of every pipeline, or of one (?pipeline=NAME); htmx polls this fragment while one is
    queued or running. Without a pipeline a visitor expects the checks there are, not "none yet"."""
    name = request.GET.get("pipeline", "")[:100]
    if not name:
        jobs = list(TopicCheckJob.objects.of_pipelines().select_related("pipeline")
                    .order_by("-created_at")[:EVERY_PIPELINES_JOBS_SHOWN])
        context = {"topic_checks": jobs, "topic_check_pipeline": "", "topic_checks_active": _active(jobs)}
        return render_page(request, "topic_checks.html", {"nav": "overview", **context}, fragment="jobs")
    pipeline = Pipeline.objects.filter(name=name).first()
    if pipeline is None:
        return render_page(request, "topic_checks.html", {"nav": "overview", "missing_pipeline": name},
                           status=404)
    return render_page(request, "topic_checks.html", {"nav": "overview", **topic_check_context(pipeline)},
                       fragment="jobs")


@require_POST
@login_required
def request_topic_check(request):
    from consumers.reconciliation.topic_check import TopicCheckError
    from consumers.reconciliation.topic_check import request_topic_check as queue_topic_check

    back = request.POST.get("next", "/")
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        back = "/"
    form = TopicCheckRequestForm(request.POST)
    pipeline = Pipeline.objects.filter(name=form.data.get("pipeline", "")[:100]).first()
    if not can_operate(request.user):
        return refuse_viewer(request, pipeline)
    if not form.is_valid() or pipeline is None:
        reason = "pipeline: no such pipeline" if form.is_valid() else "; ".join(
            f"{field}: {' '.join(e)}" for field, e in form.errors.items())
        record_refusal(request.user, "topic_check", reason,
                       params={"pipeline": str(form.data.get("pipeline", ""))[:100]})
        messages.error(request, f"The topic check was not requested: {reason}")
        return redirect(back)
    try:
        with transaction.atomic():
            job = queue_topic_check(pipeline, requested_by=request.user.username)
    except TopicCheckError as exc:
        record_refusal(request.user, "topic_check", str(exc), pipeline=pipeline)
        messages.error(request, f"The topic check was not requested: {exc}")
    else:
        job.refresh_from_db()
        if job.status == TopicCheckStatus.FAILED:
            messages.error(request, f"Topic check #{job.pk} was not queued: {job.error}")
        else:
            messages.success(request, f"Topic check #{job.pk} queued: {pipeline.name} → {job.table}.")
    return redirect(back)
