"""A worker told to start more engine host processes than it has cores says so when it starts (a warning, not an
error: more hosts than cores may be chosen on purpose, e.g. for runs that mostly wait on I/O)."""
import logging
from types import SimpleNamespace

import pytest

from consumers.engine import hosts
from consumers.tasks import operations


class StartedPool:
    """Stands for the worker's host pool: the test is about the warning, not about starting processes."""

    def start(self):
        pass

    def pids(self):
        return []


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(hosts, "pool", StartedPool)


def worker_ready(settings):
    queues = [SimpleNamespace(name=settings.TALLY_PIPELINE_QUEUE)]
    operations._start_engine_hosts(sender=SimpleNamespace(task_consumer=SimpleNamespace(queues=queues)))


def warnings_in(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "tally.runs"]


def test_a_worker_with_more_engine_hosts_than_cores_warns_at_start(settings, two_cores, caplog):
    settings.TALLY_ENGINE_PROCESSES = 3
    with caplog.at_level(logging.WARNING, logger="tally.runs"):
        worker_ready(settings)
    assert warnings_in(caplog) == [
        "TALLY_ENGINE_PROCESSES is 3 but this worker may use 2 core(s): busy runs of its engine hosts will share "
        "cores (fine when they mostly wait; else set it to the cores the worker may use)"]


@pytest.mark.parametrize("processes", [1, 2])
def test_a_worker_with_no_more_engine_hosts_than_cores_does_not_warn(settings, two_cores, caplog, processes):
    settings.TALLY_ENGINE_PROCESSES = processes
    with caplog.at_level(logging.WARNING, logger="tally.runs"):
        worker_ready(settings)
    assert warnings_in(caplog) == []
