from django.contrib import admin
from django.urls import include, path

from dashboard.views import pages

urlpatterns = [
    path("", pages.overview, name="overview"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
]
