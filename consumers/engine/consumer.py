"""The Python engine's side of kafka-python: the consumer, the rebalance listener, what a poll fetched.
(Kafka offset commits are the run's: consumers/engine/lifecycle.py `KafkaPositions`.)

Exactly-once runs assign() their partitions (consumers/engine/shares.py decides which, from the database);
the classic modes subscribe with group management, since their positions are the group's committed offsets.
Rebalance callbacks run on kafka-python's IO thread (the one that also sends heartbeats), so the
listener does no I/O: it records newly assigned partitions, and the engine's thread handles them.
"""
import threading

from django.conf import settings
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener

from consumers.engine.commit import Fetch
from consumers.engine.transforms import SourceRecord

METADATA_MAX_AGE_MS = 10_000


def heartbeat_interval_ms(session_timeout_ms: int) -> int:
    # Kafka wants heartbeats well inside the session; a third of it, at most one per second.
    return max(100, min(1000, session_timeout_ms // 3))


def make_consumer(topic: str, group_id: str, *, client_id: str, reset_policy: str, max_poll_records: int,
                  listener: ConsumerRebalanceListener | None, isolation_level: str = "read_committed",
                  **overrides) -> KafkaConsumer:
    """A consumer of `topic` in `group_id` (for offset commits). With a `listener` it subscribes (group
    management); without one it reads nothing until the caller assign()s partitions."""
    session_ms = settings.KAFKA_SESSION_TIMEOUT_MS
    # read_committed: records of aborted transactions never reach a sink (real Kafka returns them to
    # read_uncommitted consumers), and the consumer stops at the last stable offset.
    config = dict(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, group_id=group_id, client_id=client_id,
                  enable_auto_commit=False, auto_offset_reset=reset_policy, isolation_level=isolation_level,
                  session_timeout_ms=session_ms, heartbeat_interval_ms=heartbeat_interval_ms(session_ms),
                  request_timeout_ms=max(settings.KAFKA_REQUEST_TIMEOUT_MS, session_ms + 1000),
                  max_poll_records=max_poll_records,
                  # Partitions added to the topic are noticed within this (the default is 5 minutes).
                  metadata_max_age_ms=METADATA_MAX_AGE_MS)
    config.update(overrides)
    consumer = KafkaConsumer(**config)
    if listener is not None:
        consumer.subscribe([topic], listener=listener)
    return consumer


class AssignmentTracker(ConsumerRebalanceListener):
    """Remembers which partitions the group gave this member since the engine last looked."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: set[TopicPartition] = set()
        self.rebalances = 0

    def on_partitions_revoked(self, revoked):
        with self._lock:
            self._pending -= set(revoked)

    def on_partitions_assigned(self, assigned):
        with self._lock:
            self._pending |= set(assigned)
            self.rebalances += 1

    def take_pending(self) -> set[TopicPartition]:
        with self._lock:
            pending, self._pending = self._pending, set()
            return pending

    def has_pending(self) -> bool:
        with self._lock:
            return bool(self._pending)


def to_source_records(polled: dict) -> dict[int, list[SourceRecord]]:
    """kafka-python's records -> the commit protocol's SourceRecords, per partition, in offset order."""
    batches = {}
    for tp, records in polled.items():
        if not records:
            continue
        batches[tp.partition] = [SourceRecord(r.partition, r.offset, r.key, r.value, r.timestamp)
                                 for r in records]
    return batches


def fetches_of_poll(consumer: KafkaConsumer, batches: dict[int, list[SourceRecord]], fetched: dict) -> dict[int, Fetch]:
    """Each partition's `Fetch` of the poll that returned `batches`: from the position it was fetched from
    (`fetched`, updated here) to the consumer's position now. A partition that returned no record but
    whose position moved crossed a hole (a transaction marker, aborted records)."""
    fetches = {}
    assignment = consumer.assignment()
    for tp in list(fetched):
        if tp not in assignment:
            del fetched[tp]
    for tp in assignment:
        records = batches.get(tp.partition)
        start = fetched.get(tp)
        if start is None and not records:
            continue  # not fetched yet: its position is still being looked up
        position = consumer.position(tp, timeout_ms=1000)
        if position is None:
            continue
        if start is None:
            start = records[0].offset
        if records and position <= records[-1].offset:
            position = records[-1].offset + 1  # never behind what was returned (a seek meanwhile)
        fetched[tp] = position
        if records or position > start:
            fetches[tp.partition] = Fetch(start, position)
    return fetches
