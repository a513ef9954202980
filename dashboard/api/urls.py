"""JSON API under /api/ (pipelines, partitions, reconciliation, dead letters, groups, watches, actions, action log).
See README."""
from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from dashboard.api import docs, views, watches

app_name = "api"
urlpatterns = [
    path("", views.api_root, name="root"),
    path("me", views.me, name="me"),
    path("token", views.obtain_token, name="token"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", docs.api_docs, name="docs"),
    path("pipelines/", views.pipeline_list, name="pipelines"),
    path("pipelines/preview", views.pipeline_preview, name="pipeline_preview"),
    path("pipelines/<slug:name>/", views.pipeline_detail, name="pipeline"),
    path("pipelines/<slug:name>/reconciliation", views.reconciliation, name="reconciliation"),
    path("pipelines/<slug:name>/trace", views.trace_record, name="trace"),
    path("pipelines/<slug:name>/dead-letters", views.dead_letters, name="dead_letters"),
    path("pipelines/<slug:name>/dead-letters/replay", views.replay_dead_letters, name="replay_dead_letters"),
    path("pipelines/<slug:name>/dead-letters/discard", views.discard_dead_letters, name="discard_dead_letters"),
    path("pipelines/<slug:name>/actions/<slug:action>", views.pipeline_action, name="action"),
    path("pipelines/<slug:name>/rewind", views.pipeline_rewind, name="rewind"),
    path("pipelines/<slug:name>/topic-checks", views.pipeline_topic_checks, name="topic_checks"),
    path("clusters/", views.cluster_list, name="clusters"),
    path("groups/", views.group_list, name="groups"),
    path("groups/<path:group_id>/reset", views.group_reset_view, name="group_reset"),
    path("groups/<path:group_id>/", views.group_detail, name="group"),
    path("watches/", watches.watch_list, name="watches"),
    path("watches/<slug:name>/", watches.watch_detail, name="watch"),
    path("watches/<slug:name>/check", watches.watch_check, name="watch_check"),
    path("watches/<slug:name>/trace", watches.watch_trace_record, name="watch_trace"),
    path("watches/<slug:name>/findings.csv", watches.watch_findings_csv, name="watch_findings_csv"),
    path("action-log", views.action_log, name="action_log"),
]
