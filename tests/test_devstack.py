"""`make run`'s stack: it serves the login page, and an interrupt stops every process it started."""
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import psutil
import pytest

from consumers.kafka.broker import free_port, is_reachable
from tests.conftest import ROOT
from tests.waiting import wait_for


def login_page_status(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=2) as response:
            return response.status
    except OSError:
        return None


def start_stack(subprocess_env, **popen) -> tuple[subprocess.Popen, int, int]:
    """`manage.py devstack --no-demo` on free ports (web, Kafka): (the process, web port, Kafka port)."""
    web_port, kafka_port = free_port(), free_port()
    env = dict(subprocess_env, KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{kafka_port}",
               DJANGO_SUPERUSER_PASSWORD="stack-test-password", PYTHONUNBUFFERED="1")
    stack = subprocess.Popen([sys.executable, "manage.py", "devstack", "--port", str(web_port), "--no-demo"],
                             cwd=ROOT, env=env, **popen)
    return stack, web_port, kafka_port


@pytest.mark.kafka
@pytest.mark.celery
def test_devstack_serves_the_login_page_and_an_interrupt_leaves_no_process_behind(subprocess_env):
    stack, web_port, kafka_port = start_stack(subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True)
    try:
        wait_for(lambda: login_page_status(web_port) == 200, 90, "the login page")
        assert is_reachable(f"127.0.0.1:{kafka_port}"), "the embedded broker was not started"
        children = psutil.Process(stack.pid).children(recursive=True)
        names = " ".join(" ".join(child.cmdline()) for child in children)
        assert "tansu" in names and "worker" in names and "beat" in names and "runserver" in names
        # Pipeline runs on a worker of their own: the periodic tasks' worker always has a thread for them.
        assert "worker -Q pipelines -n pipelines@%h" in names and "worker -Q celery -n tasks@%h" in names
    finally:
        stack.send_signal(signal.SIGINT)
        output, _ = stack.communicate(timeout=30)
    assert "login: admin, password from DJANGO_SUPERUSER_PASSWORD" in output
    assert "stack-test-password" not in output
    assert "All processes stopped." in output
    for child in children:
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, child.cmdline()
    assert not is_reachable(f"127.0.0.1:{kafka_port}", timeout=0.2)
    assert stack.returncode == 0


@pytest.mark.django_db
def test_the_admin_login_is_created_once_and_its_password_never_reset(tmp_path, monkeypatch):
    from django.contrib.auth import get_user_model

    from dashboard.management.commands import devstack

    monkeypatch.chdir(tmp_path)
    (tmp_path / "var").mkdir()
    monkeypatch.delenv("DJANGO_SUPERUSER_PASSWORD", raising=False)
    get_user_model().objects.filter(username="admin").delete()
    login, where = devstack.Command().ensure_operator_login()
    password = (tmp_path / "var" / "admin-password").read_text().strip()
    assert (login, where) == ("admin", "password in var/admin-password (new user)")
    assert oct((tmp_path / "var" / "admin-password").stat().st_mode & 0o777) == "0o600"
    assert get_user_model().objects.get(username="admin").check_password(password)
    login, where = devstack.Command().ensure_operator_login()
    assert where.startswith("password unchanged") and "changepassword admin" in where
    assert get_user_model().objects.get(username="admin").check_password(password)


def test_the_broker_is_stopped_after_its_clients(monkeypatch):
    """Stopping the broker with the others let the worker log connection errors on its way out."""
    from dashboard.management.commands import devstack

    def sleeper():
        return subprocess.Popen(["sleep", "60"], start_new_session=True)

    command = devstack.Command()
    command.children = {"broker": sleeper(), "worker": sleeper(), "beat": sleeper(), "web": sleeper()}
    clients = [process for name, process in command.children.items() if name != "broker"]
    alive_clients_when_the_broker_was_signalled = []
    real_killpg = devstack.os.killpg

    def killpg(pid, signum):
        if pid == command.children["broker"].pid:
            alive_clients_when_the_broker_was_signalled.extend(p.pid for p in clients if p.poll() is None)
        real_killpg(pid, signum)

    monkeypatch.setattr(devstack.os, "killpg", killpg)
    command.stop_all()
    assert all(process.poll() is not None for process in command.children.values())
    assert alive_clients_when_the_broker_was_signalled == []


def test_the_stack_closes_its_own_kafka_client_before_the_broker_stops(monkeypatch):
    """Seeding the demo leaves this process a shared admin client: open when the broker stopped, it logged
    ECONNREFUSED on the stack's own output."""
    import os

    from consumers.kafka import clusters
    from dashboard.management.commands import devstack

    class Client:
        closed = False

        def close(self):
            self.closed = True

    client = Client()
    monkeypatch.setitem(clusters._shared, (os.getpid(), "demo", "demo-cluster"), (threading.Lock(), [client]))
    command = devstack.Command()
    command.children = {}
    command.stop_all()
    assert client.closed


@pytest.mark.kafka
@pytest.mark.celery
def test_a_second_signal_while_the_stack_stops_prints_no_traceback_and_leaves_no_process_behind(subprocess_env):
    """Ctrl-C, then a SIGTERM and another Ctrl-C during the clean-up: it ends quietly, every child stopped."""
    stack, web_port, _ = start_stack(subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: login_page_status(web_port) == 200, 90, "the login page")
        children = psutil.Process(stack.pid).children(recursive=True)
    finally:
        # Back to back: the second is pending while the first is handled, as when Ctrl-C meets a `kill`.
        stack.send_signal(signal.SIGINT)
        stack.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        stack.send_signal(signal.SIGINT)  # and one more while the children stop (a no-op if already done)
        output, _ = stack.communicate(timeout=30)
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert output.rstrip().endswith("All processes stopped."), output
    for child in children:
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, child.cmdline()
    assert stack.returncode == 0


@pytest.mark.kafka
@pytest.mark.celery
def test_a_killed_devstack_takes_every_process_it_started_with_it(subprocess_env):
    """SIGKILL gives the stack no clean-up: each child is tied to it by PR_SET_PDEATHSIG and ends on its own."""
    stack, web_port, _ = start_stack(subprocess_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children = []
    try:
        wait_for(lambda: login_page_status(web_port) == 200, 90, "the login page")
        children = psutil.Process(stack.pid).children(recursive=True)
        names = " ".join(" ".join(child.cmdline()) for child in children)
        assert "tansu" in names and "pipelines@%h" in names and "tasks@%h" in names and "beat" in names
        assert "runserver" in names
    finally:
        stack.kill()
        stack.wait(timeout=30)

    def all_ended():
        return all(not child.is_running() or child.status() == psutil.STATUS_ZOMBIE for child in children)

    try:
        wait_for(all_ended, 30, "every process the killed stack started to end")
    finally:
        for child in children:   # whatever is left (the test failed): not a leak into the next tests
            if child.is_running():
                child.kill()


def test_a_closed_terminal_sighup_stops_the_stack_like_ctrl_c(tmp_path, monkeypatch):
    """SIGHUP's default would end devstack at once and leave its children running."""
    import os

    from dashboard.management.commands import devstack

    monkeypatch.chdir(tmp_path)
    command = devstack.Command()
    stopped = []

    def hang_up():
        os.kill(os.getpid(), signal.SIGHUP)
        pytest.fail("SIGHUP did not stop the stack")   # reached only when no handler of devstack's took it

    monkeypatch.setattr(command, "start_broker_if_needed", hang_up)
    monkeypatch.setattr(command, "stop_all", lambda: stopped.append(True))
    signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    saved = {signum: signal.getsignal(signum) for signum in signums}
    signal.signal(signal.SIGHUP, lambda signum, frame: None)   # not the default, which would end this test run
    try:
        command.handle(host="127.0.0.1", port=free_port(), no_demo=True)
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    assert stopped == [True]


def test_the_worker_that_takes_the_demo_task_warms_spark_and_the_other_does_not(monkeypatch):
    """The demo runs its Spark pipeline in the process of the worker its task goes to: that worker's driver must be
    the warm one, or the first demo waits for a JVM while another worker's sits unused."""
    from consumers.demo.runs import RUN_DEMO_TASK
    from dashboard.management.commands import devstack
    from tally.celery import app

    monkeypatch.delenv("SPARK_WARM_ON_WORKER_START", raising=False)
    demo_queue = app.amqp.router.route({}, RUN_DEMO_TASK)["queue"].name
    workers = {name: command[command.index("-Q") + 1].split(",")
               for name, command in devstack.stack_commands("127.0.0.1", free_port()).items() if "worker" in command}
    takers = [name for name, queues in workers.items() if demo_queue in queues]
    assert len(takers) == 1, (demo_queue, workers)

    def warms(name):
        environment = devstack.developer_environment() | devstack.CHILD_ENVIRONMENT.get(name, {})
        return environment["SPARK_WARM_ON_WORKER_START"] == "true"

    assert warms(takers[0])
    assert not any(warms(name) for name in workers if name != takers[0])
