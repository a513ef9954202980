"""The Spark engine on transactional topics: micro-batches end on positions (past transaction markers),
so every mode reads to the log end, writes every record the topic holds once, and reconciles exact."""
import pytest

from consumers.engine.spark import read_offset_log, run_pipeline
from consumers.engine.spark_session import get_spark
from consumers.kafka import admin as kafka_admin
from consumers.models import BatchLedger, DeliveryMode, PartitionOffset
from consumers.reconciliation.reconcile import reconcile_pipeline
from tests.chaos import sink_counts
from tests.spark_helpers import spark_pipelines
from tests.transactional_log import mixed_transactions, produce_transactions, topic_values

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture
def spark_tx_pipeline(transactional_db, kafka_bootstrap, make_topic):
    get_spark()
    with spark_pipelines() as spark_pipeline_on:
        def make(name, mode, partitions=2):
            topic = make_topic(name, partitions=partitions)
            produce_transactions(topic, mixed_transactions(12), partitions)
            return spark_pipeline_on(name, topic, mode)

        yield make


@pytest.mark.parametrize("mode", [DeliveryMode.EXACTLY_ONCE, DeliveryMode.AT_LEAST_ONCE, DeliveryMode.AT_MOST_ONCE])
def test_each_mode_on_spark_reads_a_transactional_topic_to_its_end_and_reconciles_exact(spark_tx_pipeline, mode):
    pipeline = spark_tx_pipeline(f"sparktx-{mode.replace('_', '')}", mode)
    held = topic_values(pipeline.topic)
    result = run_pipeline(pipeline.name, batch_size=9, stop_when_caught_up=True, max_seconds=180)
    assert result.reason == "caught_up", result.detail
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in held}
    highs = kafka_admin.high_watermarks(pipeline.topic)
    positions = dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))
    assert positions == highs
    assert sum(BatchLedger.objects.filter(pipeline=pipeline).values_list("records", flat=True)) == len(held)
    assert kafka_admin.committed_offsets(pipeline.group_id, pipeline.topic, sorted(highs)) == highs
    report = reconcile_pipeline(pipeline)
    assert (report.lost, report.duplicated, report.lag_records, report.status) == (0, 0, 0, "OK"), report.partitions


def test_the_offset_log_gives_a_micro_batchs_end_offsets(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_text('v1\n{"batchWatermarkMs":0}\n{"nums":{"0":12,"1":7}}\n')
    assert read_offset_log(str(tmp_path), 3, "nums") == {0: 12, 1: 7}
    assert read_offset_log(str(tmp_path), 4, "nums") == {}
