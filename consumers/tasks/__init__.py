"""Celery tasks of the consumers app, one module per area (autodiscover imports this package).
Tasks are thin: they take ids or names and call plain functions that do the work."""
