"""The Python engine's side of kafka-python: the consumer and what a poll fetched.
(Kafka offset commits are the run's: consumers/engine/lifecycle.py `KafkaPositions`.)

Runs assign() their partitions (consumers/engine/shares.py decides which, from the database) and join no
consumer group, in every mode: the classic modes only read their positions from the group's committed
offsets and write them back there.
"""
from django.conf import settings
from kafka import KafkaConsumer

from consumers.engine.commit import Fetch
from consumers.kafka import clusters

METADATA_MAX_AGE_MS = 10_000
FETCH_MAX_WAIT_MS = 1000


def heartbeat_interval_ms(session_timeout_ms: int) -> int:
    # Kafka wants heartbeats well inside the session; a third of it, at most one per second.
    return max(100, min(1000, session_timeout_ms // 3))


def make_consumer(group_id: str, *, client_id: str, reset_policy: str, max_poll_records: int,
                  isolation_level: str = "read_committed", cluster=None, **overrides) -> KafkaConsumer:
    """A consumer of `cluster` (consumers/kafka/clusters.py) that reads nothing until the caller assign()s
    partitions; `group_id` is where its offsets are committed (and, in the classic modes, read back), not a
    group it joins."""
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
    return clusters.consumer(cluster, **config)


def records_by_partition(polled: dict) -> dict[int, list]:
    """A poll's records per partition, in offset order, as kafka-python returned them: the commit protocol
    reads .partition/.offset/.key/.value, and converts them to SourceRecords only for a transform called per
    record (consumers/engine/transforms.py `as_source_records`)."""
    return {tp.partition: records for tp, records in polled.items() if records}


def fetches_of_poll(consumer: KafkaConsumer, batches: dict[int, list], fetched: dict) -> dict[int, Fetch]:
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
