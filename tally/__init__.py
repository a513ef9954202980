# Load the Celery app with Django so that @shared_task uses it.
from tally.celery import app as celery_app

__all__ = ("celery_app",)
