"""Alerts pages (list, filter, acknowledge, mute)."""
app_name = "alerts"
urlpatterns: list = []
