"""Poison values through the kafka-python engine, the real broker and PostgreSQL: a topic full of them is
consumed to the end; under the "stop" policy the run halts at once, says why, is not restarted, and the
alert fires at the next evaluation; a database error that is not about data ends the run the same way."""
import pytest
from django.db import connection
from django.test import Client

from alerts.defaults import ensure_default_rules
from alerts.evaluate import evaluate_all
from alerts.models import Alert, RuleKind
from consumers.engine import sinks
from consumers.engine.python import run_pipeline
from consumers.models import BadRecordPolicy, ConsumerRun, DeadLetter, DeliveryMode, PartitionOffset, RunState
from consumers.operations.supervisor import supervise
from tests.chaos import produce_values, sink_counts
from tests.conftest import drop_sink_tables
from tests.pipelines import create_pipeline
from tests.views_helpers import make_viewer

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_client")]

OVERFLOW = "99999999999999999999"


@pytest.fixture
def make_pipeline(transactional_db, kafka_bootstrap, make_topic, settings):
    settings.KAFKA_SESSION_TIMEOUT_MS = 6000
    created = []

    def make(values, partitions=1, **fields):
        topic = make_topic("poison", partitions=partitions)
        produce_values(topic, values, partitions)
        pipeline = create_pipeline(topic, topic, f"sink_{topic}".replace("-", "_"), "int_value",
                                   DeliveryMode.EXACTLY_ONCE, batch_size=fields.pop("batch_size", 25), **fields)
        created.append(pipeline.sink_table)
        return pipeline

    yield make
    drop_sink_tables(created)


def test_a_topic_full_of_poison_is_consumed_to_the_end_with_every_good_record_once(make_pipeline):
    values = []
    for i in range(1, 301):
        values.append(i)
        if i % 3 == 0:
            values.append(OVERFLOW)         # passes the transform, refused by PostgreSQL
        if i % 50 == 0:
            values.append("not a number")   # refused by the transform
    pipeline = make_pipeline(values, partitions=3)
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=90)
    assert result.reason == "caught_up", result.detail
    assert sink_counts(pipeline.sink_table) == {i: 1 for i in range(1, 301)}
    letters = list(DeadLetter.objects.filter(pipeline=pipeline))
    assert len(letters) == 100 + 6 == result.dead_letters
    assert {bytes(d.value) for d in letters} == {OVERFLOW.encode(), b"not a number"}
    for letter in letters:
        if bytes(letter.value) == OVERFLOW.encode():
            assert letter.error.startswith("database refused: 22003") and "bigint" in letter.error
        else:
            assert "not an integer" in letter.error
    total = sum(PartitionOffset.objects.filter(pipeline=pipeline).values_list("next_offset", flat=True))
    assert total == len(values)


def test_the_stop_policy_halts_on_a_poison_value_and_the_alert_fires_at_the_next_evaluation(make_pipeline):
    ensure_default_rules()
    pipeline = make_pipeline(["1", "2", OVERFLOW, "4"], on_bad_record=BadRecordPolicy.STOP, batch_size=10)
    pipeline.desired_state = "running"
    pipeline.save()
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "bad_record"
    assert "offset 2" in result.detail and "22003" in result.detail
    run = ConsumerRun.objects.get(pk=result.run_id)
    assert run.state == RunState.FAILED and "offset 2" in run.end_reason
    pipeline.refresh_from_db()
    assert pipeline.last_error.startswith("halted (bad_record)") and "out of range" in pipeline.last_error
    assert sink_counts(pipeline.sink_table) == {}  # the batch holding the poison was not written

    [decision] = supervise()
    assert decision.action == "halted"
    assert ConsumerRun.objects.filter(pipeline=pipeline).count() == 1  # no retry loop
    evaluate_all()
    alert = Alert.objects.get(pipeline=pipeline, rule__kind=RuleKind.NO_CONSUMER)
    assert alert.state == "firing" and "halted" in alert.summary and "offset 2" in alert.summary

    client = Client()
    client.force_login(make_viewer())
    page = client.get(f"/pipelines/{pipeline.name}/").content.decode()
    banner = page[page.index('id="last-error"'):].split("</p>")[0]
    assert "halted (bad_record)" in banner and "offset 2" in banner


def test_a_missing_sink_table_ends_the_run_with_an_error_and_no_restart(make_pipeline):
    pipeline = make_pipeline(["1", "2", "3"])
    pipeline.desired_state = "running"
    pipeline.save()
    with connection.cursor() as cur:
        sinks.drop_sink_table(cur, pipeline.sink_table)
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "sink_error" and "42P01" in result.detail
    assert ConsumerRun.objects.get(pk=result.run_id).state == RunState.FAILED
    assert [d.action for d in supervise()] == ["halted"]
    assert not DeadLetter.objects.exists()
