"""Alerts in the JSON API under /api/alerts/."""
from django.urls import path

from alerts import api

app_name = "alerts_api"
urlpatterns = [
    path("", api.alert_list, name="list"),
    path("<int:alert_id>/", api.alert_detail, name="detail"),
    path("<int:alert_id>/acknowledge/", api.alert_acknowledge, name="acknowledge"),
    path("<int:alert_id>/mute/", api.alert_mute, name="mute"),
]
