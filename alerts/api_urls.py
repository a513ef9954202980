"""Alerts in the JSON API under /api/alerts/."""
from django.urls import path

from alerts import api, channel_api

app_name = "alerts_api"
urlpatterns = [
    path("", api.alert_list, name="list"),
    path("channels/", channel_api.channel_list, name="channels"),
    path("channels/<slug:name>/", channel_api.channel_detail, name="channel"),
    path("channels/<slug:name>/test/", channel_api.channel_test, name="channel_test"),
    path("<int:alert_id>/", api.alert_detail, name="detail"),
    path("<int:alert_id>/acknowledge/", api.alert_acknowledge, name="acknowledge"),
    path("<int:alert_id>/mute/", api.alert_mute, name="mute"),
]
