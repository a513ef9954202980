"""Alerts in the JSON API under /api/alerts/."""
app_name = "alerts_api"
urlpatterns: list = []
