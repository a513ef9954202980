"""A reconciliation pass reads Kafka's side in bulk per cluster (consumers/reconciliation/pass_kafka.py): one read of
the committed offsets and one of the watermarks for all its pipelines, none per pipeline; and a pipeline that
consumed past the marks read at the pass's start has its Kafka read again before "ahead" is believed. Kafka is a
stand-in counting its calls; tests/test_reconcile_kafka.py runs reconciliation against the real broker."""
import collections

import pytest
from django.db import connection

from consumers.engine import commit, db, sinks
from consumers.engine.transforms import SourceRecord, resolve
from consumers.kafka import admin as kafka_admin
from consumers.kafka.admin import Watermarks
from consumers.models import Pipeline
from consumers.reconciliation import reconcile
from tests.conftest import drop_sink_tables


class CountingCluster:
    """A cluster's admin calls: bulk marks from `pass_high`, a pipeline's own read from `own_high`."""

    def __init__(self, pass_high: int, own_high: int):
        self.pass_high, self.own_high = pass_high, own_high
        self.calls = collections.Counter()

    def watermarks_of_topics(self, topics):
        self.calls["watermarks_of_topics"] += 1
        return {topic: {0: Watermarks(0, self.pass_high)} for topic in topics}

    def committed_offsets_of_groups(self, groups):
        self.calls["committed_offsets_of_groups"] += 1
        return {group: {} for group in groups}

    def watermarks(self, topic):
        self.calls["watermarks"] += 1
        return {0: Watermarks(0, self.own_high)}

    def committed_offsets(self, group_id, topic):
        self.calls["committed_offsets"] += 1
        return {}

    def record_timestamps(self, topic, offsets):
        return {p: None for p in offsets}


@pytest.fixture
def pipelines(transactional_db):
    """make(count) -> pipelines whose partition 0 holds offsets 0..9, exactly once, in their sinks."""
    conn = db.connect()
    made = []

    def make(count):
        for i in range(count):
            pipeline = Pipeline.objects.create(name=f"pk-{i}", topic=f"pk-{i}", sink_table=f"pass_kafka_sink_{i}",
                                               transform="int_value", epoch=1)
            made.append(pipeline)
            with connection.cursor() as cur:
                sinks.ensure_sink_table(cur, pipeline.sink_table, resolve("int_value"), True)
            commit.ensure_positions(conn, pipeline.pk, {0: 0})
            commit.commit_batch(conn, commit.Target.for_pipeline(pipeline), 1,
                                {0: [SourceRecord(0, o, None, str(o + 1).encode()) for o in range(10)]})
        return made

    yield make
    conn.close()
    drop_sink_tables(pipeline.sink_table for pipeline in made)


@pytest.fixture
def cluster(monkeypatch):
    clusters = {}

    def on(name=None):
        return clusters.setdefault("only", CountingCluster(pass_high=10, own_high=10))

    monkeypatch.setattr(kafka_admin, "on", on)
    return lambda: clusters["only"]


def ahead(report) -> list:
    return [f for p in report.partitions for f in p.findings if f.kind == "ahead"]


def test_a_pass_reads_kafka_once_per_cluster_for_all_its_pipelines(pipelines, cluster):
    pipelines(3)
    reports = reconcile.reconcile_all()
    assert [r.name for r in reports] == ["pk-0", "pk-1", "pk-2"]
    assert all(r.exact and not r.kafka_error and r.lag_records == 0 for r in reports)
    assert cluster().calls == {"watermarks_of_topics": 1, "committed_offsets_of_groups": 1}


def test_a_position_past_the_passs_marks_is_read_again_before_it_counts_as_ahead(pipelines, cluster):
    pipelines(1)
    reconcile.reconcile_all()
    cluster().pass_high = 4   # read at the pass's start, before the pipeline consumed offsets 4..9
    report = reconcile.reconcile_all()[0]
    assert not ahead(report)
    assert report.partitions[0].high_watermark == 10
    assert cluster().calls["watermarks"] == 1 and cluster().calls["committed_offsets"] == 1


def test_a_position_past_the_log_end_read_again_is_ahead(pipelines, cluster):
    pipelines(1)
    reconcile.reconcile_all()
    cluster().pass_high = cluster().own_high = 4   # the log really ends below the position (topic recreated)
    report = reconcile.reconcile_all()[0]
    assert [(f.start, f.end) for f in ahead(report)] == [(4, 10)]
    assert report.status == "ERR"
