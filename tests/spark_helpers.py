"""Helpers shared by the Spark engine tests: produce the classic values, read a sink row by row."""
from kafka import KafkaProducer

from tests.sink_rows import provenance_rows as sink_rows  # noqa: F401 - re-exported for the Spark tests


def produce_values(bootstrap, topic, count, partitions, first=1) -> dict[int, list[int]]:
    """Values first..first+count-1, value v to partition v % partitions; returns each partition's values in
    offset order (so log[p][offset] is the value at that offset)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20)
    log = {p: [] for p in range(partitions)}
    for value in range(first, first + count):
        partition = value % partitions
        producer.send(topic, str(value).encode(), partition=partition)
        log[partition].append(value)
    producer.flush()
    producer.close()
    return log


def expected_rows(log) -> list[tuple[int, int, int]]:
    return [(p, offset, value) for p in sorted(log) for offset, value in enumerate(log[p])]
