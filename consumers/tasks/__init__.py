"""Celery tasks of the consumers app, one module per area (autodiscover imports this package).
Tasks are thin: they take ids or names and call plain functions that do the work."""
from consumers.tasks import operations  # noqa: E402,F401,I001  (pipeline runs and the supervisor)
from consumers.tasks import spark  # noqa: E402,F401  (the topic check job)
from consumers.tasks import demo  # noqa: E402,F401  (the delivery-guarantees demo page)
from consumers.tasks import reconciliation  # noqa: E402,F401  (reconcile all, lag snapshots, downsampling)
