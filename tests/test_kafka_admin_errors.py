"""Admin calls the broker refuses (e.g. IncompatibleBrokerVersion: the request is not implemented) give a
clear message -- exit code 1 on the CLI, a 503 with the reason from the API -- never a traceback or a
500; delete_groups returns its errors; seed_demo --reset changes nothing when the broker refuses."""
import contextlib
import html
import json
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from kafka.errors import IncompatibleBrokerVersion, TopicDeletionDisabledError

from consumers.demo import classic as demo
from consumers.engine import sinks
from consumers.engine.transforms import resolve
from consumers.kafka import admin as kafka_admin
from consumers.kafka.broker import free_port
from consumers.models import ActionLog, Pipeline
from tests.kafka_down import kafka_refusal
from tests.views_helpers import make_operator, make_viewer


class RefusingAdmin:
    def __getattr__(self, name):
        def refuse(*args, **kwargs):
            raise IncompatibleBrokerVersion(f"Kafka broker does not support the '{name}' Kafka protocol.")
        return refuse


@pytest.fixture
def refusing_broker(monkeypatch):
    @contextlib.contextmanager
    def session(cluster=None):
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


@pytest.fixture
def no_broker(settings):
    """Nothing listens at the bootstrap address (Kafka down, or a wrong KAFKA_BOOTSTRAP_SERVERS)."""
    settings.KAFKA_BOOTSTRAP_SERVERS = f"127.0.0.1:{free_port()}"
    return settings.KAFKA_BOOTSTRAP_SERVERS


def test_with_no_broker_listening_groups_list_and_describe_say_so_and_exit_1(db, no_broker):
    with pytest.raises(CommandError) as failed:
        call_command("groups", "list")
    assert failed.value.returncode == 1
    assert str(failed.value) == (f"Kafka could not list consumer groups: Kafka cluster 'default': unreachable (connect "
                                 f"failed): no broker accepts connections at {no_broker}: Connection refused "
                                 "(is Kafka running? see KAFKA_BOOTSTRAP_SERVERS)")
    with pytest.raises(CommandError) as failed:
        call_command("groups", "describe", "billing")
    assert failed.value.returncode == 1
    assert (f"ClusterUnavailable: Kafka cluster 'default': unreachable (connect failed): no broker accepts "
            f"connections at {no_broker}") in str(failed.value)


def test_with_no_broker_listening_the_groups_api_answers_503_with_the_reason(db, no_broker, client):
    client.force_login(make_viewer())
    response = client.get("/api/groups/")
    assert response.status_code == 503
    assert response.json()["error"] == (f"Kafka could not list consumer groups: Kafka cluster 'default': unreachable "
                                         f"(connect failed): no broker accepts connections at {no_broker}: Connection "
                                         "refused (is Kafka running? see KAFKA_BOOTSTRAP_SERVERS)")
    assert kafka_admin.delete_groups(["a"])["a"].startswith("Kafka could not delete consumer groups: Kafka cluster")


def htmx_swaps(page: str, status: int) -> bool:
    """Whether the page's htmx-config swaps a response of this status into its target (htmx takes the first
    rule whose code, a regular expression, matches the status); one it does not swap shows the user nothing."""
    config = json.loads(html.unescape(re.search(r'name="htmx-config" content=\'([^\']*)\'', page).group(1)))
    return next(rule for rule in config["responseHandling"] if re.search(rule["code"], str(status)))["swap"]


def test_with_no_broker_listening_a_group_reset_from_its_page_says_so_in_the_panel_and_is_audited(
        db, no_broker, client):
    client.force_login(make_operator())
    unreachable = (f"Kafka: Kafka cluster 'default': unreachable (connect failed): no broker accepts connections "
                   f"at {no_broker}: Connection refused")
    for step in ("preview", "execute"):
        response = client.post("/groups/billing/reset/", {"topic": "billing-topic", "mode": "to-earliest",
                                                           "step": step}, HTTP_HX_REQUEST="true")
        panel = html.unescape(response.content.decode())
        assert response.status_code == 503
        assert htmx_swaps(client.get("/groups/").content.decode(), response.status_code)
        assert panel.lstrip().startswith('<div id="rewind-panel">')
        assert unreachable in panel and "nothing was changed" in panel
    entries = ActionLog.objects.order_by("pk")
    assert [(e.group_id, e.action, e.actor, e.result, e.dry_run) for e in entries] == [
        ("billing", "reset_group", "otto", "refused", True), ("billing", "reset_group", "otto", "refused", False)]
    assert all(e.message.startswith(unreachable) and e.message.endswith("nothing was changed") for e in entries)


def test_a_group_reset_from_its_page_after_kafka_went_down_since_its_check_passed_answers_503_and_is_audited(
        db, kafka_went_down, client):
    client.force_login(make_operator())
    response = client.post("/groups/billing/reset/", {"topic": "billing-topic", "mode": "to-earliest",
                                                       "step": "execute"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 503
    entry = ActionLog.objects.get()
    assert (entry.group_id, entry.action, entry.result, entry.dry_run) == ("billing", "reset_group", "refused", False)
    assert kafka_refusal(entry.message)
    assert entry.message in html.unescape(response.content.decode())


@pytest.mark.kafka
def test_a_group_reset_the_broker_refuses_answers_503_and_changes_nothing(transactional_db, make_topic,
                                                                         refusing_broker):
    client = Client()
    client.force_login(make_operator())
    response = client.post("/api/groups/billing/reset", {"topic": make_topic("reset"), "mode": "to-earliest",
                                                          "execute": True}, content_type="application/json")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error.startswith("Kafka: [Error 35] IncompatibleBrokerVersion: Kafka broker does not support the")
    assert error.endswith("; nothing was changed")
    entry = ActionLog.objects.get(pk=response.json()["action_id"])  # audited as the other refused resets
    assert (entry.group_id, entry.action, entry.result, entry.message) == ("billing", "reset_group", "refused", error)


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


class NoTopicDeletion:
    """A broker with topic deletion disabled (real Kafka's delete.topic.enable=false): the rest works."""

    def __init__(self):
        self.calls = []

    def list_topics(self):
        return [demo.DEMO_TOPIC]

    def delete_topics(self, topics, **kwargs):
        self.calls.append("delete_topics")
        raise TopicDeletionDisabledError("topic deletion is disabled")

    def delete_groups(self, groups):
        self.calls.append("delete_groups")
        return {group: "OK" for group in groups}


def test_a_reset_refused_for_the_topic_leaves_the_consumer_groups_alone(transactional_db, monkeypatch):
    # The classic pipelines resume from their groups' offsets: deleting the groups of a reset that then
    # stops would have them read the kept topic again from its start, into the kept sinks.
    broker = NoTopicDeletion()

    @contextlib.contextmanager
    def session(cluster=None):
        yield broker

    monkeypatch.setattr(kafka_admin, "admin_session", session)
    first = demo.DEMO_PIPELINES[0]
    Pipeline.objects.create(name=first.name, topic=demo.DEMO_TOPIC, sink_table=first.sink_table,
                            delivery_mode=first.delivery_mode)
    with pytest.raises(demo.DemoError, match="TopicDeletionDisabledError.*nothing was reset"):
        demo.seed_demo(reset=True)
    assert broker.calls == ["delete_topics"]
    assert Pipeline.objects.get(name=first.name).epoch == 0
