"""A pipeline run by a Celery worker commits its positions to Kafka after each DB commit, as the command
line's run does: once caught up, Kafka's committed offset equals the database's, so external lag tools
(Burrow, kafka-consumer-groups) agree with Tally."""
import uuid

import pytest

from consumers.kafka import admin as kafka_admin
from consumers.models import DesiredState, Pipeline
from consumers.operations import actions, pipeline_setup
from consumers.operations.pipeline_setup import PipelineSpec
from tests.conftest import drop_sink_tables
from tests.ops_helpers import wait_for
from tests.producing import numbered, send

pytestmark = [pytest.mark.kafka, pytest.mark.celery, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def worker_pipeline(make_topic, settings):
    settings.KAFKA_SESSION_TIMEOUT_MS = 6000
    table = f"wk_{uuid.uuid4().hex[:8]}"
    topic = make_topic("worker-commits", partitions=2)
    pipeline = pipeline_setup.create(PipelineSpec("worker-commits", topic, table, create_table=True))
    yield pipeline
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.STOPPED)
    drop_sink_tables([table])


@pytest.mark.parametrize("mode", ["exactly-once", "at-least-once"])
def test_after_a_worker_run_kafkas_committed_offsets_equal_the_databases(celery_worker, worker_pipeline, mode):
    if mode != "exactly-once":
        Pipeline.objects.filter(pk=worker_pipeline.pk).update(delivery_mode=mode.replace("-", "_"))
    topic, group = worker_pipeline.topic, worker_pipeline.group_id
    send(topic, numbered(100, partitions=2, first=0))
    actions.start(worker_pipeline.name)
    high = kafka_admin.high_watermarks(topic)

    def db_positions():
        return dict(Pipeline.objects.get(pk=worker_pipeline.pk).offsets.values_list("partition", "next_offset"))

    wait_for(lambda: db_positions() == high, 60, f"the run to reach {high}")
    wait_for(lambda: kafka_admin.committed_offsets(group, topic) == db_positions(), 30,
             "Kafka's committed offsets to equal the database's while the run is idle")
    send(topic, numbered(30, partitions=2, first=100))
    high = kafka_admin.high_watermarks(topic)
    wait_for(lambda: db_positions() == high, 60, f"the run to reach {high}")
    wait_for(lambda: kafka_admin.committed_offsets(group, topic) == db_positions(), 30,
             "Kafka's committed offsets to follow the second batch")
    actions.stop(worker_pipeline.name)
    wait_for(lambda: not Pipeline.objects.get(pk=worker_pipeline.pk).runs.filter(state="running").exists(), 30,
             "the run to end")
    assert kafka_admin.committed_offsets(group, topic) == db_positions() == high
