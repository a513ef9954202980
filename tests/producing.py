"""Writing records to the test broker: one producer recipe for every test.

Records leave many to a produce request (a linger and a large batch), as real producers send them: multi-record
batches are where the embedded broker's answers once differed from Kafka's. `send` returns once the broker has
acknowledged every record.
"""
from collections.abc import Iterable

from django.conf import settings
from kafka import KafkaProducer

from tests.waiting import wait_for

# One record: (partition, key, value). A partition of None lets the producer place it (by the key's hash).
Message = tuple[int | None, bytes | None, bytes | None]


def send(topic: str, messages: Iterable[Message], *, bootstrap: str | None = None, linger_ms: int = 20) -> None:
    """Send the messages in order, to `bootstrap` or the broker the settings point at."""
    messages = list(messages)
    highest = max((partition for partition, _, _ in messages if partition is not None), default=0)
    producer = KafkaProducer(bootstrap_servers=bootstrap or settings.KAFKA_BOOTSTRAP_SERVERS, acks="all",
                             linger_ms=linger_ms, batch_size=1 << 20)
    try:
        # A topic made a moment ago can be known with some of its partitions still missing.
        wait_for(lambda: len(producer.partitions_for(topic) or ()) > highest, 10, f"partition {highest} of {topic}")
        for partition, key, value in messages:
            producer.send(topic, value, key=key, partition=partition)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)


def numbered(count: int, partitions: int = 1, first: int = 1) -> Iterable[Message]:
    """The values first, first+1, ... as text, dealt round robin over the partitions from partition 0."""
    return ((i % partitions, None, str(first + i).encode()) for i in range(count))


def into(partition: int | None, values: Iterable) -> Iterable[Message]:
    """Each value as text, all into one partition (None: wherever the producer places it)."""
    return ((partition, None, str(value).encode()) for value in values)
