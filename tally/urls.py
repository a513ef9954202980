from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from dashboard import metrics
from dashboard.views import (
    actions,
    clusters,
    dead_letters,
    demo,
    groups,
    pages,
    pipelines,
    rewind,
    topic_checks,
    trace,
    watches,
)

urlpatterns = [
    path("", pages.overview, name="overview"),
    path("pipelines/new/", pipelines.new_pipeline, name="new_pipeline"),
    path("pipelines/<slug:name>/", pages.pipeline_detail, name="pipeline"),
    path("pipelines/<slug:name>/actions/<slug:action>/", actions.pipeline_action, name="pipeline_action"),
    path("pipelines/<slug:name>/rewind/", rewind.rewind, name="rewind"),
    path("pipelines/<slug:name>/trace/", trace.trace_record, name="trace"),
    path("pipelines/<slug:name>/dead-letters/", dead_letters.dead_letter_list, name="dead_letters"),
    path("pipelines/<slug:name>/dead-letters/export.csv", dead_letters.export_csv, name="dead_letters_csv"),
    # URL names are the action log's action names: a viewer's refused POST is recorded under them.
    path("pipelines/<slug:name>/dead-letters/replay/", dead_letters.replay_dead_letters, name="replay_dead_letters"),
    path("pipelines/<slug:name>/dead-letters/discard/", dead_letters.discard_dead_letters,
         name="discard_dead_letters"),
    path("clusters/", clusters.cluster_list, name="clusters"),
    path("groups/", groups.group_list, name="groups"),
    path("groups/<path:group_id>/reset/", groups.group_reset, name="group_reset"),
    path("groups/<path:group_id>/", groups.group_detail, name="group"),
    path("watches/", watches.watch_list, name="watches"),
    path("watches/new/", watches.new_watch, name="new_watch"),
    path("watches/<slug:name>/", watches.watch_detail, name="watch"),
    path("watches/<slug:name>/trace/", watches.trace_finding, name="watch_trace"),
    path("watches/<slug:name>/findings.csv", watches.export_findings, name="watch_findings_csv"),
    path("action-log/", pages.action_log, name="action_log"),
    path("topic-checks/", topic_checks.topic_check_jobs, name="topic_check_jobs"),
    path("topic-checks/request/", topic_checks.request_topic_check, name="topic_check"),
    path("demo/", demo.demo_page, name="demo"),
    path("demo/run/", demo.demo_run, name="demo_run"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
    path("alerts/", include("alerts.urls")),
    path("api/alerts/", include("alerts.api_urls")),
    path("api/", include("dashboard.api.urls")),
    path("accounts/", include("dashboard.accounts_urls")),
    path("admin/", admin.site.urls),
]
