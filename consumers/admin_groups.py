"""Consumer groups that Tally does not run, in the admin: there is no model, so these are custom views
of the admin site (consumers/admin_site.py). The list (everyone with view access) and, for operators, an
offset reset of the selected groups with the same flow as a rewind: form -> preview per group and
partition -> execute. consumers.operations.group_reset does the work, the validation and the action log."""
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

from consumers.access import AuditedRefusal, can_operate, can_view, form_errors, record_refusal
from consumers.kafka import clusters
from consumers.kafka.errors import ClusterConfigError
from consumers.offset_move_forms import GroupResetForm
from consumers.operations import group_reset as group_resets
from consumers.operations import groups as kafka_groups
from consumers.operations.errors import Refused


def _context(site, request, title: str, **extra) -> dict:
    return {**site.each_context(request), "title": title, "can_operate": can_operate(request.user), **extra}


def _cluster_query(cluster: str) -> str:
    """?cluster=NAME for any but the default cluster: the admin's list and the dashboard's group pages take it."""
    return "" if cluster == clusters.DEFAULT else f"?{urlencode({'cluster': cluster})}"


def _list_url(cluster: str) -> str:
    """The list of a cluster's groups; the default cluster's for one that is not configured (a posted name)."""
    known = cluster in clusters.names_or_default()
    return reverse("admin:consumer_groups") + _cluster_query(cluster if known else clusters.DEFAULT)


def group_list(request, site):
    """One cluster's groups (?cluster=NAME, the default cluster when absent), with a link to each other cluster."""
    if not can_view(request.user):
        raise PermissionDenied
    cluster = request.GET.get("cluster") or clusters.DEFAULT
    try:
        clusters.get(cluster)
    except ClusterConfigError:
        raise Http404("No such Kafka cluster.") from None
    # A clusters file that cannot be read hides the others, not the default cluster's groups.
    listed = reverse("admin:consumer_groups")
    others = [(name, listed + _cluster_query(name)) for name in clusters.names_or_default() if name != cluster]
    error = ""
    try:
        names = kafka_groups.list_groups(cluster=cluster)
    except Exception as exc:  # Kafka down: the page with the reason, not a 500
        names, error = [], f"Kafka did not answer: {exc}"
    return TemplateResponse(request, "admin/consumers/groups.html", _context(
        site, request, "Consumer groups not run by Tally", groups=names, error=error, cluster=cluster,
        other_clusters=others, dashboard_query=_cluster_query(cluster)))


def _refuse_viewer(request, group_ids: list[str], cluster: str) -> None:
    message = f"{request.user.get_username()} is not an operator: only operators can reset consumer groups."
    for group_id in group_ids or [""]:
        record_refusal(request.user, group_resets.ACTION, message, group_id=group_id,
                       params={"via": "admin", "cluster": cluster})
    raise AuditedRefusal(message)


def group_reset(request, site):
    """POST only: `group` (one or more), then the form with `step` = preview or execute."""
    if request.method != "POST":
        return redirect("admin:consumer_groups")
    group_ids = sorted(set(request.POST.getlist("group")))
    # The groups' cluster; reset_group refuses (audited) one that is not configured.
    cluster = request.POST.get("cluster") or clusters.DEFAULT
    if not can_operate(request.user):
        _refuse_viewer(request, group_ids, cluster)
    if not group_ids:
        messages.error(request, "Select at least one consumer group.")
        return redirect(_list_url(cluster))
    step = request.POST.get("step", "")
    form = GroupResetForm(request.POST if step else None)
    context = _context(site, request, "Reset consumer group offsets", group_ids=group_ids, form=form, step="form",
                       cluster=cluster, dashboard_query=_cluster_query(cluster))
    if step and not form.is_valid():
        _log_invalid(request, group_ids, form, cluster, dry_run=step != "execute")
    elif step:
        data = form.cleaned_data
        arguments = {"partitions": data["partitions"] or None, "actor": request.user.get_username(),
                     "cluster": cluster}
        if step == "execute":
            for group_id in group_ids:
                try:
                    result = group_resets.reset_group(group_id, data["topic"], data["mode"], data["value"] or None,
                                                      execute=True, **arguments)
                except Refused as exc:
                    messages.error(request, f"Group {group_id}: reset refused: {exc}")
                else:
                    messages.success(request, f"Group {group_id}: offsets reset: {result.message}")
            return redirect(_list_url(cluster))
        previews = []
        for group_id in group_ids:
            try:
                previews.append({"group_id": group_id, "preview": group_resets.reset_group(
                    group_id, data["topic"], data["mode"], data["value"] or None, execute=False,
                    **arguments).as_dict()})
            except Refused as exc:
                previews.append({"group_id": group_id, "refused": str(exc)})
        context.update(step="preview", previews=previews, carry=form.hidden_copy(),
                       executable=[p["group_id"] for p in previews if "preview" in p])
    return TemplateResponse(request, "admin/consumers/group_reset.html", context)


def _log_invalid(request, group_ids, form, cluster: str, *, dry_run: bool) -> None:
    params = {"via": "admin", "cluster": cluster,
              **{k: form.data.get(k, "") for k in ("topic", "mode", "value", "partitions")}}
    for group_id in group_ids:
        record_refusal(request.user, group_resets.ACTION, f"Bad input: {form_errors(form)}", group_id=group_id,
                       params=params, dry_run=dry_run)



