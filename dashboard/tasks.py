"""Tasks of the web side: housekeeping. Thin wrappers over plain functions."""
from celery import shared_task


@shared_task(name="tally.ping")
def ping_task(value):
    """Round-trip check used by health checks and the smoke test: returns what it was given."""
    return {"pong": value}
