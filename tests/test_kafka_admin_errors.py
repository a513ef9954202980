"""Admin calls the broker refuses (e.g. IncompatibleBrokerVersion: the request is not implemented) give a
clear message -- exit code 1 on the CLI, a 503 with the reason from the API -- never a traceback or a
500; delete_groups returns its errors; seed_demo --reset changes nothing when the broker refuses."""
import contextlib

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from kafka.errors import IncompatibleBrokerVersion

from consumers.demo import classic as demo
from consumers.engine import sinks
from consumers.engine.transforms import resolve
from consumers.kafka import admin as kafka_admin
from consumers.models import Pipeline
from tests.views_helpers import make_viewer


class RefusingAdmin:
    def __getattr__(self, name):
        def refuse(*args, **kwargs):
            raise IncompatibleBrokerVersion(f"Kafka broker does not support the '{name}' Kafka protocol.")
        return refuse


@pytest.fixture
def refusing_broker(monkeypatch):
    @contextlib.contextmanager
    def session():
        yield RefusingAdmin()

    monkeypatch.setattr(kafka_admin, "admin_session", session)


def test_groups_list_says_the_broker_refused_and_exits_1(db, refusing_broker):
    with pytest.raises(CommandError) as failed:
        call_command("groups", "list")
    assert failed.value.returncode == 1
    assert "Kafka could not list consumer groups: IncompatibleBrokerVersion" in str(failed.value)


def test_the_groups_api_answers_503_with_the_reason(db, refusing_broker, client):
    client.force_login(make_viewer())
    response = client.get("/api/groups/")
    assert response.status_code == 503
    assert "Kafka could not list consumer groups: IncompatibleBrokerVersion" in response.json()["error"]


def test_delete_groups_returns_the_error_of_each_group_instead_of_raising(refusing_broker):
    result = kafka_admin.delete_groups(["a", "b"])
    assert set(result) == {"a", "b"}
    expected = "Kafka could not delete consumer groups: IncompatibleBrokerVersion"
    assert all(error.startswith(expected) for error in result.values())


def test_a_refused_seed_demo_reset_leaves_the_demo_pipelines_and_sinks_as_they_were(transactional_db,
                                                                                    refusing_broker):
    first = demo.DEMO_PIPELINES[0]
    Pipeline.objects.create(name=first.name, topic=demo.DEMO_TOPIC, sink_table=first.sink_table,
                            delivery_mode=first.delivery_mode)
    with connection.cursor() as cur:
        sinks.ensure_sink_table(cur, first.sink_table, resolve("int_value"), False)
    try:
        with pytest.raises(demo.DemoError, match="nothing was reset"):
            demo.seed_demo(reset=True)
        assert Pipeline.objects.filter(name=first.name).exists()
        with connection.cursor() as cur:
            cur.execute("SELECT to_regclass(%s) IS NOT NULL", [first.sink_table])
            assert cur.fetchone()[0]
    finally:
        with connection.cursor() as cur:
            sinks.drop_sink_table(cur, first.sink_table)
