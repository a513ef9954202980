"""The engine's librdkafka consumer (confluent-kafka, the optional extra `tally[rdkafka]`).

Why: kafka-python fetches and decodes record batches in Python, holding the GIL; librdkafka does it in its
own C threads and hands over whole messages, so one exactly-once process spends its Python time on the
commit protocol, not on decoding (docs/benchmarks.md "librdkafka").

Same protocol as kafka-python (consumers/engine/consumer.py `EngineConsumer`), with librdkafka's rules:
- A partition is handed to librdkafka only once the engine has said where it starts: `assign()` notes the
  partitions, `seek()` (the database's next_offset, or Kafka's committed offset) assigns each at its offset
  (`incremental_assign`, since librdkafka refuses a seek on a partition it is not fetching yet). One the engine
  did not seek starts from the group's committed offset, else from the reset policy, resolved when its position
  is first asked or at the next poll, whichever is first: as kafka-python does (a position resolved later, by
  librdkafka itself, would make "latest" skip records produced in between).
- `position()` is librdkafka's: past transaction markers and aborted records even when the poll returned none
  of them; invalid (None here) right after a seek, until the partition is fetched again.
- A poll returns as soon as a record is there, as kafka-python's does: librdkafka's `consume(n, timeout)` waits
  for n records or the whole timeout, so the poll waits for one (`poll`), then takes what is fetched already
  (`consume(n - 1, 0)`). An idle run still wakes once per timeout; a busy one gets full batches from the
  prefetched queue.
"""
import logging
import time
from collections.abc import Iterable, Sequence

from django.conf import settings

from consumers.engine.consumer import PositionOutOfRange
from consumers.engine.transforms import SourceRecord
from consumers.kafka import clusters

log = logging.getLogger("tally.engine")

# Logical offsets of librdkafka (rdkafka.h).
OFFSET_BEGINNING, OFFSET_STORED = -2, -1000
RESET_POLICIES = {"earliest": "earliest", "latest": "latest", "none": "error"}
ERROR_LOG_INTERVAL_S = 10.0
# The topic's partitions are asked of the broker at most this often (a Metadata request each time; kafka-python
# answers from metadata it refreshes as often): a run balances every second, and a worker hosts hundreds of runs.
PARTITIONS_MAX_AGE_S = 10.0


class RdKafkaError(RuntimeError):
    """librdkafka reported an error the run cannot go on from (it ends the run with this message)."""


def _import():
    try:
        import confluent_kafka
    except ImportError as exc:  # validated where a pipeline chooses it; a worker without the extra says so
        raise RdKafkaError("the librdkafka client needs the rdkafka extra: pip install 'tally[rdkafka]'") from exc
    return confluent_kafka


def _record(message) -> SourceRecord:
    return SourceRecord(message.partition(), message.offset(), message.key(), message.value(),
                        message.timestamp()[1], message.headers() or ())


class MessageBatch(Sequence):
    """One partition's messages of a poll, read as Tally's records (`SourceRecord`, built when a record is
    looked at). The commit protocol's fast path asks only for the values and offsets (`values_and_offsets`):
    a SourceRecord per message would cost it more than librdkafka's whole fetch (docs/benchmarks.md)."""

    __slots__ = ("messages",)

    def __init__(self, messages: list):
        self.messages = messages

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [_record(m) for m in self.messages[index]]
        return _record(self.messages[index])

    def __iter__(self):
        return map(_record, self.messages)

    def values_and_offsets(self) -> tuple[list, list]:
        messages = self.messages
        return [m.value() for m in messages], [m.offset() for m in messages]


class RdKafkaConsumer:
    client = "librdkafka"

    def __init__(self, group_id: str, *, topic: str, client_id: str, reset_policy: str, max_poll_records: int,
                 isolation_level: str = "read_committed", cluster=None):
        ck = _import()
        self._ck, self._TP = ck, ck.TopicPartition
        self.topic, self.isolation_level, self.reset_policy = topic, isolation_level, reset_policy
        self._held: set[int] = set()      # what the engine assign()ed
        self._waiting: set[int] = set()   # assign()ed, not yet given to librdkafka (no seek yet)
        self._last_error_log = 0.0
        self._partitions: tuple[float, set[int]] | None = None   # (when asked, the topic's partitions)
        config = {
            "group.id": group_id, "client.id": client_id,
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "auto.offset.reset": RESET_POLICIES.get(reset_policy, reset_policy),
            # read_committed: as kafka-python's consumer (aborted records never reach a sink; stop at the LSO).
            "isolation.level": isolation_level,
            "enable.partition.eof": False,
            # A run must never create its topic (see consumers/engine/consumer.py).
            "allow.auto.create.topics": False,
            # Partitions added to the topic are noticed within this, as with kafka-python.
            "topic.metadata.refresh.interval.ms": 10_000,
            # An idle fetch waits on the broker this long. 5 s cost less idle (0.032 % of a core per consumer against
            # 0.047 % at 1 s) but gave 200 pipelines in one worker a produce-to-commit p95 of 2.2 s (docs/benchmarks.md
            # "Workers"): 1 s.
            "fetch.wait.max.ms": 1000,
            # Prefetched records held per consumer: librdkafka's default is 64 MiB; a worker hosts many runs, and a
            # batch of 20,000 small records is a few MiB.
            "queued.max.messages.kbytes": 16384,
            "socket.timeout.ms": settings.KAFKA_REQUEST_TIMEOUT_MS,
            "on_commit": self._on_commit, "error_cb": self._on_error,
            "logger": logging.getLogger("tally.rdkafka"),
        }
        self.consumer = clusters.rdkafka_consumer(cluster, config)

    def __repr__(self):
        return f"<RdKafkaConsumer {self.topic} holding {sorted(self._held)}>"

    # --- partitions ---------------------------------------------------------------------------------
    def assign(self, partitions: Iterable[int]) -> None:
        partitions = set(partitions)
        gone = self._held - partitions
        active = gone - self._waiting
        if active:
            self.consumer.incremental_unassign([self._TP(self.topic, p) for p in sorted(active)])
        self._waiting = (self._waiting - gone) | (partitions - self._held)
        self._held = partitions

    def assignment(self) -> set[int]:
        return set(self._held)

    def seek(self, partition: int, offset: int) -> None:
        tp = self._TP(self.topic, partition, offset)
        if partition in self._waiting:
            self._waiting.discard(partition)
            self.consumer.incremental_assign([tp])
            return
        try:
            self.consumer.seek(tp)
        except self._ck.KafkaException:
            # Not fetching yet (assigned a moment ago): assign it again at the offset.
            self.consumer.incremental_unassign([self._TP(self.topic, partition)])
            self.consumer.incremental_assign([tp])

    def seek_to_beginning(self, partition: int) -> None:
        self.seek(partition, OFFSET_BEGINNING)

    def position(self, partition: int) -> int | None:
        if partition not in self._held:
            return None
        if partition in self._waiting:
            return self._start([partition]).get(partition)
        offset = self.consumer.position([self._TP(self.topic, partition)])[0].offset
        return offset if offset >= 0 else None

    def committed(self, partition: int) -> int | None:
        tp = self.consumer.committed([self._TP(self.topic, partition)],
                                     timeout=settings.KAFKA_REQUEST_TIMEOUT_MS / 1000)[0]
        if tp.error is not None:
            raise self._ck.KafkaException(tp.error)
        return tp.offset if tp.offset >= 0 else None

    def highwater(self, partition: int) -> int | None:
        _, high = self.consumer.get_watermark_offsets(self._TP(self.topic, partition), cached=True)
        return high if high >= 0 else None

    def partitions(self) -> set[int] | None:
        now = time.monotonic()
        if self._partitions is not None and now - self._partitions[0] < PARTITIONS_MAX_AGE_S:
            return set(self._partitions[1])
        metadata = self.consumer.list_topics(self.topic, timeout=settings.KAFKA_REQUEST_TIMEOUT_MS / 1000)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            return None
        self._partitions = (now, set(topic.partitions))
        return set(topic.partitions)

    # --- records ------------------------------------------------------------------------------------
    def poll(self, timeout_ms: int, max_records: int) -> dict[int, list]:
        if self._waiting:
            self._start(sorted(self._waiting))
        first = self.consumer.poll(timeout_ms / 1000)
        if first is None:
            return {}
        messages = [first]
        if max_records > 1:
            messages += self.consumer.consume(max_records - 1, 0)
        by_partition: dict[int, list] = {}
        for m in messages:
            if m.error() is not None:
                self._message_error(m)
                continue
            partition = m.partition()
            found = by_partition.get(partition)
            if found is None:
                by_partition[partition] = [m]
            else:
                found.append(m)
        return {partition: MessageBatch(found) for partition, found in by_partition.items()}

    def _start(self, partitions: list[int]) -> dict[int, int]:
        """Partitions assigned and never sought: from the group's committed offset, else the reset policy,
        resolved now. Returns the offsets resolved."""
        starts = {}
        for p in partitions:
            offset = self.committed(p)
            if offset is None and self.reset_policy in ("earliest", "latest"):
                low, high = self.consumer.get_watermark_offsets(self._TP(self.topic, p),
                                                                timeout=settings.KAFKA_REQUEST_TIMEOUT_MS / 1000)
                offset = low if self.reset_policy == "earliest" else high
            if offset is not None:
                starts[p] = offset
        # "none" without a committed offset: librdkafka's own error at the first fetch ends the run.
        self.consumer.incremental_assign([self._TP(self.topic, p, starts.get(p, OFFSET_STORED)) for p in partitions])
        self._waiting.difference_update(partitions)
        return starts

    def _message_error(self, message) -> None:
        error = message.error()
        codes = self._ck.KafkaError
        if error.code() in (codes._AUTO_OFFSET_RESET, codes.OFFSET_OUT_OF_RANGE):
            raise PositionOutOfRange([message.partition()], error.str())
        if error.fatal() or error.code() in (codes.TOPIC_AUTHORIZATION_FAILED, codes._AUTHENTICATION):
            raise RdKafkaError(f"partition {message.partition()}: {error.str()}")
        self._log_error(f"partition {message.partition()}: {error.str()}")

    # --- offsets in Kafka ---------------------------------------------------------------------------
    def commit(self, ends: dict[int, int], *, wait: bool) -> None:
        offsets = [self._TP(self.topic, p, end) for p, end in sorted(ends.items())]
        if wait:
            for tp in self.consumer.commit(offsets=offsets, asynchronous=False) or ():
                if tp.error is not None:
                    raise self._ck.KafkaException(tp.error)
        else:
            self.consumer.commit(offsets=offsets, asynchronous=True)   # the result comes to _on_commit

    def close(self) -> None:
        self.consumer.close()

    # --- callbacks (served inside consume()) --------------------------------------------------------
    def _on_commit(self, error, partitions) -> None:
        if error is not None:
            log.warning("Kafka offset commit %s failed: %s", {tp.partition: tp.offset for tp in partitions}, error)

    def _on_error(self, error) -> None:
        if error.fatal():
            log.error("librdkafka: %s", error.str())
        else:
            self._log_error(error.str())   # transient (a broker down, a timeout): librdkafka retries

    def _log_error(self, text: str) -> None:
        now = time.monotonic()
        if now - self._last_error_log >= ERROR_LOG_INTERVAL_S:
            self._last_error_log = now
            log.warning("librdkafka (%s): %s", self.topic, text)
