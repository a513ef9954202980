"""Lag snapshots: sampling with throughput, and retention by downsampling (the table stays bounded)."""
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from consumers.kafka.admin import Watermarks
from consumers.models import DeliveryMode, LagSnapshot, PartitionOffset, Pipeline
from consumers.reconciliation import snapshots

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def frozen_clock():
    """Everything that reads the clock in these tests reads NOW (stored rows get it as their default)."""
    with time_machine.travel(NOW, tick=False):
        yield


class FakeKafka:
    def __init__(self, high, committed=None, stable=None):
        self.high, self.committed, self.stable = high, committed or {}, stable or {}

    def watermarks(self, topic):
        return {p: Watermarks(0, h, self.stable.get(p)) for p, h in self.high.items()}

    def committed_offsets(self, group_id, topic):
        return dict(self.committed)

    def record_timestamps(self, topic, offsets):
        return {p: int((NOW - timedelta(seconds=30)).timestamp() * 1000) for p in offsets}

    def list_groups(self):
        return []


@pytest.fixture
def pipeline(db):
    return Pipeline.objects.create(name="snap", topic="nums", sink_table="snap_sink", epoch=1)


def sample(pipeline, partition, minutes_ago, lag, position=0, resolution=0, rate=None):
    return LagSnapshot.objects.create(pipeline=pipeline, partition=partition,
                                      taken_at=NOW - timedelta(minutes=minutes_ago), lag_records=lag,
                                      position=position, resolution_seconds=resolution, records_per_second=rate)


def test_a_snapshot_stores_each_partition_and_the_total_with_throughput(pipeline):
    PartitionOffset.objects.create(pipeline=pipeline, partition=0, next_offset=100)
    PartitionOffset.objects.create(pipeline=pipeline, partition=1, next_offset=40)
    kafka = FakeKafka({0: 100, 1: 70})
    snapshots.take_snapshots(kafka=kafka, now=NOW - timedelta(seconds=60))
    PartitionOffset.objects.filter(pipeline=pipeline, partition=1).update(next_offset=70)
    snapshots.take_snapshots(kafka=kafka, now=NOW)
    latest = {s.partition: s for s in LagSnapshot.objects.filter(taken_at=NOW)}
    assert (latest[0].lag_records, latest[1].lag_records, latest[None].lag_records) == (0, 0, 0)
    assert latest[1].records_per_second == pytest.approx(0.5)  # 30 records in 60 s
    assert latest[None].records_per_second == pytest.approx(0.5) and latest[None].position == 170


def test_lag_stops_at_an_open_transaction_as_reconciliation_measures_it(pipeline):
    """A read_committed pipeline cannot pass the last stable offset: the records of the open transaction above it
    are not lag yet (the charts said 5 while the reconciliation report said 0)."""
    PartitionOffset.objects.create(pipeline=pipeline, partition=0, next_offset=15)
    snapshots.take_snapshots(kafka=FakeKafka({0: 20}, stable={0: 15}), now=NOW)
    latest = LagSnapshot.objects.get(partition=0)
    assert (latest.lag_records, latest.high_watermark) == (0, 20)


def test_a_classic_pipeline_is_sampled_at_its_kafka_offset(db):
    pipeline = Pipeline.objects.create(name="snap-amo", topic="nums", sink_table="s", epoch=1,
                                       delivery_mode=DeliveryMode.AT_MOST_ONCE)
    PartitionOffset.objects.create(pipeline=pipeline, partition=0, next_offset=10)
    snapshots.take_snapshots(kafka=FakeKafka({0: 50}, committed={0: 30}), now=NOW)
    row = LagSnapshot.objects.get(pipeline=pipeline, partition=0)
    assert (row.position, row.lag_records, row.lag_seconds) == (30, 20, pytest.approx(30))


def test_downsampling_merges_old_samples_into_minute_buckets_keeping_the_highest_lag(pipeline):
    for second in range(0, 60, 10):  # six raw samples in the minute 02:00..02:01 ago
        sample(pipeline, 0, 120 - second / 60, lag=second, position=1000 + second, rate=float(second))
    recent = sample(pipeline, 0, 5, lag=7)
    snapshots.downsample(now=NOW)
    bucket = LagSnapshot.objects.get(resolution_seconds=60)
    assert bucket.taken_at == NOW - timedelta(minutes=120)
    assert (bucket.lag_records, bucket.position, bucket.records_per_second) == (50, 1050, pytest.approx(25.0))
    assert list(LagSnapshot.objects.filter(resolution_seconds=0)) == [recent]  # the last hour stays raw


def test_samples_older_than_a_day_become_fifteen_minute_buckets_and_a_month_old_ones_go(pipeline):
    for minute in range(1, 31):  # 30 one-minute buckets, 11:30..11:59 two days ago: two 15-minute buckets
        sample(pipeline, 0, 2 * 24 * 60 + minute, lag=minute, resolution=60)
    sample(pipeline, 0, 31 * 24 * 60, lag=1, resolution=900)
    result = snapshots.downsample(now=NOW)
    assert sorted(LagSnapshot.objects.values_list("resolution_seconds", "lag_records")) == [(900, 15), (900, 30)]
    assert result["deleted"] == 1


def test_downsampling_keeps_the_table_bounded_and_is_idempotent(pipeline):
    start = NOW - timedelta(days=3)
    LagSnapshot.objects.bulk_create(
        LagSnapshot(pipeline=pipeline, partition=0, taken_at=start + timedelta(seconds=30 * i), lag_records=i)
        for i in range(3 * 24 * 120))  # three days of samples every 30 s
    snapshots.downsample(now=NOW)
    after = LagSnapshot.objects.count()
    # raw for the last hour (120) + per minute for the day before (~23 h x 60) + per 15 min before that
    assert 120 + 23 * 60 <= after <= 120 + 23 * 60 + 2 * 24 * 4 + 4
    snapshots.downsample(now=NOW)
    assert LagSnapshot.objects.count() == after
