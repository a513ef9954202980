"""The one Celery app, configured from Django settings (CELERY_* names)."""
import os

from celery import Celery
from celery.worker.control import inspect_command

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tally.settings")

app = Celery("tally")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# Registered here, not with the tasks: `celery inspect` accepts only the commands known where the app is loaded.
@inspect_command()
def engine_hosts(state):
    """`celery -A tally inspect engine_hosts`: the worker's engine host processes (consumers/engine/hosts.py), each
    with its pid, how many runs it holds and when it last answered. [] for a worker that started none."""
    from consumers.engine import hosts

    pool = hosts.existing_pool()
    return pool.describe() if pool is not None else []
