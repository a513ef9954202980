from django.contrib import admin
from django.urls import include, path

from dashboard.views import pages

urlpatterns = [
    path("", pages.overview, name="overview"),
    path("alerts/", include("dashboard.alerts.urls")),
    path("api/alerts/", include("dashboard.alerts.api_urls")),
    path("api/", include("dashboard.api.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
]
