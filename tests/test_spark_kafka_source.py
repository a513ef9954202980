"""The tally_kafka Python Data Source against the real broker: exact records and offsets for bounded
ranges, across partitions, with empty partitions, up to the high watermark; and the streaming reader's
offset planning."""
import json

import pytest

from consumers.engine import spark_source as kafka_source
from consumers.engine.spark_session import get_spark
from consumers.kafka import admin as kafka_admin
from tests.producing import send

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture
def spark():
    return get_spark()


def produce(bootstrap, topic, per_partition: dict[int, int]):
    """Values "p:i" for i in 0..n-1 per partition, many per produce request (multi-record batches)."""
    send(topic, [(partition, str(i).encode(), f"{partition}:{i}".encode())
                 for partition, count in per_partition.items() for i in range(count)], bootstrap=bootstrap)


def read(spark, bootstrap, topic, starting, ending):
    frame = (spark.read.format("tally_kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", starting).option("endingOffsets", ending).load())
    return sorted((r.partition, r.offset, r.value.decode(), r.key.decode(), r.topic)
                  for r in frame.select("partition", "offset", "value", "key", "topic").collect())


def test_a_bounded_range_reads_exactly_its_records_across_partitions(spark, kafka_bootstrap, make_topic):
    topic = make_topic("src", partitions=3)
    produce(kafka_bootstrap, topic, {0: 120, 1: 40})  # partition 2 stays empty
    rows = read(spark, kafka_bootstrap, topic, json.dumps({topic: {"0": 10, "1": 0, "2": 0}}),
                json.dumps({topic: {"0": 105, "1": 25, "2": 0}}))
    expected = sorted([(0, o, f"0:{o}", str(o), topic) for o in range(10, 105)] +
                      [(1, o, f"1:{o}", str(o), topic) for o in range(0, 25)])
    assert rows == expected


def test_a_range_ending_at_the_high_watermark_reads_every_record_up_to_it(spark, kafka_bootstrap, make_topic):
    topic = make_topic("hw", partitions=3)
    produce(kafka_bootstrap, topic, {0: 333, 1: 1, 2: 0})
    highs = kafka_admin.high_watermarks(topic)
    assert highs == {0: 333, 1: 1, 2: 0}
    rows = read(spark, kafka_bootstrap, topic, "earliest", "latest")
    assert [(p, o) for p, o, *_ in rows] == [(0, o) for o in range(333)] + [(1, 0)]
    # The same range spelled as Spark's JSON, -1 meaning the high watermark.
    assert read(spark, kafka_bootstrap, topic, "earliest", json.dumps({topic: {"0": -1, "1": -1, "2": -1}})) == rows


def test_an_empty_range_reads_nothing(spark, kafka_bootstrap, make_topic):
    topic = make_topic("none", partitions=2)
    produce(kafka_bootstrap, topic, {0: 5})
    assert read(spark, kafka_bootstrap, topic, "latest", "latest") == []
    assert read(spark, kafka_bootstrap, topic, json.dumps({topic: {"0": 3}}), json.dumps({topic: {"0": 3}})) == []


def test_each_topic_partition_range_is_one_spark_partition(spark, kafka_bootstrap, make_topic):
    topic = make_topic("split", partitions=3)
    produce(kafka_bootstrap, topic, {0: 7, 1: 9, 2: 0})
    frame = (spark.read.format("tally_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
             .option("subscribe", topic).load())
    per_spark_partition = frame.rdd.glom().map(lambda rows: sorted({r.partition for r in rows})).collect()
    assert sorted(per_spark_partition) == [[0], [1]]  # the empty partition 2 gets no task


def test_the_stream_reader_starts_at_the_given_offsets_and_ends_at_the_high_watermark(kafka_bootstrap, make_topic):
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    topic = make_topic("stream", partitions=2)
    produce(kafka_bootstrap, topic, {0: 50, 1: 10})
    # Spark hands options over with lower-cased keys.
    reader = kafka_source.TallyKafkaDataSource({"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic,
                                                "startingoffsets": json.dumps({topic: {"0": 20}})}
                                               ).streamReader(kafka_source.SCHEMA)
    start = reader.initialOffset()
    assert start == {topic: {"0": 20, "1": 0}}
    assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 50, "1": 10}}
    capped = reader.latestOffset(start, ReadMaxRows(16))
    assert capped == {topic: {"0": 28, "1": 8}}
    ranges = reader.partitions(start, capped)
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 20, 28), (1, 0, 8)]
    offsets = [batch.column("offset").to_pylist() for batch in reader.read(ranges[0])]
    assert sum(offsets, []) == list(range(20, 28))


def test_a_read_limit_is_shared_fairly_and_never_exceeded():
    assert kafka_source.cap_ranges({0: 0, 1: 0, 2: 0}, {0: 100, 1: 3, 2: 0}, 50) == {0: 47, 1: 3, 2: 0}
    assert kafka_source.cap_ranges({0: 10, 1: 0}, {0: 12, 1: 1}, 100) == {0: 12, 1: 1}
    assert kafka_source.cap_ranges({0: 0, 1: 0}, {0: 10, 1: 10}, 1) == {0: 1, 1: 0}


def test_offsets_use_sparks_json_shape():
    assert kafka_source.offsets_json("nums", {1: 5, 0: 7}) == '{"nums": {"0": 7, "1": 5}}'
    assert kafka_source.parse_offsets('{"nums": {"0": 7}}', "nums") == {0: 7}
    with pytest.raises(kafka_source.KafkaSourceError, match="other"):
        kafka_source.parse_offsets('{"other": {"0": 7}}', "nums")
