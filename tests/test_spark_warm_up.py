"""SPARK_WARM_ON_WORKER_START: a worker whose tasks run in its own process starts its Spark driver in the
background when it starts; a prefork worker never does (a JVM must not be forked), nor does any worker
without the setting."""
import threading
from types import SimpleNamespace

import pytest
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.concurrency.thread import TaskPool as ThreadsPool

from consumers.engine import spark_session
from consumers.tasks.spark import warm_spark_on_worker_start


@pytest.fixture
def warm_ups(monkeypatch):
    calls = threading.Event()
    monkeypatch.setattr(spark_session, "warm_up", lambda: calls.set() or 0.0)
    return calls


def worker(pool_class):
    return SimpleNamespace(pool=pool_class.__new__(pool_class))


def test_a_threads_pool_worker_warms_its_spark_driver_in_the_background(settings, warm_ups):
    settings.SPARK_WARM_ON_WORKER_START = True
    warm_spark_on_worker_start(sender=worker(ThreadsPool))
    assert warm_ups.wait(timeout=10)


@pytest.mark.parametrize("enabled, pool", [(False, ThreadsPool), (True, PreforkPool)])
def test_no_warm_up_without_the_setting_or_in_a_prefork_worker(settings, warm_ups, enabled, pool):
    settings.SPARK_WARM_ON_WORKER_START = enabled
    before = {thread.name for thread in threading.enumerate()}
    warm_spark_on_worker_start(sender=worker(pool))
    assert "tally-spark-warm-up" not in {thread.name for thread in threading.enumerate()} - before
    assert not warm_ups.is_set()
