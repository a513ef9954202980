"""Shared fixtures: the real broker, a real Celery worker, and the environment for subprocesses.

Integration tests talk to the real PostgreSQL and Redis of the machine, and start their own broker on a
free port. Parallel runs on one machine stay apart through TEST_DATABASE_NAME and TEST_REDIS_URL.
"""
import os
import subprocess
import sys
import time
import uuid
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest import mock

import pytest
import time_machine
from django.conf import settings

from consumers.engine import db as engine_db
from consumers.kafka import broker, clusters
from tests.kafka_down import kafka_went_down  # noqa: F401 (fixture: Kafka down since its check passed)
from tests.kafka_forwarders import pki, secure_broker  # noqa: F401 (fixtures: TLS + SASL in front of a broker)
from tests.spark_cluster import on_spark_cluster, spark_cluster  # noqa: F401 (fixtures: a standalone cluster)
from tests.waiting import patience
from tests.watch_helpers import table_name  # noqa: F401 (fixture: a team's table name, dropped after)

ROOT = Path(__file__).resolve().parent.parent


def test_redis_url() -> str:
    """TEST_REDIS_URL (Redis database 15 by default). Under pytest-xdist each worker takes the database below
    the previous one (gw0: 15, gw1: 14, ...): a Celery worker started by one xdist worker must never take
    another's tasks or answer its pings."""
    base = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker:
        return base
    prefix, _, number = base.rpartition("/")
    return f"{prefix}/{(int(number or 0) - int(worker.removeprefix('gw'))) % 16}"


TEST_REDIS_URL = test_redis_url()

# A test that uses one of these fixtures needs that service, whatever markers it declares: `make test-fast`
# deselects the markers, so a missing marker cannot smuggle a broker or a worker into the fast lane.
SERVICE_FIXTURES = {"kafka_bootstrap": "kafka", "celery_worker": "celery", "page": "browser", "browser": "browser"}


def spark_group(item) -> str:
    """`make test` runs pytest-xdist with --dist loadgroup: the Spark tests run on three xdist workers, one for
    local masters in the test process, one for the standalone cluster and one for the tests whose engines are
    processes of their own. So the suite starts one in-process JVM per group, not one per test or per worker on
    a 2-core machine, and no group waits for another. As one group, the local tests took 16 of the suite's
    17 minutes, 7 of them in tests that need no JVM in the test process (the driver-killing chaos test, the
    stop-signal tests and the Celery topic check)."""
    if "spark_cluster" in item.fixturenames or "on_spark_cluster" in item.fixturenames:
        return "spark-cluster"
    return "spark-processes" if item.get_closest_marker("spark_processes") else "spark"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, marker in SERVICE_FIXTURES.items():
            if fixture in item.fixturenames:
                item.add_marker(marker)
        if item.get_closest_marker("spark"):
            item.add_marker(pytest.mark.xdist_group(spark_group(item)))


# Modules that build many tests while being collected, by the marker their module's pytestmark gives every test:
# schemathesis turns the API schema into about a hundred cases (3 s here). A run whose -m deselects that marker
# (`make test-fast`) does not collect them only to throw them away. tests/test_markers.py checks each entry.
COSTLY_TO_COLLECT = {"test_api_fuzz.py": "kafka"}


def pytest_ignore_collect(collection_path, config):
    marker = COSTLY_TO_COLLECT.get(collection_path.name)
    if marker is None or not config.option.markexpr:
        return None
    from _pytest.mark.expression import Expression  # how pytest itself reads -m

    return not Expression.compile(config.option.markexpr).evaluate(lambda name, **kwargs: name == marker) or None


def clock_shift() -> timedelta:
    """TALLY_TEST_CLOCK_SHIFT_DAYS=365 (or -365) runs the suite with the clock moved: no test may depend on
    today's date (README, "Testing")."""
    raw = os.environ.get("TALLY_TEST_CLOCK_SHIFT_DAYS", "").strip()
    return timedelta(days=int(raw)) if raw else timedelta(0)


def pytest_configure(config):
    shift = clock_shift()
    if shift:
        # Started before collection, so module-level times move too; tick=True: the moved clock keeps
        # running, so deadlines and heartbeats behave as on any other day.
        config._tally_clock = time_machine.travel(datetime.now(UTC) + shift, tick=True)
        config._tally_clock.start()


def pytest_unconfigure(config):
    if getattr(config, "_tally_clock", None):
        config._tally_clock.stop()


# Django's docs advise a fast hasher in tests: the default PBKDF2 takes about 0.6 s per hash here, and every
# view test makes users and logs them in. Production keeps Django's default (tally/settings.py).
# PBKDF2 stays second, so hashes made by a child process (the dev stack test) still verify.
FAST_PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.MD5PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]


# Rows that migrations and their post_migrate handlers write once, the same in every test: content types and
# the permissions on them. The flush keeps them, so it need not write them again after every test.
KEPT_BY_THE_FLUSH = ("django_content_type", "auth_permission")


@pytest.fixture(scope="session", autouse=True)
def flush_by_delete():
    """A transactional test's teardown empties every table (Django's flush). PostgreSQL's TRUNCATE of our 37
    tables takes about 0.35 s here, a DELETE of their few rows about 0.01 s, and the suite has hundreds of such
    tests. The tables are locked first, as TRUNCATE locks them: a worker still writing waits until they are empty
    instead of adding a row that points at a deleted one. Django's foreign keys are deferred, so the DELETEs need
    no order; sequences are not reset either way (TransactionTestCase's reset_sequences is off).

    Content types and permissions stay (KEPT_BY_THE_FLUSH), so the post_migrate handlers that would write them
    again after each flush (about 0.05 s of queries) are not sent."""
    from django.core.management.commands import flush
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        names = [self.quote_name(table) for table in tables if table not in KEPT_BY_THE_FLUSH]  # Django's quoting
        if not names:
            return []
        return [f"LOCK TABLE {', '.join(names)} IN ACCESS EXCLUSIVE MODE;", *(f"DELETE FROM {name};" for name in names)]

    with (mock.patch.object(DatabaseOperations, "sql_flush", sql_flush),
          mock.patch.object(flush, "emit_post_migrate_signal", lambda *args, **kwargs: None)):
        yield


@pytest.fixture(scope="session", autouse=True)
def fast_password_hasher():
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=FAST_PASSWORD_HASHERS):  # sends setting_changed: the cache clears
        yield


@pytest.fixture(autouse=True)
def browser_patience(request):
    """Playwright's assertions (`expect`) wait 5 s by default, apart from the pages' own action timeout: the same
    hang guard as every other wait here, scaled for a loaded machine (a rewind's answer once took longer than 5 s)."""
    if request.node.get_closest_marker("browser"):
        from playwright.sync_api import expect

        expect.set_options(timeout=patience(15) * 1000)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker, django_db_keepdb, flush_by_delete):
    """pytest-django's test database, and before it is dropped, a warning naming every connection still open
    to it (its application name, state and last query): whatever a test left running holds one, and the
    database then cannot be dropped.

    A database kept from an earlier run (`--reuse-db`, as `make test-fast` runs) is emptied first: a run stopped
    in the middle of a transactional test leaves that test's rows behind."""
    if django_db_keepdb:
        from django.core.management import call_command

        with django_db_blocker.unblock():
            call_command("flush", interactive=False, verbosity=0, reset_sequences=False)
    yield
    with django_db_blocker.unblock():
        release_engine_connections()
        left = leftover_connections()
    if left:
        warnings.warn(f"Connections still open to the test database at the end of the session: {left}",
                      stacklevel=1)


def release_engine_connections() -> None:
    """The connections runs in this process shared (their beat's, the engine pool's) outlive the runs."""
    from consumers.engine import beat, db

    process_beat = beat.existing()
    if process_beat is not None:
        process_beat.wait_idle(timeout=30)
    db.close_pool()


def leftover_connections(keep=lambda row: True, settle_s: float = 5.0) -> list[tuple]:
    """Every connection to the test database but this one that `keep` selects: (application name, state,
    backend start, last query). A client that just closed its connection still shows for a moment, until its
    server process exits, so this reads again until none is left or `settle_s` has passed."""
    from django.db import connection

    deadline = time.monotonic() + settle_s
    while True:
        with connection.cursor() as cursor:
            cursor.execute("SELECT application_name, state, backend_start, left(query, 200) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
            rows = [row for row in cursor.fetchall() if keep(row)]
        if not rows or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    connection.close()   # pytest-django's teardown drops the database from another connection
    return rows


@pytest.fixture(scope="session")
def kafka_bootstrap():
    """A fresh embedded broker on a free port for this test session; settings point at it."""
    port = broker.free_port()
    log = open(ROOT / "var" / f"test-broker-{port}.log", "wb") if (ROOT / "var").is_dir() else None
    process = broker.start_broker(port, log_file=log)
    bootstrap = f"127.0.0.1:{port}"
    previous = settings.KAFKA_BOOTSTRAP_SERVERS
    settings.KAFKA_BOOTSTRAP_SERVERS = bootstrap
    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = bootstrap
    yield bootstrap
    settings.KAFKA_BOOTSTRAP_SERVERS = previous
    clusters.close_shared_admins()   # before the broker goes: they would keep reconnecting to it
    broker.stop_broker(process)
    if log is not None:
        log.close()


@pytest.fixture
def make_topic(kafka_bootstrap):
    """Create a uniquely named topic: make_topic("nums", partitions=3) -> "nums-1a2b3c"; `configs` are the topic's
    settings (make_topic("c", configs={"cleanup.policy": "compact"}))."""
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)

    def create(prefix="t", partitions=1, configs: dict | None = None):
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs or {})])
        return name

    yield create
    admin.close()


KAFKA_CLIENTS = ["kafka-python", "librdkafka"]


@pytest.fixture(params=KAFKA_CLIENTS)
def kafka_client(request, monkeypatch):
    """The engine's test matrix runs against both Kafka clients (consumers/engine/consumer.py): the worker's
    default client (TALLY_KAFKA_CLIENT) is set here and in `subprocess_env`, so engines started in this process
    and in child processes read with it."""
    if request.param == "librdkafka":
        pytest.importorskip("confluent_kafka", reason="the librdkafka client is the extra tally[rdkafka]")
    monkeypatch.setattr(settings, "TALLY_KAFKA_CLIENT", request.param)
    monkeypatch.setenv("TALLY_KAFKA_CLIENT", request.param)
    return request.param


@pytest.fixture
def subprocess_env(db, request):
    """Environment for child processes (engines, workers) so they use this test's database and broker."""
    if "kafka_client" in request.fixturenames:
        request.getfixturevalue("kafka_client")   # set first: its client reaches the children too
    env = dict(os.environ)
    env["TALLY_KAFKA_CLIENT"] = settings.TALLY_KAFKA_CLIENT
    env["DATABASE_URL"] = engine_db.database_url()
    env["REDIS_URL"] = TEST_REDIS_URL
    env["KAFKA_BOOTSTRAP_SERVERS"] = settings.KAFKA_BOOTSTRAP_SERVERS
    env["DJANGO_SETTINGS_MODULE"] = "tally.settings"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def celery_app_for_tests():
    """The project's Celery app pointed at the test Redis database."""
    from tally.celery import app

    old = (app.conf.broker_url, app.conf.result_backend)
    app.conf.broker_url = TEST_REDIS_URL
    app.conf.result_backend = TEST_REDIS_URL
    drop_broker_connections(app)  # a pool made for another URL (an earlier test's) would outlive the new setting
    yield app
    app.conf.broker_url, app.conf.result_backend = old
    drop_broker_connections(app)


def drop_broker_connections(app) -> None:
    """Forget the Celery app's broker connections, so the next use connects to the current broker_url
    (the producer pool keeps its own reference to the connection pool: it goes too). The old pool is not
    closed: whatever still holds it keeps working until it is collected."""
    app._pool = None
    app.amqp._producer_pool = None
    app.control.mailbox.__dict__.pop("producer_pool", None)  # the control mailbox caches it as well


def start_celery_worker(env, *extra_args, log_name="celery-worker"):
    """Start a real Celery worker process (threads pool) and wait until it answers a ping."""
    (ROOT / "var").mkdir(exist_ok=True)
    log = open(ROOT / "var" / f"{log_name}-{uuid.uuid4().hex[:6]}.log", "wb")
    command = [sys.executable, "-m", "celery", "-A", "tally", "worker", "--pool", "threads",
               "--concurrency", "8", "--loglevel", "INFO", "--without-mingle", "--without-gossip",
               "-n", f"test-{uuid.uuid4().hex[:6]}@%h", *extra_args]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    process.log_path = log.name
    return process


def stop_process_group(process, timeout=10):
    """SIGTERM the group of `process` (each test process starts in a session of its own), then SIGKILL what is
    left after `timeout` s. The group is signalled even when its leader has already exited: a PySpark driver
    killed on its own leaves its JVM running, which would hold the next driver's cluster cores and CPU."""
    import signal

    _signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _group_members(process) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _group_members(process):
        _signal_group(process.pid, signal.SIGKILL)
        while _group_members(process):
            time.sleep(0.05)
    process.wait()


def gone(process) -> bool:
    """Whether a psutil.Process has exited (a zombie waiting for its parent counts as exited)."""
    import psutil

    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _signal_group(group: int, signum) -> None:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        pass


def _group_members(process) -> list:
    """The group's processes that have not exited (the leader is reaped first, so it is not counted as one)."""
    import psutil

    process.poll()
    members = []
    for member in psutil.process_iter(["status"]):
        try:
            if os.getpgid(member.pid) == process.pid and member.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(member)
        except (ProcessLookupError, psutil.Error):
            continue  # exited meanwhile
    return members


@pytest.fixture
def celery_worker(subprocess_env, celery_app_for_tests):
    """A real Celery worker against the real Redis (test database 15 by default) and this test's DB."""
    process = start_celery_worker(subprocess_env)
    deadline = time.monotonic() + patience(60)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Celery worker exited: {Path(process.log_path).read_text()[-2000:]}")
        replies = celery_app_for_tests.control.ping(timeout=0.5)
        if replies:
            break
    else:
        stop_process_group(process)
        raise RuntimeError("Celery worker did not answer a ping within 60 s")
    yield process
    stop_process_group(process)


def screenshot_dir() -> Path:
    """Where browser tests save screenshots: docs/screenshots/ when TALLY_UPDATE_SCREENSHOTS=1 (`make
    screenshots`), otherwise var/screenshots/, so that a test run leaves the docs untouched."""
    folder = ROOT / ("docs/screenshots" if os.environ.get("TALLY_UPDATE_SCREENSHOTS") == "1" else "var/screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def drop_sink_tables(tables) -> None:
    """Sink tables are not Django tables: transactional tests must drop the ones they create."""
    from consumers.engine import db, sinks

    conn = db.connect("tally-tests")
    try:
        with conn.cursor() as cursor:
            for table in tables:
                sinks.drop_sink_table(cursor, table)
        conn.commit()
    finally:
        conn.close()


@pytest.fixture
def table():
    """A new, unique name for a sink table the test has Tally create; the table is dropped at the end. (A module
    whose tests need a table of their own columns defines its own `table`.)"""
    name = f"sink_{uuid.uuid4().hex[:8]}"
    yield name
    drop_sink_tables([name])


@pytest.fixture
def orders_table(transactional_db):
    """An empty table of order ids (and a note) for the topic check, under a name of its own; dropped afterwards."""
    from django.db import connection
    from psycopg2 import sql

    name = f"orders_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (order_id bigint, note text)").format(sql.Identifier(name)))
    yield name
    drop_sink_tables([name])


@pytest.fixture
def demo(transactional_db, kafka_bootstrap, settings):
    """The demo pipelines on the test broker, with real Kafka's minimum session timeout (a killed member
    holds its partitions until its session expires); their sink tables are dropped afterwards."""
    from consumers.demo.classic import DEMO_PIPELINES

    settings.KAFKA_SESSION_TIMEOUT_MS = 6000
    yield
    drop_sink_tables(demo.sink_table for demo in DEMO_PIPELINES)


@pytest.fixture
def redis_state(settings):
    """A client of the test Redis, where the demo's runs then keep their state; no run's state or lock is left
    there before the test or after it."""
    from consumers.demo import runs as demo_runs

    settings.REDIS_URL = TEST_REDIS_URL
    client = demo_runs._redis()
    client.delete(demo_runs.STATE_KEY, demo_runs.LOCK_KEY)
    yield client
    client.delete(demo_runs.STATE_KEY, demo_runs.LOCK_KEY)


@pytest.fixture
def viewer_client(db):
    """A test client signed in as a viewer (read-only role), for pages and the API."""
    from tests.views_helpers import client_of, make_viewer

    return client_of(make_viewer())


@pytest.fixture
def operator_client(db):
    """A test client signed in as an operator (may act), for pages and the API."""
    from tests.views_helpers import client_of, make_operator

    return client_of(make_operator())


@pytest.fixture
def receiver():
    """A local HTTP receiver for alert channels (tests/receivers.py), answering 200 until told otherwise."""
    from tests.receivers import Receiver

    receiver = Receiver().start()
    yield receiver
    receiver.stop()
