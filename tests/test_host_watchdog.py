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


def test_a_host_that_cannot_be_forked_once_does_not_end_the_watchdog(monkeypatch, settings):
    """A fork refused under memory pressure (ENOMEM) ended the watchdog's thread for good: hung hosts were no
    longer killed, dead ones no longer replaced between runs."""
    settings.TALLY_RUN_LEASE_SECONDS = 2          # a round every 0.5 s
    made, refuse_next = [], [False]

    class StandInHost:
        def __init__(self, number):
            if refuse_next[0]:
                refuse_next[0] = False
                raise OSError(12, "Cannot allocate memory")
            self.number, self.alive, self.heard_at, self.started_at = number, True, None, 0.0
            made.append(self)

        def hung(self, now, lease):
            return False

        def send(self, message):
            pass

    monkeypatch.setattr(hosts, "Host", StandInHost)
    pool = hosts.HostPool(1)
    pool.start()
    refuse_next[0] = True
    made[0].alive = False                          # host 1 dies, and its first replacement cannot be forked
    wait_for(lambda: not refuse_next[0], 10, "the watchdog to try a replacement")
    wait_for(lambda: len(made) == 2 and made[1].alive, 10, "the watchdog's next round to replace the host")
    with pool._lock:
        pool._stopping = True                      # the watchdog thread is a daemon: it starts nothing more
