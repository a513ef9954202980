"""Long-running commands stop when their process group gets SIGTERM (or SIGINT), whether their children died
first or not (`kill -- -PGID` kills a whole stack at once): kafka_broker, run_pipeline, run_spark_pipeline
(its JVM dead first too), devstack, the Celery worker (with its engine host processes), Celery beat, and an
engine host alone (SIGTERM to it, or its worker gone). The deadlines guard against hangs only."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from consumers.kafka.broker import free_port, is_reachable
from tests.conftest import ROOT, gone
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
    output = command.stdout.read()
    # Stopped on the signal (0), or already exiting because its broker died (1; and a signal that lands while the
    # interpreter finalizes, its handlers gone, ends it as that signal does).
    assert code in (0, 1) or (code == -signal.SIGTERM and "broker exited with code" in output), (code, output)


def test_kafka_broker_whose_broker_dies_says_so_and_exits_1(env):
    command, _ = broker_command(env)
    for child in children_of(command):
        child.kill()
    output, _ = command.communicate(timeout=patience(STOP_WITHIN_S))
    assert command.returncode == 1 and "broker exited with code" in output  # at start-up or after


@pytest.fixture
def running_pipeline(subprocess_env, make_topic):
    from tests.pipelines import create_pipeline

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
@pytest.mark.parametrize("signum,broker_dies_first", [(signal.SIGTERM, True), (signal.SIGINT, False)],
                         ids=["sigterm-after-its-broker-died", "sigint"])
def test_devstack_stops_everything_on_a_signal_to_its_group(subprocess_env, signum, broker_dies_first):
    web_port, kafka_port = free_port(), free_port()
    env = dict(subprocess_env, KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{kafka_port}",
               DJANGO_SUPERUSER_PASSWORD="stack-test-password")
    stack = start(["devstack", "--port", str(web_port), "--no-demo"], env)
    try:
        wait_for(lambda: login_page_up(web_port), 90, "the login page")
        children = children_of(stack)
        broker = [c for c in children if "tansu" in " ".join(c.cmdline())]
        assert broker
        if broker_dies_first:
            for process in broker:
                process.kill()
        stopped(stack, signum)
    finally:
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGKILL)
    assert "All processes stopped." in stack.stdout.read()
    for child in children:
        assert gone(child), child.cmdline()

def live_run_of(pipeline):
    from consumers.models import ConsumerRun, RunState

    return ConsumerRun.objects.filter(pipeline=pipeline, state=RunState.RUNNING).order_by("-pk").first()


def ended_cleanly(run) -> bool:
    from consumers.models import RunState

    run.refresh_from_db()
    return run.state == RunState.STOPPED


@pytest.fixture
def worker_with_a_run(running_pipeline, celery_app_for_tests):
    """A Celery worker (the production one: runs in engine host processes) serving the pipeline."""
    from consumers.operations import actions
    from tests.conftest import start_celery_worker, stop_process_group

    pipeline, env = running_pipeline
    worker = start_celery_worker(dict(env, TALLY_ENGINE_PROCESSES="1"), log_name="stop-worker")
    try:
        actions.start(pipeline.name)
        run = wait_for(lambda: live_run_of(pipeline), 90, "the worker's run")
        yield worker, run
    finally:
        stop_process_group(worker)
        celery_app_for_tests.control.purge()


def engine_hosts(worker) -> list[psutil.Process]:
    return [c for c in children_of(worker) if "engine_host" in " ".join(c.cmdline())]


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_celery_worker_stops_its_runs_and_exits_on_a_signal_to_its_group(worker_with_a_run, signum):
    worker, run = worker_with_a_run
    hosts = engine_hosts(worker)
    assert hosts, "the run is hosted in an engine host process"
    # Celery's own convention: a warm shutdown exits 0 on SIGTERM and 1 (interrupted) on SIGINT.
    assert stopped(worker, signum) == (1 if signum == signal.SIGINT else 0)
    assert ended_cleanly(run), run.state
    # A host ignores SIGINT (its worker decides) and leaves when its worker is gone and its stdin closes.
    wait_for(lambda: all(gone(host) for host in hosts), STOP_WITHIN_S, "the engine hosts to exit")


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_a_celery_worker_whose_engine_host_died_first_exits_on_sigterm(worker_with_a_run):
    worker, _ = worker_with_a_run
    for host in engine_hosts(worker):
        host.kill()
    stopped(worker, signal.SIGTERM)


def hosting(pipeline, env):
    """`manage.py engine_host` as a worker starts it (commands on its stdin), hosting one run of the pipeline."""
    from consumers.models import DesiredState, Pipeline

    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.RUNNING)
    host = subprocess.Popen([sys.executable, "manage.py", "engine_host"], cwd=ROOT, env=env, start_new_session=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    host.stdin.write(json.dumps({"op": "run", "key": "k1", "pipeline_id": pipeline.pk, "epoch": pipeline.epoch}) + "\n")
    host.stdin.flush()
    return host, wait_for(lambda: live_run_of(pipeline), 60, "the hosted run")


@pytest.mark.django_db(transaction=True)
def test_an_engine_host_alone_stops_its_runs_and_exits_on_sigterm_while_its_worker_lives(running_pipeline):
    """SIGTERM to the host only (`kill PID`): its stdin is still open, as its worker lives on."""
    host, run = hosting(*running_pipeline)
    try:
        assert stopped(host, signal.SIGTERM) == 0
    finally:
        host.stdin.close()
    result = json.loads(host.stdout.readline())
    assert result["key"] == "k1" and result["result"]["reason"] == "stopped", result
    assert ended_cleanly(run), run.state


@pytest.mark.django_db(transaction=True)
def test_an_engine_host_receives_sigterm_on_its_main_thread_only(running_pipeline):
    """The kernel hands a process's signal to any thread that does not block it, and Python runs the handler only
    when the main thread wakes: every other thread of a host (its command reader, its runs, their consumers' and
    beat's threads) must block SIGTERM, or a SIGTERM landing there leaves the host asleep, never stopping."""
    host, run = hosting(*running_pipeline)
    try:
        masks = {int(task.name): sigterm_blocked(task) for task in Path(f"/proc/{host.pid}/task").iterdir()}
    finally:
        host.stdin.close()
        host.wait(timeout=patience(STOP_WITHIN_S))
    assert masks.pop(host.pid) is False, "the main thread must take SIGTERM"
    assert len(masks) >= 2, masks   # the command reader and the run's thread at least
    assert all(masks.values()), f"threads taking SIGTERM besides the main one: {masks}"


def sigterm_blocked(task: Path) -> bool:
    """Whether the thread's blocked-signal mask (SigBlk in /proc, a hex bit set) holds SIGTERM."""
    mask = next(line for line in (task / "status").read_text().splitlines() if line.startswith("SigBlk:"))
    return bool(int(mask.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


@pytest.mark.django_db(transaction=True)
def test_an_engine_host_whose_worker_died_first_stops_its_runs_and_exits(running_pipeline):
    """The worker SIGKILLed: the host's stdin closes, and that is its signal."""
    host, run = hosting(*running_pipeline)
    host.stdin.close()
    try:
        assert host.wait(timeout=patience(STOP_WITHIN_S)) == 0
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
    assert ended_cleanly(run), run.state


def test_an_engine_host_whose_worker_died_as_it_pinged_exits(subprocess_env):
    """The worker pinged and died: the host's answer meets a closed results pipe (BrokenPipeError), and the host
    must leave all the same, not wait for ever, orphaned, for an end of its commands it will never read."""
    host = subprocess.Popen([sys.executable, "manage.py", "engine_host"], cwd=ROOT, env=subprocess_env,
                            start_new_session=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    host.stdout.close()   # the worker's end of the results pipe, gone with it
    host.stdin.write(json.dumps({"op": "ping"}) + "\n")
    host.stdin.close()
    try:
        host.wait(timeout=patience(STOP_WITHIN_S))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"engine host still running {patience(STOP_WITHIN_S):.0f} s after its worker died") \
            from None
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)


@pytest.mark.celery
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_celery_beat_exits_on_a_signal_to_its_group(subprocess_env, tmp_path, signum):
    beat = subprocess.Popen([sys.executable, "-m", "celery", "-A", "tally", "beat", "-s", str(tmp_path / "schedule"),
                             "--loglevel", "INFO"], cwd=ROOT, env=subprocess_env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    wait_for(lambda: lines.append(beat.stdout.readline()) or "beat: Starting" in "".join(lines), 60, "beat to start")
    assert stopped(beat, signum) == 0


@pytest.fixture
def spark_pipeline_env(subprocess_env, make_topic):
    from consumers.models import Engine
    from tests.pipelines import create_pipeline

    topic = make_topic("sstop", partitions=2)
    pipeline = create_pipeline(f"sstop-{topic[-8:]}".lower(), topic, f"sstop_{topic[-8:]}".lower(), engine=Engine.SPARK)
    yield pipeline, subprocess_env
    from tests.conftest import drop_sink_tables

    drop_sink_tables([pipeline.sink_table])


@pytest.mark.spark
@pytest.mark.spark_processes
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("jvm_dies_first", [False, True], ids=["sigterm", "sigterm-after-its-jvm-died"])
def test_run_spark_pipeline_exits_on_sigterm_to_its_group(spark_pipeline_env, jvm_dies_first):
    pipeline, env = spark_pipeline_env
    command = start(["run_spark_pipeline", pipeline.name], env)
    try:
        wait_for(lambda: serving_runs(pipeline) == 1, 120, "the Spark run to start")
        if jvm_dies_first:
            jvms = [child for child in children_of(command) if "java" in child.name()]
            assert jvms, "the driver's JVM is a child of the command"
            for jvm in jvms:
                jvm.kill()
        stopped(command, signal.SIGTERM)
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
