"""Consumer groups Tally does not run: list, detail (state, members, lag per partition, from
consumers.operations.groups) and the offset reset form (dry run first, then confirm;
consumers.operations.group_reset)."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_http_methods
from django_htmx.http import HttpResponseClientRedirect

from consumers.access import can_operate, form_errors, record_refusal
from consumers.kafka import clusters
from consumers.kafka.errors import ClusterConfigError
from consumers.models import Pipeline, Watch
from consumers.offset_move_forms import GroupResetForm
from consumers.operations import group_reset as group_resets
from consumers.operations import groups as kafka_groups
from consumers.operations.errors import NotFound, Refused, Unavailable
from dashboard import status
from dashboard.views.actions import refuse_viewer
from dashboard.views.common import render_page
from dashboard.views.topic_checks import topic_check_context


def _pipeline_groups() -> dict[tuple[str, str], str]:
    rows = Pipeline.objects.values_list("cluster", "group_id", "name")
    return {(cluster, group): name for cluster, group, name in rows}


def _watches_of_groups() -> dict[tuple[str, str], list[str]]:
    """The watches of each (cluster, group): an external group may be watched, once per topic."""
    watched: dict[tuple[str, str], list[str]] = {}
    for cluster, group, name in Watch.objects.order_by("name").values_list("cluster", "group_id", "name"):
        watched.setdefault((cluster, group), []).append(name)
    return watched


def _cluster(request) -> str:
    """The cluster a group page is about (?cluster=NAME, "default" when absent); Http404 for an unknown one."""
    name = request.GET.get("cluster") or clusters.DEFAULT
    try:
        clusters.get(name)
    except ClusterConfigError:
        raise Http404("No such Kafka cluster.") from None
    return name


@require_GET
@login_required
def group_list(request):
    # Every cluster's groups; a cluster down shows its reason, the others still list theirs (never a 500).
    found, errors = kafka_groups.groups_of_every_cluster(include_pipelines=True)
    pipelines, watches = _pipeline_groups(), _watches_of_groups()
    # A pipeline's group shows the pipeline's lag (from reconciliation); other groups their last sample.
    sampled = {(g.cluster, g.group_id): g for g in status.external_group_rows()}
    sampled.update({(row.pipeline.cluster, row.pipeline.group_id): row for row in status.pipeline_rows()})
    groups = [{"group_id": g, "cluster": c, "pipeline": pipelines.get((c, g)), "watches": watches.get((c, g), []),
               "sample": sampled.get((c, g))} for c, g in found]
    error = "; ".join(errors.values())
    return render_page(request, "groups.html", {"nav": "groups", "groups": groups, "error": error,
                                                "several_clusters": len({c for c, _ in found} | set(errors)) > 1})


def _detail_context(request, group_id, form=None, preview=None, carry=None):
    cluster = _cluster(request)
    context = {"nav": "groups", "group_id": group_id, "cluster": cluster,
               "cluster_query": _cluster_query(cluster),
               "pipeline": Pipeline.objects.filter(group_id=group_id, cluster=cluster).first(),
               "watches": _watches_of_groups().get((cluster, group_id), []),
               "can_operate": can_operate(request.user), "preview": preview, "carry": carry, "error": ""}
    report = kafka_groups.describe(group_id, cluster=cluster)
    # A sentence first; the calls and exceptions that failed stay on a smaller line, for whoever digs further.
    context.update(description=report, partitions=report.partitions, error=report.problem,
                   error_detail="; ".join(report.errors))
    topics = sorted({p.topic for p in context["partitions"]})
    context["topics"] = topics
    context["form"] = form or GroupResetForm(topics=topics, initial={"topic": topics[0] if topics else ""})
    context["actions"] = status.recent_group_actions(group_id, cluster)
    context.update(topic_check_context(context["pipeline"]))  # only a pipeline's group can be checked
    return context


@require_GET
@login_required
def group_detail(request, group_id):
    context = _detail_context(request, group_id)
    if context["description"].unknown:  # Kafka would describe any id as a group: no page, no actions
        return _not_found(request, group_id, context["cluster"],
                          kafka_groups.unknown_group_message(group_id, context["cluster"]))
    return render_page(request, "group.html", context)


def _not_found(request, group_id, cluster, message, fragment=None):
    context = {"nav": "groups", "group_id": group_id, "cluster": cluster, "unknown": True, "error": message}
    return render_page(request, "group.html", context, fragment=fragment, status=404)


@require_http_methods(["GET", "POST"])
@login_required
def group_reset(request, group_id):
    if request.method == "GET":
        # Kafka allows "/" in a group id: /groups/etl/reset/ is also the page of the group "etl/reset", shown unless
        # Kafka answers that it has no such group (when it cannot answer, the page says so). Then it is the address
        # of the reset of "etl", which is POST only: its form is on the group's page, so go there.
        context = _detail_context(request, f"{group_id}/reset")
        if not context["description"].unknown:
            return render_page(request, "group.html", context)
        return redirect(reverse("group", kwargs={"group_id": group_id}) + _cluster_query(context["cluster"])
                        + "#rewind-panel")
    # Every refusal names the cluster asked for, so it shows on that cluster's group page (and the action log's).
    asked = {"cluster": request.GET.get("cluster") or clusters.DEFAULT}
    if not can_operate(request.user):
        return refuse_viewer(request, None, fragment="panel", params=asked)
    execute = request.POST.get("step") == "execute"
    try:
        cluster = _cluster(request)
    except Http404:
        record_refusal(request.user, group_resets.ACTION, f"no Kafka cluster {asked['cluster']!r} is configured",
                       group_id=group_id, params=asked, dry_run=not execute)
        raise
    form = GroupResetForm(request.POST)
    if not form.is_valid():
        record_refusal(request.user, group_resets.ACTION, f"bad input: {form_errors(form)}", group_id=group_id,
                       params=asked, dry_run=not execute)
        return render_page(request, "group.html", _detail_context(request, group_id, form=form), fragment="panel",
                           status=422)
    data = form.cleaned_data
    try:
        result = group_resets.reset_group(group_id, data["topic"], data["mode"], data["value"] or None,
                                         partitions=data["partitions"] or None, execute=execute,
                                         actor=request.user.username, cluster=cluster)
    except NotFound as exc:  # audited by the operation; nothing was created in Kafka
        return _not_found(request, group_id, cluster, str(exc), fragment="panel")
    except Refused as exc:  # audited by the operation; Kafka down is a 503, as the API answers
        form.add_error(None, str(exc))
        return render_page(request, "group.html", _detail_context(request, group_id, form=form), fragment="panel",
                           status=503 if isinstance(exc, Unavailable) else 422)
    if execute:
        messages.success(request, f"Offsets of group {group_id} reset: {result.message}")
        url = reverse("group", kwargs={"group_id": group_id}) + _cluster_query(cluster)
        if request.htmx:  # a redirect would be followed inside the request: the whole page swapped into the panel
            return HttpResponseClientRedirect(url)
        return redirect(url)
    return render_page(request, "group.html", _detail_context(request, group_id, form=form, preview=result.as_dict(),
                                                              carry=form.hidden_copy()), fragment="panel")


def _cluster_query(cluster: str) -> str:
    return "" if cluster == clusters.DEFAULT else f"?{urlencode({'cluster': cluster})}"
