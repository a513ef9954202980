"""The dashboard's door to adding a pipeline: the same checks and messages as the command line, shown
beside their field; viewers are refused; nothing is created when the form is refused."""

import pytest

from consumers.models import ActionLog, Pipeline
from tests.views_helpers import make_viewer

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def form(topic, table, **overrides):
    return {"name": "orders", "topic": topic, "sink_table": table, "mode": "exactly-once", "transform": "int_value",
            "group": "", "engine": "python", "isolation_level": "read_committed", "on_log_truncated": "stop",
            **overrides}


def test_an_operator_adds_a_pipeline_and_lands_on_its_page(operator_client, make_topic, table):
    topic = make_topic("form")
    assert operator_client.get("/pipelines/new/").status_code == 200
    response = operator_client.post("/pipelines/new/", form(topic, table, create_table="on"))
    assert response.status_code == 302 and response["Location"] == "/pipelines/orders/"
    pipeline = Pipeline.objects.get(name="orders")
    assert (pipeline.topic, pipeline.sink_table, pipeline.group_id) == (topic, table, "orders")
    assert ActionLog.objects.get(action="create").actor == "otto"
    assert "Created pipeline orders" in operator_client.get("/pipelines/orders/").content.decode()


def test_the_form_shows_the_same_refusals_as_the_command_line(operator_client, make_topic, table):
    topic = make_topic("form")
    response = operator_client.post("/pipelines/new/", form("absent-topic", table, transform="no.such"))
    html = response.content.decode()
    assert response.status_code == 400
    assert 'id="error-transform"' in html and "Cannot import transform" in html
    assert "does not exist in Kafka" not in html  # Kafka is asked last, about an otherwise valid form only
    response = operator_client.post("/pipelines/new/", form("absent-topic", table, create_table="on"))
    assert response.status_code == 400
    assert "topic &#x27;absent-topic&#x27; does not exist in Kafka: create it first" in response.content.decode()
    response = operator_client.post("/pipelines/new/", form(topic, table))
    html = response.content.decode()
    assert response.status_code == 400 and 'id="error-sink_table"' in html and "CREATE TABLE" in html
    response = operator_client.post("/pipelines/new/", form(topic, table, name="new", create_table="on"))
    assert response.status_code == 400 and "is reserved" in response.content.decode()
    assert not Pipeline.objects.exists()


def test_an_operator_chooses_the_isolation_level_and_the_truncation_policy(operator_client, make_topic, table):
    page = operator_client.get("/pipelines/new/").content.decode()
    assert '<option value="read_committed" selected>' in page and '<option value="stop" selected>' in page
    chosen = form(make_topic("form"), table, create_table="on", isolation_level="read_uncommitted",
                  on_log_truncated="skip")
    response = operator_client.post("/pipelines/new/", chosen)
    assert response.status_code == 302
    pipeline = Pipeline.objects.get(name="orders")
    assert (pipeline.isolation_level, pipeline.on_log_truncated) == ("read_uncommitted", "skip")
    page = operator_client.get("/pipelines/orders/").content.decode()
    assert '<b id="isolation-level">read uncommitted</b>' in page and ">skip</b>" in page


def test_an_unknown_isolation_level_or_policy_and_spark_reading_uncommitted_are_refused(operator_client, make_topic,
                                                                                        table):
    topic = make_topic("form")
    response = operator_client.post("/pipelines/new/", form(topic, table, create_table="on",
                                                            isolation_level="dirty", on_log_truncated="ignore"))
    html = response.content.decode()
    assert response.status_code == 400
    assert 'id="error-isolation_level"' in html and 'id="error-on_log_truncated"' in html
    response = operator_client.post("/pipelines/new/", form(topic, table, create_table="on", engine="spark",
                                                            isolation_level="read_uncommitted"))
    html = response.content.decode()
    assert response.status_code == 400 and 'id="error-isolation_level"' in html
    assert "the spark engine reads read_committed only" in html
    assert not Pipeline.objects.exists() and not ActionLog.objects.exclude(result="refused").exists()  # refusals only


def test_a_viewer_sees_the_form_but_may_not_add(client, make_topic, table):
    client.force_login(make_viewer())
    page = client.get("/pipelines/new/").content.decode()
    assert "only operators can add pipelines" in page and 'id="create-pipeline" disabled' in page
    response = client.post("/pipelines/new/", form(make_topic("form"), table, create_table="on"))
    assert response.status_code == 403 and not Pipeline.objects.exists()


def test_an_operator_asks_for_two_runs_and_the_page_shows_them(operator_client, make_topic, table):
    response = operator_client.post("/pipelines/new/", form(make_topic("form"), table, create_table="on", runs="2"))
    assert response.status_code == 302
    assert Pipeline.objects.get(name="orders").parallel_runs == 2
    assert '<b id="parallel-runs">2</b>' in operator_client.get("/pipelines/orders/").content.decode()
    response = operator_client.post("/pipelines/new/", form(make_topic("form"), table + "_b", name="other",
                                                            create_table="on", runs="99"))
    assert response.status_code == 400 and 'id="error-runs"' in response.content.decode()
