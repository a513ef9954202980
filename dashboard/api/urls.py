"""JSON API under /api/ (pipelines, partitions, reconciliation, groups, actions, audit)."""
app_name = "api"
urlpatterns: list = []
