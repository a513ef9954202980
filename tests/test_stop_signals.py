"""Long-running commands stop when their process group gets SIGTERM (or SIGINT), whether their children died
first or not (`kill -- -PGID` kills a whole stack at once). The deadlines guard against hangs only."""
import os
import signal
import subprocess
import sys

import psutil
import pytest

from consumers.kafka.broker import free_port, is_reachable
from tests.conftest import ROOT
from tests.waiting import patience, wait_for

STOP_WITHIN_S = 10  # the promise; scaled by the tests' patience on a loaded machine
pytestmark = [pytest.mark.kafka]  # a broker each: the command's own, or the tests' for the pipelines


def start(args, env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def children_of(process) -> list[psutil.Process]:
    return psutil.Process(process.pid).children(recursive=True)


def stopped(process, signum) -> int:
    os.killpg(process.pid, signum)
    try:
        return process.wait(timeout=patience(STOP_WITHIN_S))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise AssertionError(f"still running {patience(STOP_WITHIN_S):.0f} s after signal {signum}") from None


@pytest.fixture
def env():
    return dict(os.environ, PYTHONUNBUFFERED="1")


def broker_command(env):
    port = free_port()
    command = start(["kafka_broker", "--port", str(port)], env)
    wait_for(lambda: is_reachable(f"127.0.0.1:{port}", timeout=0.2), 30, "the broker")
    return command, port


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_kafka_broker_stops_its_broker_and_exits_on_a_signal_to_its_group(env, signum):
    command, port = broker_command(env)
    tansu = children_of(command)
    assert tansu, "the broker runs as a child process"
    assert stopped(command, signum) == 0
    assert not is_reachable(f"127.0.0.1:{port}", timeout=0.2)
    assert all(not child.is_running() or child.status() == psutil.STATUS_ZOMBIE for child in tansu)


def test_kafka_broker_exits_when_its_broker_died_first(env):
    command, _ = broker_command(env)
    for child in children_of(command):
        child.kill()  # the broker dies before the command hears anything
    wait_for(lambda: all(c.status() == psutil.STATUS_ZOMBIE or not c.is_running() for c in children_of(command)),
             10, "the broker to die")
    code = stopped(command, signal.SIGTERM)
    assert code in (0, 1)  # stopped on the signal, or already exiting because its broker died


def test_kafka_broker_whose_broker_dies_says_so_and_exits_1(env):
    command, _ = broker_command(env)
    for child in children_of(command):
        child.kill()
    output, _ = command.communicate(timeout=patience(STOP_WITHIN_S))
    assert command.returncode == 1 and "broker exited with code" in output  # at start-up or after


@pytest.fixture
def running_pipeline(subprocess_env, make_topic):
    from consumers.engine.pipelines import create_pipeline

    topic = make_topic("stop", partitions=2)
    pipeline = create_pipeline(f"stop-{topic[-8:]}".lower(), topic, f"stop_{topic[-8:]}".lower())
    yield pipeline, subprocess_env
    from tests.conftest import drop_sink_tables

    drop_sink_tables([pipeline.sink_table])


def serving_runs(pipeline) -> int:
    from consumers.models import ConsumerRun, RunState

    return ConsumerRun.objects.filter(pipeline=pipeline, state=RunState.RUNNING).count()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_run_pipeline_stops_on_a_signal_to_its_group(running_pipeline, signum):
    pipeline, env = running_pipeline
    command = start(["run_pipeline", pipeline.name], env)
    wait_for(lambda: serving_runs(pipeline) == 1, 60, "the run to start")
    assert stopped(command, signum) == 0
    assert "stopped" in command.stdout.read()


@pytest.mark.django_db(transaction=True)
def test_run_pipeline_in_processes_stops_when_one_of_them_died_first(running_pipeline):
    pipeline, env = running_pipeline
    command = start(["run_pipeline", pipeline.name, "--processes", "2"], env)
    wait_for(lambda: serving_runs(pipeline) == 2, 90, "both runs to start")
    runs = [child for child in children_of(command) if "run_pipeline" in " ".join(child.cmdline())]
    assert len(runs) == 2
    runs[0].kill()
    assert stopped(command, signal.SIGTERM) == 1  # one process failed (killed): said, not hidden


def login_page_up(port) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.mark.celery
def test_devstack_stops_everything_when_its_broker_died_first_and_its_group_gets_sigterm(subprocess_env):
    web_port, kafka_port = free_port(), free_port()
    env = dict(subprocess_env, KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{kafka_port}",
               DJANGO_SUPERUSER_PASSWORD="stack-test-password")
    stack = start(["devstack", "--port", str(web_port), "--no-demo"], env)
    try:
        wait_for(lambda: login_page_up(web_port), 90, "the login page")
        children = children_of(stack)
        broker = [c for c in children if "tansu" in " ".join(c.cmdline())]
        assert broker
        for process in broker:
            process.kill()
        stopped(stack, signal.SIGTERM)
    finally:
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGKILL)
    assert "All processes stopped." in stack.stdout.read()
    for child in children:
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, child.cmdline()
