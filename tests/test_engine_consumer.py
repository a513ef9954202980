"""The engine's consumer interface (consumers/engine/consumer.py `EngineConsumer`) behaves the same with both
clients on the real broker: partitions, assign and seek, records with Tally's fields, positions and the high
watermark, and the group's offsets written and read back without joining the group."""
import uuid

import pytest
from kafka import KafkaProducer

from consumers.engine.consumer import make_consumer
from tests.waiting import patience, wait_for

pytestmark = [pytest.mark.kafka]


def test_the_consumer_interface_is_the_same_with_either_client(kafka_bootstrap, make_topic, kafka_client):
    topic = make_topic("iface", partitions=2)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for i in range(10):
        producer.send(topic, key=f"k{i}".encode(), value=str(i).encode(), partition=i % 2,
                      headers=[("h", b"v")])
    producer.flush()
    producer.close()
    consumer = make_consumer(f"g-{uuid.uuid4().hex[:8]}", topic=topic, client_id="tally-test", reset_policy="earliest",
                             max_poll_records=100, client=kafka_client)
    try:
        assert consumer.client == kafka_client and consumer.partitions() == {0, 1}
        consumer.assign([0, 1])
        assert consumer.assignment() == {0, 1}
        consumer.seek(0, 2)                     # the database's next_offset, say
        consumer.seek_to_beginning(1)
        records = {0: [], 1: []}

        def read_all():
            for partition, batch in consumer.poll(timeout_ms=200, max_records=100).items():
                records[partition] += batch
            return len(records[0]) == 3 and len(records[1]) == 5

        wait_for(read_all, patience(30), "every record after the seeks")
        assert [r.offset for r in records[0]] == [2, 3, 4] and [r.offset for r in records[1]] == [0, 1, 2, 3, 4]
        first = records[0][0]
        assert (first.partition, first.key, first.value) == (0, b"k4", b"4")
        assert first.timestamp > 0 and list(first.headers) == [("h", b"v")]
        assert consumer.position(0) == 5 and consumer.position(1) == 5
        assert consumer.highwater(0) == 5
        assert consumer.committed(0) is None
        consumer.commit({0: 5, 1: 3}, wait=True)
        assert (consumer.committed(0), consumer.committed(1)) == (5, 3)
        consumer.assign([1])                    # a share handed over: partition 0 is no longer read
        assert consumer.assignment() == {1}
    finally:
        consumer.close()
