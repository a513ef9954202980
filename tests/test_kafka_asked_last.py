"""A pipeline or a watch refused for a cheap reason (a bad name, table, transform, mode) is refused without
asking Kafka: its metadata may take the client's whole timeout, and /pipelines/new/ must answer 4xx at once."""
import pytest
from django.test import Client

from consumers.models import ActionLog, ActionResult, Pipeline, Watch
from consumers.operations import pipeline_setup, watch_setup
from tests.views_helpers import make_operator

pytestmark = pytest.mark.django_db

FORM = {"name": "orders", "topic": "orders-topic", "sink_table": "sink_orders", "mode": "exactly-once",
        "transform": "int_value", "engine": "python", "isolation_level": "read_committed", "on_log_truncated": "stop",
        "create_table": "on"}


@pytest.fixture
def kafka_asked(monkeypatch):
    asked = []
    for name in ("partitions_for", "watermarks"):
        monkeypatch.setattr(f"consumers.kafka.admin.{name}", lambda *args, **kwargs: asked.append(args) or [0])
    return asked


@pytest.mark.parametrize("field,value", [("name", "Bad Name"), ("name", "new"), ("sink_table", "auth_user"),
                                         ("transform", "..x"), ("transform", "django.contrib.gis.gdal.x"),
                                         ("topic", "no spaces/in topics"), ("isolation_level", "x"),
                                         ("runs", "0")])
def test_the_form_refuses_a_cheap_problem_without_asking_kafka(kafka_asked, field, value):
    client = Client()
    client.force_login(make_operator())
    response = client.post("/pipelines/new/", {**FORM, field: value})
    assert response.status_code == 400
    assert not kafka_asked
    assert not Pipeline.objects.exists()
    assert not ActionLog.objects.exclude(result=ActionResult.REFUSED).exists()


def test_a_valid_spec_still_has_its_topic_checked(kafka_asked):
    pipeline_setup.validate(pipeline_setup.PipelineSpec(name="orders", topic="orders-topic",
                                                        sink_table="sink_orders", create_table=True))
    assert kafka_asked == [("orders-topic",)]


@pytest.mark.parametrize("overrides", [{"name": "Bad Name"}, {"group": ""}, {"settle_seconds": -1},
                                       {"cluster": "nowhere"}])
def test_a_watch_refused_for_a_cheap_reason_does_not_ask_kafka(kafka_asked, overrides):
    spec = watch_setup.WatchSpec(**{"name": "w", "group": "g", "topic": "t", **overrides})
    with pytest.raises(watch_setup.Invalid):
        watch_setup.validate(spec)
    assert not kafka_asked and not Watch.objects.exists()


def test_a_consumer_group_id_longer_than_the_column_is_refused_not_a_database_error(kafka_asked):
    spec = pipeline_setup.PipelineSpec(name="orders", topic="orders-topic", sink_table="sink_orders",
                                       group="g" * 256, create_table=True)
    with pytest.raises(pipeline_setup.Invalid) as refused:
        pipeline_setup.validate(spec)
    assert refused.value.problems == {"group": "a consumer group id is at most 255 characters"}


@pytest.mark.parametrize("start_from, problem", [
    ("1960-01-01T00:00:00Z", "start_from 1960-01-01T00:00:00Z is before 1970-01-01, where Kafka timestamps begin."),
    ("2999-01-01T00:00:00Z", "start_from 2999-01-01T00:00:00Z is in the future"),
    ("0001-01-01T00:00:00+05:00", "start_from needs an ISO-8601 date and time"),
])
def test_a_watch_start_kafka_cannot_look_up_is_refused_as_a_rewinds_time_is(kafka_asked, start_from, problem):
    spec = watch_setup.WatchSpec(name="w", group="g", topic="t", start_from=start_from)
    with pytest.raises(watch_setup.Invalid) as refused:
        watch_setup.validate(spec)
    assert refused.value.problems["start_from"].startswith(problem)
    assert not Watch.objects.exists()
