"""The classic example: seeding is safe to repeat, --reset starts over, and the demo run shows loss for
at-most-once, duplicates for at-least-once and every value exactly once for exactly-once."""
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from consumers.demo.classic import DEMO_PIPELINES, DEMO_TOPIC, DemoError, run_classic_demo, seed_demo
from consumers.kafka import admin as kafka_admin
from consumers.models import ConsumerRun, PartitionOffset, Pipeline
from tests.chaos import sink_counts
from tests.waiting import patience

pytestmark = [pytest.mark.kafka]

CLASSIC = ["nums-at-most-once", "nums-at-least-once", "nums-exactly-once"]  # the kafka-python engine's three


def held_records(topic):
    return {p: w.high - w.log_start for p, w in kafka_admin.watermarks(topic).items()}


def test_seed_demo_creates_the_topic_and_one_pipeline_per_mode_and_is_safe_to_rerun(demo):
    assert seed_demo(records=30, reset=True)["produced"] == 30
    assert seed_demo(records=30)["produced"] == 0
    call_command("seed_demo", "--records", "30")
    assert held_records(DEMO_TOPIC) == {0: 30}
    pipelines = {p.name: p for p in Pipeline.objects.filter(topic=DEMO_TOPIC)}
    assert sorted(pipelines) == sorted(demo.name for demo in DEMO_PIPELINES)
    assert {name: (p.delivery_mode, p.group_id, p.sink_table, p.batch_size) for name, p in pipelines.items()
            if name in CLASSIC} == {
        "nums-at-most-once": ("at_most_once", "nums-at-most-once", "demo_nums_at_most_once", 10),
        "nums-at-least-once": ("at_least_once", "nums-at-least-once", "demo_nums_at_least_once", 10),
        "nums-exactly-once": ("exactly_once", "nums-exactly-once", "demo_nums_exactly_once", 10),
    }
    for pipeline in pipelines.values():
        assert sink_counts(pipeline.sink_table) == {}


def test_seed_demo_refuses_another_record_count_and_reset_starts_over(demo):
    seed_demo(records=30, reset=True)
    first = Pipeline.objects.get(name="nums-exactly-once")
    PartitionOffset.objects.create(pipeline=first, partition=0, next_offset=12)
    ConsumerRun.objects.create(pipeline=first, epoch=0, host="h", pid=1)
    with pytest.raises(DemoError, match="holds 30 records, not 40"):
        seed_demo(records=40)
    with pytest.raises(CommandError, match="--reset"):
        call_command("seed_demo", "--records", "40")
    seed_demo(records=40, partitions=2, reset=True)
    assert held_records(DEMO_TOPIC) == {0: 20, 1: 20}
    assert not PartitionOffset.objects.exists() and not ConsumerRun.objects.exists()
    assert Pipeline.objects.filter(topic=DEMO_TOPIC).count() == len(DEMO_PIPELINES)


def test_the_classic_demo_loses_with_at_most_once_duplicates_with_at_least_once_not_with_exactly_once(demo):
    updates = []
    # Every first run crashes at its mode's classic point in its first batch; the restart runs without faults.
    result = run_classic_demo(records=30, crash_probability=1.0, max_restarts=1, progress=updates.append,
                              timeout_s=patience(180), pipelines=CLASSIC)
    assert sorted(result) == sorted(CLASSIC)
    lost, doubled, exact = (result[name] for name in ("nums-at-most-once", "nums-at-least-once",
                                                       "nums-exactly-once"))
    for outcome in (lost, doubled, exact):
        assert (outcome["state"], outcome["restarts"]) == ("done", 1), outcome
    # At-most-once committed the first batch to Kafka, then died: those values never reach the sink.
    assert lost["missing"] and lost["missing"] == list(range(1, len(lost["missing"]) + 1))
    assert len(lost["missing"]) <= 10 and lost["duplicated"] == {} and lost["rows"] == 30 - len(lost["missing"])
    # At-least-once wrote the first batch, died before the Kafka commit, and wrote it again.
    assert doubled["missing"] == [] and doubled["duplicated"]
    assert doubled["duplicated"] == {v: 2 for v in range(1, len(doubled["duplicated"]) + 1)}
    assert (exact["rows"], exact["distinct"], exact["missing"], exact["duplicated"]) == (30, 30, [], {})
    assert updates[-1]["nums-exactly-once"]["state"] == "done"
