"""The Clusters page: every configured Kafka cluster, checked now (reachable or not, which step failed and why),
with the last error Tally saw and the pipelines and watches on it. Settings are shown without secrets: only
where each secret is read from."""
from django.contrib.auth.decorators import login_required
from django.views.decorators.http import require_GET

from consumers.operations import cluster_status
from dashboard.views.common import render_page


@require_GET
@login_required
def cluster_list(request):
    states, error, unconfigured = cluster_status.cluster_states()
    return render_page(request, "clusters.html", {"nav": "clusters", "clusters": states, "error": error,
                                                  "unconfigured": unconfigured})
