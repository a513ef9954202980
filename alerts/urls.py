"""Alerts pages (list, filter, acknowledge, mute; rules; channels)."""
from django.urls import path

from alerts import channel_views, rule_views, views

app_name = "alerts"
urlpatterns = [
    path("", views.alert_list, name="list"),
    path("rules/", rule_views.rule_list, name="rules"),
    path("rules/new/", rule_views.rule_edit, name="rule_new"),
    path("rules/<int:rule_id>/", rule_views.rule_edit, name="rule_edit"),
    path("rules/<int:rule_id>/mute/", rule_views.rule_mute, name="rule_mute"),
    path("rules/<int:rule_id>/test/", rule_views.rule_test, name="rule_test"),
    path("channels/", channel_views.channel_list, name="channels"),
    path("channels/new/", channel_views.channel_edit, name="channel_new"),
    path("channels/<slug:name>/", channel_views.channel_edit, name="channel_edit"),
    path("channels/<slug:name>/test/", channel_views.channel_test, name="channel_test"),
    path("channels/<slug:name>/delete/", channel_views.channel_delete, name="channel_delete"),
    path("<int:alert_id>/acknowledge/", views.alert_acknowledge, name="acknowledge"),
    path("<int:alert_id>/mute/", views.alert_mute, name="mute"),
]
