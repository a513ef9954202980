"""Kafka admin calls against the real broker, with multi-record batches (where the embedded broker's
ListOffsets reply is too low)."""
import time

import pytest
from kafka import KafkaConsumer, TopicPartition

from consumers.kafka import admin as kafka_admin
from consumers.kafka import clusters
from tests.producing import numbered, send
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka


def test_high_watermark_is_right_for_multi_record_batches(kafka_bootstrap, make_topic):
    topic = make_topic("hw", partitions=3)
    send(topic, numbered(1000, partitions=3))
    marks = kafka_admin.watermarks(topic)
    assert {p: (w.log_start, w.high) for p, w in marks.items()} == {0: (0, 334), 1: (0, 333), 2: (0, 333)}


def test_high_watermark_of_an_empty_partition_is_zero(kafka_bootstrap, make_topic):
    topic = make_topic("empty", partitions=2)
    send(topic, numbered(5))
    assert kafka_admin.high_watermarks(topic) == {0: 5, 1: 0}


def test_committed_offsets_and_commit_offsets_round_trip(kafka_bootstrap, make_topic):
    topic = make_topic("grp", partitions=2)
    send(topic, numbered(10, partitions=2))
    assert kafka_admin.committed_offsets("g-round-trip", topic, [0, 1]) == {0: None, 1: None}
    kafka_admin.commit_offsets("g-round-trip", topic, {0: 3, 1: 5})
    assert kafka_admin.committed_offsets("g-round-trip", topic, [0, 1]) == {0: 3, 1: 5}


def test_record_timestamps_give_the_time_of_the_record_at_an_offset(kafka_bootstrap, make_topic):
    topic = make_topic("ts")
    before = int(time.time() * 1000) - 1000
    send(topic, numbered(20))
    stamps = kafka_admin.record_timestamps(topic, {0: 7})
    assert before <= stamps[0] <= int(time.time() * 1000) + 1000
    assert kafka_admin.record_timestamps(topic, {0: 20}) == {0: None}  # at the high watermark: no record


def test_a_group_with_a_live_member_is_described_as_active(kafka_bootstrap, make_topic):
    topic = make_topic("desc")
    send(topic, numbered(3))
    consumer = KafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, group_id="g-desc",
                             session_timeout_ms=6000, heartbeat_interval_ms=1000, auto_offset_reset="earliest")
    try:
        # Poll until the records arrived, not only the assignment: a poll can return the assignment before the
        # partition has a position, and commit() then has no consumed offset to commit (so no group is listed).
        received = []

        def all_three_received():
            for records in consumer.poll(timeout_ms=200).values():
                received.extend(records)
            return len(received) == 3

        wait_for(all_three_received, 20, "the group's member to receive the 3 records")
        assert consumer.assignment() == {TopicPartition(topic, 0)}
        described = kafka_admin.describe_group("g-desc")
        assert described.has_active_members
        assert described.state == "Stable" and len(described.members) == 1
        # (The embedded broker sends empty member assignments; real Kafka fills them in.)
        consumer.commit()
        assert kafka_admin.committed_offsets("g-desc", topic) == {0: 3}
        # The embedded broker lists a group once it has committed; the listing can lag the commit briefly.
        wait_for(lambda: "g-desc" in kafka_admin.list_groups(), 10, "the group to be listed")
    finally:
        consumer.close()


def test_delete_groups_forgets_committed_offsets_and_tolerates_unknown_groups(kafka_bootstrap, make_topic):
    topic = make_topic("del")
    send(topic, numbered(3))
    kafka_admin.commit_offsets("g-delete", topic, {0: 2})
    assert kafka_admin.delete_groups(["g-delete", "g-never-existed"]) == {"g-delete": "OK", "g-never-existed": "OK"}
    assert kafka_admin.committed_offsets("g-delete", topic, [0]) == {0: None}


def test_checks_reuse_one_admin_client_per_cluster_and_a_stale_one_is_replaced(kafka_bootstrap, make_topic):
    topic = make_topic("shared", partitions=2)
    kafka_admin.commit_offsets("shared-group", topic, {0: 3, 1: 0})
    clusters.close_shared_admins()
    assert kafka_admin.committed_offsets("shared-group", topic) == {0: 3, 1: 0}
    with clusters.shared_admin() as first:
        pass
    assert kafka_admin.describe_group("shared-group").has_active_members is False
    assert kafka_admin.committed_offsets("shared-group", topic) == {0: 3, 1: 0}
    with clusters.shared_admin(clusters.DEFAULT) as again:
        assert again is first   # the same client for every call of the process, by name or by default
    first.close()               # its connections gone (as after a broker restart): the call still answers
    assert kafka_admin.committed_offsets("shared-group", topic) == {0: 3, 1: 0}
    with clusters.shared_admin() as replaced:
        assert replaced is not first
    with pytest.raises(RuntimeError), clusters.shared_admin() as client:
        raise RuntimeError("a failed call")
    with clusters.shared_admin() as after_failure:
        assert after_failure is not client


def test_offsets_for_a_time_after_the_newest_record_are_none_not_the_log_start(kafka_bootstrap, make_topic):
    topic = make_topic("by-time", partitions=1)
    send(topic, numbered(5))
    newest = kafka_admin.record_timestamps(topic, {0: 4})[0]
    assert kafka_admin.offsets_for_time(topic, [0], newest - 60_000) == {0: 0}
    assert kafka_admin.offsets_for_time(topic, [0], newest + 3_600_000) == {0: None}   # no record that recent
