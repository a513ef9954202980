"""The python engine's Kafka client is chosen per pipeline (`kafka_client`) or for the worker
(TALLY_KAFKA_CLIENT): every door stores and refuses it the same way (consumers/operations/pipeline_setup.py),
and a run reads with the client chosen."""
import json

import pytest

from consumers.engine import consumer as engine_consumer
from consumers.models import ActionLog, Pipeline
from consumers.operations import pipeline_file, pipeline_setup
from consumers.operations.pipeline_setup import Invalid, PipelineSpec
from tests.commands import pipeline_command as run_command

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def topic(make_topic):
    return make_topic("orders", partitions=2)


def test_the_worker_default_applies_unless_the_pipeline_chooses(settings):
    assert settings.TALLY_KAFKA_CLIENT == "kafka-python"   # the design's client stays the default
    assert engine_consumer.client_for(Pipeline(kafka_client="")) == "kafka-python"
    settings.TALLY_KAFKA_CLIENT = "librdkafka"
    assert engine_consumer.client_for(Pipeline(kafka_client="")) == "librdkafka"
    assert engine_consumer.client_for(Pipeline(kafka_client="kafka-python")) == "kafka-python"


def test_the_command_stores_shows_and_audits_the_client(capsys, topic, table, operator_client):
    code, out, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table, "--create-table",
                                 "--kafka-client", "librdkafka", "--json")
    assert (code, err) == (0, "") and json.loads(out)["kafka_client"] == "librdkafka"
    assert Pipeline.objects.get(name="orders").kafka_client == "librdkafka"
    assert ActionLog.objects.get(action="create").params["kafka_client"] == "librdkafka"
    code, out, _ = run_command(capsys, "show", "orders")
    assert "kafka_client:      librdkafka" in out
    page = operator_client.get("/pipelines/orders/").content.decode()
    assert 'Kafka client <b id="kafka-client">librdkafka</b>' in page
    assert json.loads(operator_client.get("/api/pipelines/orders/").content)["kafka_client"] == "librdkafka"


def test_every_door_refuses_an_unknown_client_and_librdkafka_on_spark_with_one_message(capsys, topic, table,
                                                                                         operator_client, tmp_path):
    code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table, "--create-table",
                               "--kafka-client", "java")
    assert code == 1 and "kafka_client: unknown Kafka client 'java': use kafka-python, librdkafka" in err
    response = operator_client.post("/api/pipelines/", json.dumps({"name": "orders", "topic": topic,
                                                                   "sink_table": table, "create_table": True,
                                                                   "kafka_client": "java"}),
                                    content_type="application/json")
    assert response.status_code == 400 and "unknown Kafka client 'java'" in response.content.decode()
    response = operator_client.post("/pipelines/new/", {"name": "orders", "topic": topic, "sink_table": table,
                                                        "mode": "exactly-once", "transform": "int_value",
                                                        "engine": "python", "isolation_level": "read_committed",
                                                        "on_log_truncated": "stop", "create_table": "on",
                                                        "kafka_client": "java"})
    assert "java" in response.content.decode() and response.status_code != 302
    path = tmp_path / "pipelines.toml"
    path.write_text(f'[pipelines.orders]\ntopic = "{topic}"\nsink_table = "{table}"\ncreate_table = true\n'
                    'engine = "spark"\nkafka_client = "librdkafka"\n')
    with pytest.raises(pipeline_file.FileRefused, match="spark engine reads Kafka with its own source"):
        pipeline_file.apply(str(path), actor="test")
    assert not Pipeline.objects.exists()


def test_the_client_may_change_while_stopped_and_is_a_pipelines_own(topic, table):
    pipeline = pipeline_setup.create(PipelineSpec("orders", topic, table, create_table=True))
    assert pipeline.kafka_client == ""
    diff = pipeline_setup.update(PipelineSpec("orders", topic, table, kafka_client="librdkafka"), pipeline)
    assert diff == {"kafka_client": ("", "librdkafka")}
    assert Pipeline.objects.get(pk=pipeline.pk).kafka_client == "librdkafka"


def test_librdkafka_without_the_extra_is_refused_with_the_install_command(topic, table, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def without_confluent(name, *args, **kwargs):
        if name.split(".")[0] == "confluent_kafka":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_confluent)
    with pytest.raises(Invalid) as refused:
        pipeline_setup.validate(PipelineSpec("orders", topic, table, create_table=True, kafka_client="librdkafka"))
    assert "pip install 'tally[rdkafka]'" in refused.value.problems["kafka_client"]
