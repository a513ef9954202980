"""Smoke tests against the real parts: broker, Celery + Redis, PostgreSQL, the web app."""
import os
import subprocess
import sys
import time

import pytest
from django.core.management import call_command
from django.db import connection
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from tests.conftest import ROOT


@pytest.mark.kafka
def test_a_record_produced_to_the_broker_is_consumed_back(kafka_bootstrap, make_topic):
    topic = make_topic("smoke")
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    producer.send(topic, key=b"k", value=b"hello tally").get(timeout=10)
    producer.close()

    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=10000)
    consumer.assign([TopicPartition(topic, 0)])
    record = next(iter(consumer))
    consumer.close()
    assert (record.key, record.value, record.offset) == (b"k", b"hello tally", 0)


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_a_real_celery_worker_runs_a_task_and_returns_its_result(celery_worker):
    from dashboard.tasks import ping_task

    result = ping_task.delay("round-trip")
    assert result.get(timeout=30) == {"pong": "round-trip"}


@pytest.mark.django_db
def test_migrations_are_applied_to_postgresql_and_complete():
    assert connection.vendor == "postgresql"
    tables = set(connection.introspection.table_names())
    assert {"consumers_pipeline", "consumers_partitionoffset", "consumers_batchledger",
            "consumers_deadletter", "consumers_consumerrun"} <= tables
    # No model change is missing a migration.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db
def test_the_login_page_renders(client):
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert b"Log in to Tally" in response.content


@pytest.mark.django_db
def test_an_anonymous_request_to_the_dashboard_is_redirected_to_login(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize("name,value", [
    ("DATABASE_URL", "mysql://root@localhost/tally"),
    ("REDIS_URL", "http://127.0.0.1:6379"),
    ("KAFKA_BOOTSTRAP_SERVERS", "no-port-here"),
    ("DEBUG", "maybe"),
    ("KAFKA_SESSION_TIMEOUT_MS", "soon"),
    ("KAFKA_SESSION_TIMEOUT_MS", "2000"),  # below real Kafka's group.min.session.timeout.ms
])
def test_a_bad_environment_value_fails_at_start_up_naming_the_variable(name, value):
    env = dict(os.environ, **{name: value})
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"Environment variable {name}=" in result.stderr


@pytest.mark.kafka
def test_kafka_broker_command_refuses_a_port_that_is_taken(kafka_bootstrap):
    port = kafka_bootstrap.rsplit(":", 1)[1]
    result = subprocess.run([sys.executable, "manage.py", "kafka_broker", "--port", port], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"Port {port} on 127.0.0.1 is already in use" in result.stderr


@pytest.mark.kafka
def test_kafka_broker_command_serves_until_terminated():
    from consumers.kafka.broker import free_port, is_reachable

    port = free_port()
    process = subprocess.Popen([sys.executable, "manage.py", "kafka_broker", "--port", str(port)], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not is_reachable(f"127.0.0.1:{port}", timeout=0.2):
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        process.terminate()
        process.wait(timeout=15)
    assert not is_reachable(f"127.0.0.1:{port}", timeout=0.2)
