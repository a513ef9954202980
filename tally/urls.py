from django.contrib import admin
from django.urls import include, path

from dashboard import metrics
from dashboard.views import actions, audits, demo, groups, pages, rewind

urlpatterns = [
    path("", pages.overview, name="overview"),
    path("pipelines/<slug:name>/", pages.pipeline_detail, name="pipeline"),
    path("pipelines/<slug:name>/actions/<slug:action>/", actions.pipeline_action, name="pipeline_action"),
    path("pipelines/<slug:name>/rewind/", rewind.rewind, name="rewind"),
    path("groups/", groups.group_list, name="groups"),
    path("groups/<path:group_id>/reset/", groups.group_reset, name="group_reset"),
    path("groups/<path:group_id>/", groups.group_detail, name="group"),
    path("audit/", pages.audit_log, name="audit_log"),
    path("audits/", audits.audit_jobs, name="audit_jobs"),
    path("audits/request/", audits.request_audit, name="request_audit"),
    path("demo/", demo.demo_page, name="demo"),
    path("demo/run/", demo.demo_run, name="demo_run"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("alerts/", include("alerts.urls")),
    path("api/alerts/", include("alerts.api_urls")),
    path("api/", include("dashboard.api.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
]
