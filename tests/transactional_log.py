"""Transactional topics on the real broker: committed and aborted transactions mixed, so the log has
holes (a marker per transaction, aborted records skipped under read_committed).

On the embedded broker, 3 transactions of 5 records with the middle one aborted leave a marker after
each transaction (offsets 5, 11, 17; log end 18). That broker sends no aborted-transaction list in its
Fetch replies, so even a read_committed consumer gets the aborted records there (real Kafka drops
them): tests compare a sink with what a read_committed consumer reads from the topic (`topic_values`),
which is exactly "the records the topic holds" on either broker.
"""
import time
import uuid

from django.conf import settings
from kafka import KafkaConsumer, KafkaProducer, TopicPartition


def produce_transactions(topic: str, transactions, partitions: int = 1) -> list[int]:
    """`transactions`: a list of (values, commit?) pairs. Each transaction sends its values round-robin
    over the partitions and then commits or aborts. Returns the values of committed transactions: what
    a read_committed consumer must deliver, exactly once."""
    producer = KafkaProducer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS,
                             transactional_id=f"tally-tests-{uuid.uuid4().hex[:8]}", acks="all")
    deadline = time.monotonic() + 10
    while len(producer.partitions_for(topic) or ()) < partitions and time.monotonic() < deadline:
        time.sleep(0.1)
    producer.init_transactions()
    committed = []
    try:
        for values, commit in transactions:
            producer.begin_transaction()
            for i, value in enumerate(values):
                producer.send(topic, str(value).encode(), partition=i % partitions)
            producer.flush(timeout=30)
            if commit:
                producer.commit_transaction()
                committed += list(values)
            else:
                producer.abort_transaction()
    finally:
        producer.close(timeout=5)
    return committed


def mixed_transactions(count: int, size: int = 5, abort_every: int = 3, start: int = 1):
    """`count` transactions of `size` consecutive values; every `abort_every`-th one (the 2nd, 5th, ...)
    is aborted."""
    result = []
    for t in range(count):
        values = range(start + t * size, start + (t + 1) * size)
        result.append((values, t % abort_every != 1))
    return result


def topic_values(topic: str, timeout_s: float = 20.0) -> list[int]:
    """Every value a read_committed consumer reads from the whole topic (each partition to its end)."""
    return [int(value) for _, value, _ in read_committed(topic, timeout_s).values()]


def read_committed(topic: str, timeout_s: float) -> dict[tuple[int, int], tuple]:
    """{(partition, offset): (key, value, timestamp)}, in the order read, of every record a read_committed
    consumer reads from the whole topic (each partition to its end); fails after `timeout_s`, as given."""
    consumer = KafkaConsumer(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, group_id=None,
                             enable_auto_commit=False, isolation_level="read_committed")
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        found = {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                for r in records:
                    found[(tp.partition, r.offset)] = (r.key, r.value, r.timestamp)
            highs = [consumer.highwater(tp) for tp in tps]
            if all(h is not None and consumer.position(tp) >= h for tp, h in zip(tps, highs, strict=True)):
                return found
        raise AssertionError(f"could not read {topic} to its end")
    finally:
        consumer.close()
