"""The engine host watchdog (consumers/engine/hosts.py) on a real host process that hangs before it ever answers:
frozen while loading Django, it must not hold the runs sent to it for ever."""
import psutil
import pytest

from consumers.engine import hosts
from tests.waiting import wait_for


@pytest.fixture
def frozen_host():
    """A real `manage.py engine_host`, frozen (SIGSTOP) before it could load Django and answer anything."""
    host = hosts.Host(1)
    process = psutil.Process(host.pid)
    process.suspend()
    yield host
    if host.process.poll() is None:
        process.resume()
        host.process.kill()
    host.process.wait()


def test_a_host_that_never_answered_is_killed_after_the_start_limit_not_after_a_lease(frozen_host, settings):
    settings.TALLY_RUN_LEASE_SECONDS = 5
    pool = hosts.HostPool(1)
    pool.hosts = [frozen_host]
    started = frozen_host.started_at

    pool.check_hosts(started + hosts.START_LIMIT_S - 1)   # far past a lease, but it may still be loading Django
    assert frozen_host.alive and frozen_host.process.poll() is None and frozen_host.killed_because == ""

    pool.check_hosts(started + hosts.START_LIMIT_S + 1)
    wait_for(lambda: not frozen_host.alive, 10, "the killed host's reader to see it exit")
    assert frozen_host.killed_because == f"did not answer for {hosts.START_LIMIT_S + 1} s since it started"
