"""Alerts pages (list, filter, acknowledge, mute)."""
from django.urls import path

from alerts import views

app_name = "alerts"
urlpatterns = [
    path("", views.alert_list, name="list"),
    path("<int:alert_id>/acknowledge/", views.alert_acknowledge, name="acknowledge"),
    path("<int:alert_id>/mute/", views.alert_mute, name="mute"),
]
