"""Watches of plain kafka-python consumers (examples/plain_consumer.py, not Tally's engine) that are SIGKILLed
between their two steps: the watch reports exactly the records each lost or duplicated, checked row by row
against the table the consumer wrote."""
import uuid

import pytest

from consumers.models import Watch, WatchRange
from consumers.operations import watch_setup
from consumers.operations.watch_setup import WatchSpec
from consumers.reconciliation import watch_audit
from tests.transactional_log import mixed_transactions, produce_transactions
from tests.watch_helpers import (
    as_offsets,
    drop_tables,
    id_counts,
    json_value,
    produce,
    read_topic,
    run_plain_consumer,
    table_rows,
)

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]


@pytest.fixture
def names(transactional_db):
    made = []

    def make(prefix):
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        made.append(name)
        return name

    yield make
    drop_tables(*made)


def watch_of(name, group, topic, table, record_id="value", row_id="id", **extra) -> Watch:
    watch, _ = watch_setup.create(WatchSpec(name=name.replace("_", "-"), group=group, topic=topic, sink_table=table,
                                            record_id=record_id, row_id=row_id, **extra))
    return watch


def watched_after_a_kill(env, names, topic, table, order, die_at_batch) -> Watch:
    """The plain consumer (`order`) of `topic` into `table`, SIGKILLed in batch `die_at_batch` and run again to
    the end of the topic; then a watch of its group."""
    group = names("g")
    assert run_plain_consumer(env, topic, group, table, order, die_at_batch=die_at_batch) == -9
    assert run_plain_consumer(env, topic, group, table, order) == 0
    return watch_of(names("w"), group, topic, table)


def test_a_consumer_that_commits_before_it_writes_loses_exactly_the_records_the_watch_names(
        make_topic, subprocess_env, names):
    topic = make_topic("nums", partitions=2)
    produce(topic, [(None, str(v).encode()) for v in range(1, 101)], partitions=2)
    table = names("amo")
    watch = watched_after_a_kill(subprocess_env, names, topic, table, "commit-then-write", die_at_batch=3)

    report = watch_audit.check_watch(watch, settle_seconds=0)

    records = read_topic(topic)
    written = id_counts(table)
    missing = {where for where, (_, value, _) in records.items() if int(value) not in written}
    assert missing, "the consumer was killed after a commit: its batch never landed"
    assert as_offsets(report.lost_offsets) == missing and report.lost == len(missing)
    assert (report.duplicated, report.phantom, report.checked) == (0, 0, 100)
    assert report.lag_records == 0 and report.status == "ERR"
    # Each finding traces to its record's value, and that value has no row.
    for partition, offset in missing:
        value = int(records[(partition, offset)][1])
        assert table_rows("SELECT count(*) FROM " + table + " WHERE id = %s", [value]) == [(0,)]


def test_a_consumer_that_writes_before_it_commits_duplicates_exactly_the_records_the_watch_names(
        make_topic, subprocess_env, names):
    topic = make_topic("nums", partitions=1)
    produce(topic, [(None, str(v).encode()) for v in range(1, 61)])
    table = names("alo")
    watch = watched_after_a_kill(subprocess_env, names, topic, table, "write-then-commit", die_at_batch=2)

    report = watch_audit.check_watch(watch, settle_seconds=0)

    written = id_counts(table)
    records = read_topic(topic)
    doubled = {where for where, (_, value, _) in records.items() if written[int(value)] > 1}
    assert doubled, "the consumer was killed after a write: the batch was written again"
    assert as_offsets(report.duplicated_offsets) == doubled
    assert report.duplicated == sum(n - 1 for n in written.values())
    assert (report.lost, report.phantom, report.checked) == (0, 0, 60)


def test_an_upsert_consumer_on_a_keyed_stream_loses_only_latest_records_and_lost_deletes(
        make_topic, subprocess_env, names):
    """Keys k0..k9 are created, updated, then k0..k4 deleted (tombstones) and k10..k14 created. The consumer
    commits before it writes and is killed twice: once in the first batch (superseded by the updates: not
    lost), once in a later batch (whatever its latest records were is lost)."""
    topic = make_topic("entities", partitions=1)
    updates = [(f"k{i}".encode(), json_value(id=f"k{i}", version=1)) for i in range(10)]
    updates += [(f"k{i}".encode(), json_value(id=f"k{i}", version=2)) for i in range(10)]
    updates += [(f"k{i}".encode(), None) for i in range(5)] + [
        (f"k{i}".encode(), json_value(id=f"k{i}", version=1)) for i in range(10, 15)]
    produce(topic, updates)
    group, table = names("g"), names("upserts")
    assert run_plain_consumer(subprocess_env, topic, group, table, "commit-then-write", keyed=True,
                              die_at_batch=1) == -9
    assert run_plain_consumer(subprocess_env, topic, group, table, "commit-then-write", keyed=True,
                              die_at_batch=2) == -9
    assert run_plain_consumer(subprocess_env, topic, group, table, "commit-then-write", keyed=True) == 0
    watch = watch_of(names("w"), group, topic, table, record_id="key", keyed=True)

    report = watch_audit.check_watch(watch, settle_seconds=0)

    records = read_topic(topic)
    latest = {}
    for (partition, offset), (key, value, _) in sorted(records.items()):
        latest[key.decode()] = (partition, offset, value is None)
    present = {row[0] for row in table_rows("SELECT id FROM " + table)}
    wrong = {(p, o) for key, (p, o, tombstone) in latest.items() if (key in present) == tombstone}
    assert wrong, "the second kill lost a batch holding latest records"
    assert as_offsets(report.lost_offsets) == wrong and report.lost == len(wrong)
    assert report.duplicated == 0 and report.checked == len(records)
    ranges = list(WatchRange.objects.filter(watch=watch))
    assert sum(r.superseded for r in ranges) == len(records) - len(latest)


def test_transaction_markers_and_aborted_records_are_never_lost(make_topic, subprocess_env, names):
    topic = make_topic("tx", partitions=1)
    committed = produce_transactions(topic, mixed_transactions(6, size=5))
    table = names("txrows")
    watch = watched_after_a_kill(subprocess_env, names, topic, table, "commit-then-write", die_at_batch=2)

    report = watch_audit.check_watch(watch, settle_seconds=0)

    records = read_topic(topic)   # what the topic holds: markers (and, on real Kafka, aborted records) are not
    assert len(records) >= len(committed)
    written = id_counts(table)
    missing = {where for where, (_, value, _) in records.items() if int(value) not in written}
    assert missing and as_offsets(report.lost_offsets) == missing
    assert all(where in records for where in as_offsets(report.lost_offsets))   # never a marker's offset
    assert report.checked == len(records) and report.duplicated == 0


def test_records_not_yet_committed_are_lag_never_lost(make_topic, subprocess_env, names):
    topic = make_topic("nums", partitions=1)
    produce(topic, [(None, str(v).encode()) for v in range(1, 31)])
    group, table = names("g"), names("lagging")
    assert run_plain_consumer(subprocess_env, topic, group, table, "write-then-commit") == 0
    produce(topic, [(None, str(v).encode()) for v in range(31, 51)])   # nobody reads these
    watch = watch_of(names("w"), group, topic, table)

    report = watch_audit.check_watch(watch, settle_seconds=0)

    assert (report.lost, report.duplicated, report.checked) == (0, 0, 30)
    assert report.lag_records == 20 and report.lag_seconds is not None
    assert report.status == "OK" and report.clean


def test_a_range_settles_only_once_its_commit_is_older_than_the_settle_time(make_topic, subprocess_env, names):
    from datetime import timedelta

    from django.utils import timezone

    topic = make_topic("nums", partitions=1)
    produce(topic, [(None, str(v).encode()) for v in range(1, 21)])
    group, table = names("g"), names("settle")
    assert run_plain_consumer(subprocess_env, topic, group, table, "commit-then-write", die_at_batch=2) == -9
    watch = watch_of(names("w"), group, topic, table, settle_seconds=30)
    now = timezone.now()

    first = watch_audit.check_watch(watch, now=now)
    later = watch_audit.check_watch(watch, now=now + timedelta(seconds=31))
    idle = watch_audit.check_watch(watch, now=now + timedelta(seconds=62))

    assert first.checked == 0 and first.lost == 0   # committed now: the consumer may still be writing
    assert later.checked == 20 and later.lost == len(later.lost_offsets) > 0
    assert idle.checked == 20 and idle.lost == later.lost and idle.new_ranges == []
