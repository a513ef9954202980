"""Parked runs: a run idle for `TALLY_PARK_IDLE_SECONDS` closes its Kafka consumer and waits here; one thread per
process reads the log ends of every parked run's partitions, in one ListOffsets per cluster about twice a second,
and wakes a run when its partitions hold records past its positions (or its topic has more partitions).

Why (docs/benchmarks.md "200 pipelines and 200 watches in one worker"): an engine host holds hundreds of runs,
almost all idle, and an idle run's cost was almost all its own consumer's: a fetch a second to the broker and the
client's threads. 200 idle librdkafka consumers alone cost about 9 % of a core. A parked run costs one check a
second of its heartbeat verdict, in memory.

What parking keeps true: a parked run holds its partitions (its claim and its row's assigned partitions stay),
heartbeats through the process's beat as before, ends at once when fenced or stopped, and reads again from its
stored positions when woken (consumers/engine/python.py `_park`), so the commit protocol never knows. What it
costs: a record that arrives for a parked run waits for the next check (`CHECK_INTERVAL_S`) and a new consumer.

The log end read here is ListOffsets' (the last stable offset for read_committed). It only has to tell "something
past this position": the embedded broker's "latest" can be too low for a multi-record batch (docs/embedded-broker.md),
but a batch appended after a position starts at or past it, so its answer still moves past the position.
"""
import logging
import threading
import time
from dataclasses import dataclass, field

from kafka import TopicPartition

from consumers.engine.per_process import PerProcess
from consumers.kafka import clusters

log = logging.getLogger("tally.engine")

CHECK_INTERVAL_S = 0.5
METADATA_INTERVAL_S = 10.0   # new partitions of a parked run's topic are noticed within this (as a run's consumer)


@dataclass(eq=False)
class Parked:
    """One parked run: where it stands, and the event that wakes it (with the reason)."""
    cluster: str
    topic: str
    isolation_level: str
    positions: dict[int, int]          # partition -> the offset its next record comes from
    partitions: set[int]               # the topic's partitions when it parked
    woken: threading.Event = field(default_factory=threading.Event)
    reason: str = ""

    def wake(self, reason: str) -> None:
        if not self.woken.is_set():
            self.reason = reason
            self.woken.set()


class Lot:
    """The parked runs of this process and the thread that watches their log ends (`lot()`)."""

    def __init__(self):
        self.parked: set[Parked] = set()
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumers: dict[tuple[str, str], object] = {}   # (cluster, isolation level) -> KafkaConsumer
        self._metadata_at: dict[tuple[str, str], float] = {}

    def park(self, parked: Parked) -> Parked:
        with self._lock:
            self.parked.add(parked)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="tally-parking", daemon=True)
                self._thread.start()
        self._changed.set()
        return parked

    def leave(self, parked: Parked) -> None:
        with self._lock:
            self.parked.discard(parked)

    def _serve(self) -> None:
        while True:
            self._changed.wait(CHECK_INTERVAL_S)
            self._changed.clear()
            try:
                self.check_once()
            except Exception:   # never let the watcher die: the runs would sleep through their records
                log.exception("checking the parked runs' log ends failed")

    def check_once(self, now: float | None = None) -> None:
        """Wake every parked run whose partitions hold records past its positions, or whose topic grew."""
        now = time.monotonic() if now is None else now
        with self._lock:
            parked = [p for p in self.parked if not p.woken.is_set()]
        by_client: dict[tuple[str, str], list[Parked]] = {}
        for run in parked:
            by_client.setdefault((run.cluster, run.isolation_level), []).append(run)
        for key in set(self._consumers) - set(by_client):
            self._drop(key)   # nothing parked on it: a process without parked runs holds no client
        for key, runs in by_client.items():
            try:
                ends, partitions = self._read(key, runs, now)
            except Exception as exc:
                # The runs' own consumers report what is wrong with the cluster, in their own words.
                log.warning("parked runs on cluster %s: log ends unreadable (%s); waking them", key[0], exc)
                self._drop(key)
                for run in runs:
                    run.wake(f"log ends unreadable: {exc}")
                continue
            for run in runs:
                if any(ends.get(TopicPartition(run.topic, p), 0) > offset for p, offset in run.positions.items()):
                    run.wake("records")
                elif partitions.get(run.topic) and not partitions[run.topic] <= run.partitions:
                    run.wake("the topic has new partitions")

    def _read(self, key, runs: list[Parked], now: float) -> tuple[dict, dict[str, set[int]]]:
        consumer = self._consumers.get(key)
        if consumer is None:
            cluster, isolation_level = key
            consumer = self._consumers[key] = clusters.consumer(
                cluster, group_id=None, enable_auto_commit=False, allow_auto_create_topics=False,
                isolation_level=isolation_level, client_id="tally-parking")
        partitions: dict[str, set[int]] = {}
        if now - self._metadata_at.get(key, float("-inf")) >= METADATA_INTERVAL_S:
            consumer.topics()   # one metadata request for every topic: partitions_for_topic reads it
            self._metadata_at[key] = now
            partitions = {run.topic: set(consumer.partitions_for_topic(run.topic) or ()) for run in runs}
        tps = sorted({TopicPartition(run.topic, p) for run in runs for p in run.positions})
        return (consumer.end_offsets(tps) if tps else {}), partitions

    def _drop(self, key) -> None:
        consumer = self._consumers.pop(key, None)
        self._metadata_at.pop(key, None)
        if consumer is not None:
            try:
                consumer.close()
            except Exception:
                pass


lot = PerProcess(Lot).get   # this process's lot
