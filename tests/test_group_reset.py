"""Resetting the committed offsets of a consumer group Tally does not run: a dry run by default, refused
while the group has an active member (as kafka-consumer-groups refuses), done once it is empty; audited."""
import json
import time

import pytest
from kafka import KafkaConsumer

from consumers.kafka import admin as kafka_admin
from consumers.models import ActionLog, ActionResult
from tests.commands import run_command
from tests.ops_helpers import drop_demo_sinks, seed
from tests.producing import numbered, send

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

GROUP = "billing-loader"


@pytest.fixture
def topic_with_group(kafka_bootstrap, make_topic):
    """A 2-partition topic with 10 records per partition and an outside group committed at 8 and 6."""
    topic = make_topic("orders", partitions=2)
    send(topic, numbered(20, partitions=2))
    group = f"{GROUP}-{topic}"
    kafka_admin.commit_offsets(group, topic, {0: 8, 1: 6})
    return topic, group


def join_group(bootstrap, topic, group) -> KafkaConsumer:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, session_timeout_ms=6000,
                             heartbeat_interval_ms=500, enable_auto_commit=False)
    deadline = time.monotonic() + 20
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(timeout_ms=200)
    assert consumer.assignment(), "the consumer did not join its group"
    return consumer


def test_reset_is_a_dry_run_by_default_and_changes_nothing(topic_with_group, capsys):
    topic, group = topic_with_group
    code, out, _ = run_command(capsys, "groups", "reset", group, "--topic", topic, "--to-earliest", "--json")
    data = json.loads(out)
    assert code == 0 and data["dry_run"] is True
    assert [(p["current"], p["new"], p["reprocess"]) for p in data["partitions"]] == [(8, 0, 8), (6, 0, 6)]
    assert kafka_admin.committed_offsets(group, topic) == {0: 8, 1: 6}
    assert ActionLog.objects.get(group_id=group).dry_run


def test_reset_is_refused_while_a_member_is_active_and_done_once_the_group_is_empty(
        kafka_bootstrap, topic_with_group, capsys):
    topic, group = topic_with_group
    consumer = join_group(kafka_bootstrap, topic, group)
    try:
        code, _, err = run_command(capsys, "groups", "reset", group, "--topic", topic, "--shift-by", "-2",
                                   "--execute")
        assert code == 1 and f"Group {group!r} has 1 active member(s)" in err and "stop its consumers" in err
        assert kafka_admin.committed_offsets(group, topic) == {0: 8, 1: 6}
        assert ActionLog.objects.get(group_id=group).result == ActionResult.REFUSED
    finally:
        consumer.close()
    code, out, _ = run_command(capsys, "groups", "reset", group, "--topic", topic, "--shift-by", "-2", "--execute")
    assert code == 0, out
    assert kafka_admin.committed_offsets(group, topic) == {0: 6, 1: 4}
    entry = ActionLog.objects.filter(group_id=group, result=ActionResult.DONE).get()
    assert (entry.action, entry.offsets_before, entry.offsets_after) == ("reset_group", {"0": 8, "1": 6},
                                                                          {"0": 6, "1": 4})
    assert entry.is_rewind


def test_reset_of_chosen_partitions_to_an_offset_outside_the_log_is_refused(topic_with_group, capsys):
    topic, group = topic_with_group
    code, _, err = run_command(capsys, "groups", "reset", group, "--topic", topic, "--to-offset", "11",
                               "--partition", "1", "--execute")
    assert code == 1 and "partition 1: offset 11 is outside [0, 10]" in err
    code, _, err = run_command(capsys, "groups", "reset", group, "--topic", topic, "--to-latest",
                               "--partition", "5", "--execute")
    assert code == 1 and "Unknown partition(s) 5" in err
    assert kafka_admin.committed_offsets(group, topic) == {0: 8, 1: 6}


def test_a_group_run_by_a_tally_pipeline_is_reset_with_a_rewind_instead(kafka_bootstrap, capsys, settings):
    seed(4)
    try:
        code, _, err = run_command(capsys, "groups", "reset", "nums-exactly-once", "--topic", "nums",
                                   "--to-earliest", "--execute")
        assert code == 1 and "move it with `rewind nums-exactly-once`" in err
    finally:
        drop_demo_sinks()


def test_describe_shows_committed_offset_end_offset_and_lag(topic_with_group, capsys):
    topic, group = topic_with_group
    code, out, _ = run_command(capsys, "groups", "describe", group, "--json")
    data = json.loads(out)
    assert code == 0
    assert [(p["partition"], p["committed"], p["high_watermark"], p["lag_records"]) for p in data["partitions"]
            if p["topic"] == topic] == [(0, 8, 10, 2), (1, 6, 10, 4)]


def test_a_group_deleted_after_the_plan_is_not_created_again_by_the_reset(topic_with_group, monkeypatch):
    from consumers.operations.errors import NotFound
    from consumers.operations.group_reset import reset_group

    topic, group = topic_with_group
    read_watermarks = kafka_admin.watermarks

    def deleted_meanwhile(*args, **kwargs):  # the plan has checked the group; someone deletes it now
        assert kafka_admin.delete_groups([group]) == {group: "OK"}
        return read_watermarks(*args, **kwargs)

    monkeypatch.setattr(kafka_admin, "watermarks", deleted_meanwhile)
    with pytest.raises(NotFound, match=f"has no consumer group {group!r}"):
        reset_group(group, topic, "to-earliest", execute=True, actor="otto")
    assert kafka_admin.group_committed_offsets(group) == {}
    assert group not in kafka_admin.list_groups()
    entry = ActionLog.objects.get(group_id=group)
    assert (entry.result, entry.dry_run, entry.actor) == (ActionResult.REFUSED, False, "otto")
