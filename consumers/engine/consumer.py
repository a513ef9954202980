"""The Python engine's Kafka consumer: one small interface, two clients behind it.

The engine (consumers/engine/python.py) and Kafka's copy of the positions (consumers/engine/lifecycle.py
`KafkaPositions`) talk to an `EngineConsumer` only, so the commit protocol never knows which client reads:
- `KafkaPythonConsumer`: kafka-python, the default (the project's design names it);
- `RdKafkaConsumer` (consumers/engine/rdkafka.py): librdkafka through confluent-kafka, the optional extra
  `tally[rdkafka]`; it fetches and decodes in C threads, outside the GIL.
`make_consumer(client, ...)` builds one; the client is the pipeline's `kafka_client`, or the worker's
TALLY_KAFKA_CLIENT when the pipeline leaves it to the worker (`client_for`).

Runs assign() their partitions (consumers/engine/shares.py decides which, from the database) and join no
consumer group, in every mode: the classic modes only read their positions from the group's committed
offsets and write them back there. A consumer reads one topic; partitions are plain ints.
"""
import logging
from collections.abc import Iterable
from typing import Protocol

from django.conf import settings
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import OffsetOutOfRangeError
from kafka.structs import OffsetAndMetadata

from consumers.engine.commit import Fetch
from consumers.kafka import clusters

log = logging.getLogger("tally.engine")

KAFKA_PYTHON = "kafka-python"
LIBRDKAFKA = "librdkafka"
CLIENTS = (KAFKA_PYTHON, LIBRDKAFKA)

METADATA_MAX_AGE_MS = 10_000
FETCH_MAX_WAIT_MS = 1000


class EngineConsumer(Protocol):
    """What the engine asks of a Kafka consumer of one topic.

    `poll` returns {partition: a sequence of records in offset order}, or raises PositionOutOfRange when the
    consumer was made with reset policy "none" and the log no longer holds a position; a record has
    `.partition`, `.offset`, `.key`, `.value`, `.timestamp` and `.headers` as Tally's `SourceRecord`
    (consumers/engine/transforms.py) does. kafka-python's records are kept as polled (they have those fields
    already); librdkafka's messages stay in a `MessageBatch` that builds a SourceRecord only for a record looked
    at (a copy per record is the hot path's cost). `position` is the offset the next record comes from, past any
    hole the client crossed (transaction markers, aborted or compacted records)."""

    topic: str
    client: str

    def poll(self, timeout_ms: int, max_records: int) -> dict[int, list]: ...
    def assign(self, partitions: Iterable[int]) -> None: ...
    def assignment(self) -> set[int]: ...
    def seek(self, partition: int, offset: int) -> None: ...
    def seek_to_beginning(self, partition: int) -> None: ...
    def position(self, partition: int) -> int | None: ...
    def committed(self, partition: int) -> int | None: ...
    def highwater(self, partition: int) -> int | None: ...
    def partitions(self) -> set[int] | None: ...
    def commit(self, ends: dict[int, int], *, wait: bool) -> None: ...
    def close(self) -> None: ...


class PositionOutOfRange(Exception):
    """Kafka answered that the log no longer holds these partitions' positions (retention or DeleteRecords moved its
    start past them, or the topic was recreated shorter). With reset policy "none" the client says so instead of
    moving the position on its own: an exactly-once run takes its positions from the database, which decides."""

    def __init__(self, partitions: Iterable[int], detail: str = ""):
        self.partitions = sorted(partitions)
        super().__init__(f"partition(s) {', '.join(map(str, self.partitions))}: the fetch position is out of the "
                         f"log's range{f' ({detail})' if detail else ''}")


def client_for(pipeline) -> str:
    """The client a pipeline's runs use: its own choice, or the worker's TALLY_KAFKA_CLIENT."""
    return getattr(pipeline, "kafka_client", "") or settings.TALLY_KAFKA_CLIENT


def heartbeat_interval_ms(session_timeout_ms: int) -> int:
    # Kafka wants heartbeats well inside the session; a third of it, at most one per second.
    return max(100, min(1000, session_timeout_ms // 3))


def make_consumer(group_id: str, *, topic: str, client_id: str, reset_policy: str, max_poll_records: int,
                  isolation_level: str = "read_committed", cluster=None, client: str = KAFKA_PYTHON,
                  **overrides) -> EngineConsumer:
    """A consumer of `topic` on `cluster` (consumers/kafka/clusters.py) that reads nothing until the caller
    assign()s partitions; `group_id` is where its offsets are committed (and, in the classic modes, read
    back), not a group it joins. `overrides` are kafka-python's keywords (kafka-python only)."""
    if client == LIBRDKAFKA:
        from consumers.engine.rdkafka import RdKafkaConsumer

        return RdKafkaConsumer(group_id, topic=topic, client_id=client_id, reset_policy=reset_policy,
                               max_poll_records=max_poll_records, isolation_level=isolation_level,
                               cluster=cluster)
    if client != KAFKA_PYTHON:
        raise ValueError(f"unknown Kafka client {client!r}: use one of {', '.join(CLIENTS)}")
    session_ms = settings.KAFKA_SESSION_TIMEOUT_MS
    # read_committed: records of aborted transactions never reach a sink (real Kafka returns them to
    # read_uncommitted consumers), and the consumer stops at the last stable offset.
    config = dict(group_id=group_id, client_id=client_id,
                  enable_auto_commit=False, auto_offset_reset=reset_policy, isolation_level=isolation_level,
                  session_timeout_ms=session_ms, heartbeat_interval_ms=heartbeat_interval_ms(session_ms),
                  request_timeout_ms=max(settings.KAFKA_REQUEST_TIMEOUT_MS, session_ms + 1000),
                  max_poll_records=max_poll_records,
                  # A run must never create its topic: on a broker with auto-creation on (real Kafka's
                  # default), a run still reading a deleted topic would bring it back empty.
                  allow_auto_create_topics=False,
                  # Partitions added to the topic are noticed within this (the default is 5 minutes).
                  metadata_max_age_ms=METADATA_MAX_AGE_MS,
                  # An idle fetch waits on the broker this long (it answers at once when a record arrives): half
                  # the wake-ups of the default 500 ms, for hundreds of idle runs in one worker.
                  fetch_max_wait_ms=FETCH_MAX_WAIT_MS)
    config.update(overrides)
    return KafkaPythonConsumer(clusters.consumer(cluster, **config), topic)


class KafkaPythonConsumer:
    """kafka-python's KafkaConsumer behind the engine's interface."""

    client = KAFKA_PYTHON

    def __init__(self, consumer: KafkaConsumer, topic: str):
        self.kafka, self.topic = consumer, topic

    @property
    def isolation_level(self) -> str:
        return self.kafka.config["isolation_level"]

    def _tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.topic, partition)

    def poll(self, timeout_ms: int, max_records: int) -> dict[int, list]:
        try:
            polled = self.kafka.poll(timeout_ms=timeout_ms, max_records=max_records)
        except OffsetOutOfRangeError as exc:   # raised only without a reset policy; {TopicPartition: offset}
            positions = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
            raise PositionOutOfRange([tp.partition for tp in positions],
                                     ", ".join(f"p{tp.partition} at {o}" for tp, o in positions.items())) from exc
        return {tp.partition: records for tp, records in polled.items() if records}

    def assign(self, partitions: Iterable[int]) -> None:
        self.kafka.assign([self._tp(p) for p in sorted(partitions)])

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.kafka.assignment()}

    def seek(self, partition: int, offset: int) -> None:
        self.kafka.seek(self._tp(partition), offset)

    def seek_to_beginning(self, partition: int) -> None:
        self.kafka.seek_to_beginning(self._tp(partition))

    def position(self, partition: int) -> int | None:
        return self.kafka.position(self._tp(partition), timeout_ms=1000)

    def committed(self, partition: int) -> int | None:
        return self.kafka.committed(self._tp(partition), timeout_ms=settings.KAFKA_REQUEST_TIMEOUT_MS)

    def highwater(self, partition: int) -> int | None:
        return self.kafka.highwater(self._tp(partition))

    def partitions(self) -> set[int] | None:
        return self.kafka.partitions_for_topic(self.topic)

    def commit(self, ends: dict[int, int], *, wait: bool) -> None:
        offsets = {self._tp(p): OffsetAndMetadata(end, "", -1) for p, end in ends.items()}
        if wait:
            self.kafka.commit(offsets, timeout_ms=settings.KAFKA_REQUEST_TIMEOUT_MS)
        else:
            self.kafka.commit_async(offsets, callback=_log_async_commit_failure)

    def close(self) -> None:
        # close() does not call on_partitions_revoked; nothing is pending here, so nothing is lost.
        self.kafka.close(autocommit=False, timeout_ms=5000)


def _log_async_commit_failure(offsets, response):
    if isinstance(response, Exception):
        log.warning("Kafka offset commit %s failed: %s",
                    {tp.partition: meta.offset for tp, meta in offsets.items()}, response)


def fetches_of_poll(consumer: EngineConsumer, batches: dict[int, list], fetched: dict[int, int]) -> dict[int, Fetch]:
    """Each partition's `Fetch` of the poll that returned `batches`: from the position it was fetched from
    (`fetched`, updated here) to the consumer's position now. A partition that returned no record but
    whose position moved crossed a hole (a transaction marker, aborted records)."""
    fetches = {}
    assignment = consumer.assignment()
    for partition in list(fetched):
        if partition not in assignment:
            del fetched[partition]
    for partition in assignment:
        records = batches.get(partition)
        start = fetched.get(partition)
        if start is None and not records:
            continue  # not fetched yet: its position is still being looked up
        position = consumer.position(partition)
        if position is None:
            continue
        if start is None:
            start = records[0].offset
        if records and position <= records[-1].offset:
            position = records[-1].offset + 1  # never behind what was returned (a seek meanwhile)
        fetched[partition] = position
        if records or position > start:
            fetches[partition] = Fetch(start, position)
    return fetches
