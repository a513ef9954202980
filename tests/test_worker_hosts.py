"""Pipelines in the production worker (docker-compose.yml's worker command, real Celery, Redis, PostgreSQL and
broker): busy pipelines run at the same time in separate engine host processes, a pipeline with two runs splits
its partitions over two processes, and a SIGKILL of either process is survived with every record once."""
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import psutil
import pytest
import yaml
from django.db.models import Max, Min

from consumers.kafka import admin as kafka_admin
from consumers.models import BatchLedger, ConsumerRun, Pipeline, RunState
from consumers.operations import actions
from tests.chaos import produce_values, sink_counts, split_reported, wait_for
from tests.conftest import ROOT, drop_sink_tables, gone, stop_process_group
from tests.pipelines import create_pipeline
from tests.producing import send

pytestmark = [pytest.mark.kafka, pytest.mark.celery, pytest.mark.django_db(transaction=True)]

LEASE_SECONDS = 5


def compose_service(name: str) -> tuple[list[str], dict]:
    """A service's command and the environment docker-compose gives it (its own and the shared x-tally-env)."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = compose["services"][name]
    return shlex.split(service["command"]), {k: str(v) for k, v in service["environment"].items()}


@pytest.fixture
def production(subprocess_env, celery_app_for_tests, kafka_bootstrap, settings):
    """Start workers as docker-compose.yml does (its command and its queue), against the test's services:
    `production.worker(**env)` starts one (the compose environment, plus `env`), `production.beat()` starts beat
    and the compose `tasks` worker, for the supervisor."""
    command, compose_env = compose_service("worker")
    queue = compose_env["TALLY_PIPELINE_QUEUE"]
    settings.TALLY_PIPELINE_QUEUE = queue
    settings.TALLY_RUN_LEASE_SECONDS = LEASE_SECONDS
    # The worker's own settings from the compose file (its Kafka client, its idle runs parking) as it has them.
    own = {key: str(compose_env[key]) for key in ("TALLY_KAFKA_CLIENT", "TALLY_PARK_IDLE_SECONDS")}
    env = dict(subprocess_env, **own, TALLY_PIPELINE_QUEUE=queue, TALLY_RUN_LEASE_SECONDS=str(LEASE_SECONDS),
               TALLY_SUPERVISOR_INTERVAL_SECONDS="1", TALLY_SUPERVISOR_BACKOFF_SECONDS="1")
    assert command[:2] == ["celery", "-A"]
    started = []

    def start(argv, log_name, **extra_env):
        log = open(ROOT / "var" / f"{log_name}-{uuid.uuid4().hex[:6]}.log", "wb")
        process = subprocess.Popen([sys.executable, "-m", *argv], cwd=ROOT, env=dict(env, **extra_env), stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        process.log_path = log.name
        started.append(process)
        return process

    class Production:
        @staticmethod
        def worker(**extra_env):
            name = f"hosts-{uuid.uuid4().hex[:6]}"
            worker = start([*command, "-n", f"{name}@%h", "--without-mingle", "--without-gossip"], "hosts-worker",
                           **extra_env)
            wait_for(lambda: celery_app_for_tests.control.ping(destination=[f"{name}@{socket.gethostname()}"],
                                                               timeout=0.5), 60, "the worker to answer a ping")
            return worker

        @staticmethod
        def beat():
            """Beat, and the compose `tasks` worker that takes its tasks (the supervisor's among them)."""
            tasks_command, _ = compose_service("tasks")
            start([*tasks_command, "-n", f"tasks-{uuid.uuid4().hex[:6]}@%h", "--without-mingle", "--without-gossip"],
                  "hosts-tasks")
            return start(["celery", "-A", "tally", "beat", "-s",
                          str(ROOT / "var" / f"hosts-beat-{uuid.uuid4().hex[:6]}"), "--loglevel", "INFO"], "hosts-beat")

    yield Production
    for process in started:
        stop_process_group(process)


@pytest.fixture
def production_worker(production):
    """The worker as docker-compose.yml starts it, and a function starting beat and `tasks` for the supervisor."""
    return production.worker(), production.beat


@pytest.fixture
def make_pipeline(make_topic):
    created = []

    def make(partitions: int, transform: str = "int_value", **fields):
        topic = make_topic("hosts", partitions=partitions)
        pipeline = create_pipeline(topic, topic, f"sink_{topic}".replace("-", "_"), transform, "exactly_once",
                                   batch_size=100, **fields)
        created.append(pipeline.sink_table)
        return pipeline

    yield make
    drop_sink_tables(created)


def live_runs(pipeline: Pipeline) -> list[ConsumerRun]:
    pipeline.refresh_from_db()
    return list(ConsumerRun.objects.filter(pipeline=pipeline, epoch=pipeline.epoch, ended_at__isnull=True)
                .exclude(assigned_partitions=[]).order_by("pk"))


def every_value_once(count: int) -> dict[int, int]:
    return {value: 1 for value in range(1, count + 1)}


def caught_up(pipeline: Pipeline) -> bool:
    stored = dict(pipeline.offsets.values_list("partition", "next_offset"))
    return stored == kafka_admin.high_watermarks(pipeline.topic)


def busy_interval(pipeline: Pipeline):
    """From the first to the last commit of a batch that held records (the ledger's commit times)."""
    span = BatchLedger.objects.filter(pipeline=pipeline, records__gt=0).aggregate(Min("committed_at"),
                                                                                  Max("committed_at"))
    return span["committed_at__min"], span["committed_at__max"]


def processes_of(worker) -> set[int]:
    root = psutil.Process(worker.pid)
    return {root.pid} | {child.pid for child in root.children(recursive=True)}


def produce_in_parallel(topics_and_counts) -> None:
    threads = [threading.Thread(target=produce_values, args=(topic, range(1, count + 1), 2))
               for topic, count in topics_and_counts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def engine_hosts_of(worker) -> list[psutil.Process]:
    hosts = []
    for child in psutil.Process(worker.pid).children(recursive=True):
        try:
            if "engine_host" in child.cmdline():
                hosts.append(child)
        except psutil.Error:   # exited (a zombie until its worker reaps it)
            continue
    return hosts


def test_the_production_worker_starts_its_engine_hosts_when_it_is_ready_before_any_run(production_worker):
    # A run taken later (a restarted pipeline's) then starts without waiting for a host to load Django.
    worker, _ = production_worker
    expected = int(compose_service("worker")[1].get("TALLY_ENGINE_PROCESSES") or os.cpu_count())
    wait_for(lambda: len(engine_hosts_of(worker)) == expected, 60, f"{expected} engine host processes")
    assert not ConsumerRun.objects.exists()


def test_celery_inspect_lists_the_production_workers_engine_hosts_and_their_runs(production_worker, make_pipeline,
                                                                                  subprocess_env):
    worker, _ = production_worker
    pipeline = make_pipeline(2)
    actions.start(pipeline.name)
    run = wait_for(lambda: (found := live_runs(pipeline)) and found[0], 60, "the run to hold its partitions")
    shown = subprocess.run([sys.executable, "-m", "celery", "-A", "tally", "inspect", "engine_hosts", "--json",
                            "--timeout", "10"], cwd=ROOT, env=subprocess_env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    (reply,) = [hosts for name, hosts in json.loads(shown.stdout).items() if name.startswith("hosts-")]
    assert sorted(host["pid"] for host in reply) == sorted(host.pid for host in engine_hosts_of(worker))
    assert {host["pid"]: host["runs"] for host in reply}[run.pid] == 1


@pytest.mark.chaos
def test_the_production_worker_replaces_a_dead_engine_host_before_any_run_asks_for_it(production_worker):
    # Its runs' pipelines are restarted at once (their rows declared crashed): a host started only when such a run
    # arrives would make it wait for Django to load, which start-up hosts are there to avoid.
    worker, _ = production_worker
    expected = int(compose_service("worker")[1].get("TALLY_ENGINE_PROCESSES") or os.cpu_count())
    hosts = wait_for(lambda: len(found := engine_hosts_of(worker)) == expected and found, 60, "the engine hosts")
    hosts[0].kill()
    wait_for(lambda: len(found := [host for host in engine_hosts_of(worker) if not gone(host)]) == expected
             and hosts[0].pid not in {host.pid for host in found}, 30, f"{expected} engine hosts again")
    assert not ConsumerRun.objects.exists()


def test_two_busy_pipelines_in_the_production_worker_run_at_once_in_two_processes_and_each_sink_is_exact(
        production_worker, make_pipeline):
    worker, _ = production_worker
    first, second = make_pipeline(2), make_pipeline(2)
    actions.start(first.name)
    actions.start(second.name)
    for pipeline in (first, second):
        wait_for(lambda p=pipeline: len(live_runs(p)) == 1, 60, f"{pipeline.name}'s run to hold partitions")
    records = 20_000
    produce_in_parallel([(first.topic, records), (second.topic, records)])
    for pipeline in (first, second):
        wait_for(lambda p=pipeline: caught_up(p), 120, f"{pipeline.name} to catch up")

    runs = [live_runs(first)[0], live_runs(second)[0]]
    assert runs[0].pid != runs[1].pid                              # two processes ...
    assert {run.pid for run in runs} <= processes_of(worker) - {worker.pid}   # ... both engine hosts of the worker
    (start_a, end_a), (start_b, end_b) = busy_interval(first), busy_interval(second)
    assert max(start_a, start_b) < min(end_a, end_b)               # busy at the same time
    for pipeline in (first, second):
        assert sink_counts(pipeline.sink_table) == every_value_once(records)


@pytest.mark.chaos
@pytest.mark.parametrize("victim", [0, 1], ids=["first-run-killed", "second-run-killed"])
def test_a_pipeline_with_two_runs_splits_its_partitions_and_survives_a_sigkill_of_either_process(
        production_worker, make_pipeline, victim):
    worker, start_beat = production_worker
    pipeline = make_pipeline(4, parallel_runs=2)
    actions.start(pipeline.name)
    runs = wait_for(lambda: len(found := live_runs(pipeline)) == 2 and split_reported(found, 4) and found, 90,
                    "both runs to read their share of the partitions")
    assert runs[0].pid != runs[1].pid
    start_beat()
    produce_values(pipeline.topic, range(1, 2001), 4)
    wait_for(lambda: caught_up(pipeline), 60, "the two runs to catch up")
    wait_for(lambda: all(run.records_processed > 0 for run in ConsumerRun.objects.filter(pk__in=[r.pk for r in runs])),
             10, "both runs to report records (at their next heartbeat)")

    epoch = Pipeline.objects.get(pk=pipeline.pk).epoch
    flowing = threading.Thread(target=produce_values, args=(pipeline.topic, range(2001, 6001), 4))
    flowing.start()
    os.kill(runs[victim].pid, signal.SIGKILL)
    flowing.join()
    back = wait_for(lambda: (found := live_runs(pipeline)) and found[0].epoch > epoch and len(found) == 2 and found,
                    90, "the supervisor to restart the pipeline with two runs")
    assert runs[victim].pid not in {run.pid for run in back}
    wait_for(lambda: caught_up(pipeline), 90, "the restarted runs to catch up")
    assert sink_counts(pipeline.sink_table) == every_value_once(6000)
    assert worker.poll() is None                                   # the worker itself lived on


def caught_up_on_a_hundred(make_pipeline):
    """A two-partition pipeline started on the values 1..100 and caught up with them: (pipeline, its live run)."""
    pipeline = make_pipeline(2)
    produce_values(pipeline.topic, range(1, 101), 2)
    actions.start(pipeline.name)
    run = wait_for(lambda: (found := live_runs(pipeline)) and found[0], 60, "the run to hold its partitions")
    wait_for(lambda: caught_up(pipeline), 60, "the run to catch up")
    return pipeline, run


@pytest.mark.chaos
def test_a_parked_run_whose_host_is_killed_comes_back_and_misses_nothing(production_worker, make_pipeline):
    # The compose worker parks runs idle for TALLY_PARK_IDLE_SECONDS (their consumer closed); a SIGKILL of the host
    # then, and records produced while it is down, still end in the sink once each.
    worker, start_beat = production_worker
    pipeline, run = caught_up_on_a_hundred(make_pipeline)
    parked = f"{pipeline.name}: run {run.pk} parks at"
    wait_for(lambda: parked in Path(worker.log_path).read_text(errors="replace"), 60, "the idle run to park")
    start_beat()
    epoch = Pipeline.objects.get(pk=pipeline.pk).epoch
    os.kill(run.pid, signal.SIGKILL)
    produce_values(pipeline.topic, range(101, 201), 2)
    wait_for(lambda: (found := live_runs(pipeline)) and found[0].epoch > epoch, 90,
             "the supervisor to restart the pipeline")
    wait_for(lambda: caught_up(pipeline), 90, "the restarted run to catch up")
    assert sink_counts(pipeline.sink_table) == every_value_once(200)
    assert worker.poll() is None


@pytest.mark.chaos
def test_a_killed_hosts_runs_are_declared_crashed_by_their_worker_with_the_hosts_exit(production_worker,
                                                                                       make_pipeline):
    # In docker-compose.yml the supervisor runs in the `tasks` container: it cannot see the worker's pids, so only
    # the worker, which saw its host exit, can say at once that the runs it held are gone (no beat runs here).
    worker, _ = production_worker
    pipeline = make_pipeline(2)
    actions.start(pipeline.name)
    run = wait_for(lambda: (found := live_runs(pipeline)) and found[0], 60, "the run to hold its partitions")
    os.kill(run.pid, signal.SIGKILL)
    run = wait_for(lambda: (row := ConsumerRun.objects.get(pk=run.pk)).ended_at and row, 30,
                   "the worker to declare the run crashed")
    assert run.state == RunState.CRASHED
    assert f"its engine host process (pid {run.pid}) exited -9" in run.end_reason
    assert worker.poll() is None


@pytest.mark.chaos
def test_a_hung_host_is_killed_by_its_worker_and_its_pipeline_comes_back_elsewhere_with_every_record_once(
        production_worker, make_pipeline):
    # A host that stops answering (SIGSTOP here; a deadlock, a swapped-out process) must not keep its runs' tasks
    # waiting for ever, nor take the restarted runs the worker places by load: the worker kills it after a lease
    # of silence, as if it had died, and its pipelines are restarted on the hosts that answer.
    worker, start_beat = production_worker
    pipeline, run = caught_up_on_a_hundred(make_pipeline)
    start_beat()
    hung = psutil.Process(run.pid)
    hung.suspend()
    try:
        produce_values(pipeline.topic, range(101, 201), 2)
        wait_for(lambda: not hung.is_running() or hung.status() == psutil.STATUS_ZOMBIE, 60,
                 "the worker to kill its hung engine host")
    finally:
        if hung.is_running():
            hung.resume()
    wait_for(lambda: (found := live_runs(pipeline)) and found[0].pid != run.pid, 90,
             "the supervisor to restart the pipeline on another host")
    wait_for(lambda: caught_up(pipeline), 90, "the restarted run to catch up")
    assert sink_counts(pipeline.sink_table) == every_value_once(200)
    assert worker.poll() is None


@pytest.mark.chaos
def test_a_run_whose_worker_was_killed_ends_stopped_saying_its_worker_is_gone(production_worker, make_pipeline):
    # SIGKILL of the worker alone (an OOM kill picks one process): its hosts see their commands end and stop their
    # runs cleanly. The run's row must say why, not read as an operator's stop.
    worker, _ = production_worker
    pipeline = make_pipeline(2)
    actions.start(pipeline.name)
    run = wait_for(lambda: (found := live_runs(pipeline)) and found[0], 60, "the run to hold its partitions")
    worker.send_signal(signal.SIGKILL)
    run = wait_for(lambda: (row := ConsumerRun.objects.get(pk=run.pk)).ended_at and row, 30,
                   "the host to stop the run")
    assert run.state == RunState.STOPPED
    assert run.end_reason.startswith(f"stopped: its worker is gone: engine host pid {run.pid} saw its commands end")


@pytest.mark.chaos
def test_a_deploy_stops_the_runs_with_the_reason_and_a_worker_with_other_hosts_takes_them_with_every_record_once(
        production, make_pipeline):
    # `docker compose stop` sends SIGTERM to the worker's process only (its pid 1), not to its engine hosts.
    old = production.worker(TALLY_ENGINE_PROCESSES="2")
    pipelines = [make_pipeline(2), make_pipeline(2)]
    for pipeline in pipelines:
        actions.start(pipeline.name)
    runs = [wait_for(lambda p=p: (found := live_runs(p)) and found[0], 60, "the run") for p in pipelines]
    assert len({run.pid for run in runs}) == 2                     # one on each host
    hosts = engine_hosts_of(old)
    flowing = threading.Thread(target=produce_in_parallel, args=([(p.topic, 20_000) for p in pipelines],))
    flowing.start()
    wait_for(lambda: all(ConsumerRun.objects.get(pk=run.pk).records_processed > 0 for run in runs), 60,
             "both runs to write records")
    old.send_signal(signal.SIGTERM)
    assert old.wait(timeout=30) == 0
    assert all(gone(host) for host in hosts)
    for run in runs:
        run.refresh_from_db()
        assert run.state == RunState.STOPPED
        assert run.end_reason.startswith("stopped: worker shutting down"), run.end_reason

    new = production.worker(TALLY_ENGINE_PROCESSES="3")
    production.beat()
    flowing.join()
    back = [wait_for(lambda p=p: (found := live_runs(p)) and found[0], 90, "the supervisor to restart it")
            for p in pipelines]
    assert {run.pid for run in back} <= {host.pid for host in engine_hosts_of(new)}
    assert len(engine_hosts_of(new)) == 3
    assert len({run.pid for run in back}) == 2                     # spread again over the new worker's hosts
    for pipeline in pipelines:
        wait_for(lambda p=pipeline: caught_up(p), 120, f"{pipeline.name} to catch up")
        assert sink_counts(pipeline.sink_table) == every_value_once(20_000)


@pytest.mark.chaos
@pytest.mark.parametrize("hosts,to_its_group", [("1", False), ("1", True), ("0", False)],
                         ids=["sigquit-to-the-worker", "sigquit-to-its-group", "sigquit-to-a-worker-without-hosts"])
def test_a_cold_shutdown_stops_the_runs_and_exits_and_the_restarted_pipeline_writes_every_record_once(
        production, make_pipeline, hosts, to_its_group):
    # SIGQUIT to the worker (`kill -QUIT`, `docker compose kill -s SIGQUIT`), or to its process group as Ctrl-\ in its
    # terminal sends it (its hosts get it too). Celery's cold shutdown cancels every running task before it says the
    # worker is shutting down; the threads pool could not (NotImplementedError), so no run was asked to stop and the
    # worker hung with its runs going on; and a host killed by the signal crashed its runs mid-batch.
    old = production.worker(TALLY_ENGINE_PROCESSES=hosts)   # "0": the runs in the worker's own threads
    pipeline = make_pipeline(2)
    actions.start(pipeline.name)
    run = wait_for(lambda: (found := live_runs(pipeline)) and found[0], 60, "the run")
    hosts = engine_hosts_of(old)
    flowing = threading.Thread(target=produce_values, args=(pipeline.topic, range(1, 20_001), 2))
    flowing.start()
    wait_for(lambda: ConsumerRun.objects.get(pk=run.pk).records_processed > 0, 60, "the run to write records")
    (os.killpg if to_its_group else os.kill)(old.pid, signal.SIGQUIT)
    try:
        code = old.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker still runs 30 s after SIGQUIT: {Path(old.log_path).read_text()[-3000:]}") \
            from None
    assert code == 0   # Celery leaves a cold shutdown whose tasks ended at exit code 0 (WorkController.terminate)
    wait_for(lambda: all(gone(host) for host in hosts), 30, "the engine hosts to exit")
    run.refresh_from_db()
    assert run.state == RunState.STOPPED, (run.state, run.end_reason)
    assert run.end_reason == "stopped: worker shutting down (Cold)", run.end_reason

    production.worker(TALLY_ENGINE_PROCESSES="1")
    production.beat()
    flowing.join()
    wait_for(lambda: (found := live_runs(pipeline)) and found[0].pk != run.pk, 90, "the supervisor to restart it")
    wait_for(lambda: caught_up(pipeline), 120, "the restarted run to catch up")
    assert sink_counts(pipeline.sink_table) == every_value_once(20_000)


@pytest.fixture
def stuck_run(production_worker, make_pipeline, tmp_path):
    """A run of the production worker stuck for good in its transform (a call that never returns)."""
    worker, _ = production_worker
    pipeline = make_pipeline(1, "tests.hanging_transforms.hangs_on_hang")
    actions.start(pipeline.name)
    run = wait_for(lambda: (found := live_runs(pipeline)) and found[0], 60, "the run to hold its partition")
    marker = tmp_path / "inside-the-transform"
    send(pipeline.topic, [(0, None, f"hang:{marker}".encode())])
    wait_for(marker.exists, 60, "the run to be stuck in its transform")
    return worker, run


def ended_as_crashed_because_it_did_not_stop(run) -> bool:
    run.refresh_from_db()
    return run.state == RunState.CRASHED and "did not stop" in run.end_reason


@pytest.mark.chaos
def test_a_host_whose_worker_was_killed_does_not_outlive_it_for_a_run_stuck_in_its_transform(stuck_run):
    # The stuck run's host would otherwise live on for good, orphaned, heartbeating the run: its pipeline would
    # never be restarted, and nothing would show the process.
    worker, run = stuck_run
    hosts = engine_hosts_of(worker)
    worker.send_signal(signal.SIGKILL)
    wait_for(lambda: all(gone(host) for host in hosts), 30, "the engine hosts of the killed worker to exit")
    assert ended_as_crashed_because_it_did_not_stop(run), (run.state, run.end_reason)


@pytest.mark.chaos
def test_a_warm_shutdown_ends_with_a_run_stuck_in_its_transform(stuck_run):
    worker, run = stuck_run
    hosts = engine_hosts_of(worker)
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=30)
    assert all(gone(host) for host in hosts)
    assert ended_as_crashed_because_it_did_not_stop(run), (run.state, run.end_reason)


IDLE_TRANSACTION_S, STALL_S = 2, 5


@pytest.mark.chaos
def test_a_run_stuck_in_its_transform_while_its_host_lives_is_declared_crashed_and_its_pipeline_restarted(
        production, make_pipeline, tmp_path):
    # The host lives on and its beat heartbeated every run it holds, the stuck one too: its lease never lapsed and
    # the supervisor never restarted the pipeline. A run whose poll loop has not turned for TALLY_RUN_STALL_SECONDS
    # is declared crashed with the reason; the restarted run, at a new epoch, reads the record again and goes on.
    worker = production.worker(TALLY_ENGINE_PROCESSES="1", TALLY_RUN_STALL_SECONDS=str(STALL_S),
                               TALLY_ENGINE_IDLE_TRANSACTION_SECONDS=str(IDLE_TRANSACTION_S))
    production.beat()
    pipeline = make_pipeline(1, "tests.hanging_transforms.hangs_once")
    actions.start(pipeline.name)
    run = wait_for(lambda: (found := live_runs(pipeline)) and found[0], 60, "the run to hold its partition")
    produce_values(pipeline.topic, range(1, 51))
    marker = tmp_path / "inside-the-transform"
    send(pipeline.topic, [(0, None, f"hang-once:{marker}:51".encode())])
    produce_values(pipeline.topic, range(52, 101))
    wait_for(marker.exists, 60, "the run to be stuck in its transform")

    run = wait_for(lambda: (row := ConsumerRun.objects.get(pk=run.pk)).ended_at and row, 60,
                   "the stuck run to be declared crashed")
    assert run.state == RunState.CRASHED
    assert run.end_reason.startswith(f"no progress for {STALL_S} s"), run.end_reason
    back = wait_for(lambda: (found := live_runs(pipeline)) and found[0], 90, "the supervisor to restart it")
    assert back.epoch > run.epoch
    wait_for(lambda: caught_up(pipeline), 90, "the restarted run to catch up")
    assert sink_counts(pipeline.sink_table) == every_value_once(100)
    assert worker.poll() is None


@pytest.mark.chaos
@pytest.mark.parametrize("hosts", ["1", "0"], ids=["in-an-engine-host", "in-the-worker"])
def test_revoking_a_run_task_with_terminate_stops_its_run_cleanly_and_the_supervisor_runs_the_pipeline_again(
        production, make_pipeline, celery_app_for_tests, hosts):
    """`celery control revoke --terminate TASK_ID` on a run task did nothing (a thread cannot be ended): the worker
    marked the task revoked while its run went on. Now the run is asked to stop after its batch; the pipeline still
    wants to run, so the supervisor starts another run, and every record is written once."""
    worker = production.worker(TALLY_ENGINE_PROCESSES=hosts)
    production.beat()
    pipeline = make_pipeline(2)
    actions.start(pipeline.name)
    run = wait_for(lambda: (found := live_runs(pipeline)) and found[0], 60, "the run")
    flowing = threading.Thread(target=produce_values, args=(pipeline.topic, range(1, 20_001), 2))
    flowing.start()
    wait_for(lambda: ConsumerRun.objects.get(pk=run.pk).records_processed > 0, 60, "the run to write records")

    celery_app_for_tests.control.revoke(run.task_id, terminate=True)

    wait_for(lambda: ConsumerRun.objects.get(pk=run.pk).state != RunState.RUNNING, 60, "the revoked run to end")
    run.refresh_from_db()
    assert (run.state, run.end_reason) == (RunState.STOPPED, "stopped: revoked (celery control revoke --terminate)")
    assert worker.poll() is None   # the worker goes on
    wait_for(lambda: (found := live_runs(pipeline)) and found[0].pk != run.pk, 90, "the supervisor to run it again")
    flowing.join()
    wait_for(lambda: caught_up(pipeline), 120, "the new run to catch up")
    assert sink_counts(pipeline.sink_table) == every_value_once(20_000)
