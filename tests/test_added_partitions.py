"""Partitions added to a topic after a pipeline started are read from their earliest offset (whatever the
reset policy: their records were produced since), written exactly once, reconciled and counted in
"caught up". The embedded broker does not implement CreatePartitions, so the pipeline here stored positions
when its topic had one partition, and the second one appears later."""
import pytest

from consumers.engine import caught_up, commit, db
from consumers.engine.python import run_pipeline
from consumers.models import DeliveryMode, PartitionOffset, ResetPolicy
from consumers.reconciliation.reconcile import reconcile_pipeline
from tests.chaos import sink_counts
from tests.conftest import drop_sink_tables
from tests.pipelines import create_pipeline
from tests.producing import into, send

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_client")]


def test_a_partition_added_since_the_pipeline_started_is_read_from_its_start(transactional_db, kafka_bootstrap,
                                                                              make_topic):
    topic = make_topic("grow", partitions=2)
    pipeline = create_pipeline(topic, topic, f"sink_{topic}".replace("-", "_"), "int_value",
                               DeliveryMode.EXACTLY_ONCE, batch_size=10, reset_policy=ResetPolicy.LATEST)
    try:
        conn = db.connect()
        commit.ensure_positions(conn, pipeline.pk, {0: 0})  # the pipeline's start: one partition then
        conn.close()
        send(topic, [*into(0, range(1, 21)), *into(1, range(21, 31))])
        assert not caught_up.topic_caught_up(pipeline).done  # partition 1 has no position yet: not caught up
        result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=90)
        assert result.reason == "caught_up", result.detail
        assert sink_counts(pipeline.sink_table) == {value: 1 for value in range(1, 31)}
        positions = dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))
        assert positions == {0: 20, 1: 10}
        report = reconcile_pipeline(pipeline)
        assert [p.partition for p in report.partitions] == [0, 1]
        assert (report.lost, report.duplicated, report.lag_records, report.status) == (0, 0, 0, "OK")
    finally:
        drop_sink_tables([pipeline.sink_table])
