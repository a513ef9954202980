"""The demo's pipeline processes are forked from a fork server with Django loaded: each is a process of
its own, runs with this process's database and broker settings (a test's, a worker's), and a SIGKILL ends
it with -9 as it would a process started from the shell."""
import os
import signal

from consumers.demo.forks import ForkedCommand
from tests.waiting import wait_for


def finished(command):
    wait_for(lambda: command.poll() is not None, 60, "the forked command to end")
    return command.poll(), command.output()


def test_a_forked_command_has_this_processs_database_and_broker(settings):
    settings.KAFKA_BOOTSTRAP_SERVERS = "127.0.0.1:1"
    command = ForkedCommand(["shell", "-c", "import os; from django.conf import settings as s; "
                             "print(os.getpid(), s.DATABASES['default']['NAME'], s.KAFKA_BOOTSTRAP_SERVERS)"])
    try:
        code, output = finished(command)
    finally:
        command.end()
    pid, database, bootstrap = output.strip().splitlines()[-1].split()   # what it printed, last
    assert code == 0 and int(pid) != os.getpid()
    assert (database, bootstrap) == (settings.DATABASES["default"]["NAME"], "127.0.0.1:1")


def test_a_killed_forked_command_ends_with_minus_nine_and_a_failing_one_with_one():
    killed = ForkedCommand(["shell", "-c", f"import os; os.kill(os.getpid(), {int(signal.SIGKILL)})"])
    failing = ForkedCommand(["no_such_command"])
    try:
        assert finished(killed)[0] == -signal.SIGKILL
        code, output = finished(failing)
        assert code == 1 and "Unknown command: 'no_such_command'" in output
    finally:
        killed.end()
        failing.end()
