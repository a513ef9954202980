"""Reading ranges of positions from a topic, as a read_committed consumer sees them.

A range [start, stop) is positions, not records: transaction markers take offsets, aborted records are
skipped under read_committed, compaction removes records. The reader seeks to `start` and polls until the
consumer's position reaches `stop` (or the log end), so every record the range holds is handed over once,
and a hole is simply never handed over.
"""
import time
from collections.abc import Callable

from kafka import TopicPartition
from kafka.errors import OffsetOutOfRangeError

from consumers.kafka.admin import KafkaAdminError, probe_consumer

# Large fetches: an audit reads whole ranges, not single records (kafka-python's defaults are 1 MiB per
# partition and 50 MiB per fetch).
MAX_PARTITION_FETCH_BYTES = 8 << 20
# Records per poll: enough to amortise the poll's overhead, small enough to keep the Python lists short.
POLL_RECORDS = 50_000
# Give up when a range makes no progress for this long (a broker that stopped answering).
STALL_TIMEOUT_S = 30.0


def read_ranges(topic: str, ranges: dict[int, tuple[int, int]], on_records: Callable[[int, list], None], *,
                cluster=None, stall_timeout_s: float = STALL_TIMEOUT_S) -> dict[int, int]:
    """Call `on_records(partition, records)` with the committed records of each partition's [start, stop),
    in offset order (kafka-python ConsumerRecords: .offset, .key, .value, .timestamp), from `cluster` (a name,
    a Cluster, or None: the default; consumers/kafka/clusters.py builds the consumer). Returns where each
    partition's read ended: `stop`, or the log end when the log ends first."""
    wanted = {p: (s, e) for p, (s, e) in ranges.items() if e > s}
    ended: dict[int, int] = {p: s for p, (s, _) in ranges.items()}
    if not wanted:
        return ended
    # auto_offset_reset="none": a start that retention removed since the caller read the log start must fail the
    # read; kafka-python's default would jump to the log end and hand the range over as read, with no record.
    consumer = probe_consumer(cluster, isolation_level="read_committed", auto_offset_reset="none",
                              max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES, fetch_max_bytes=64 << 20,
                              fetch_max_wait_ms=50, receive_buffer_bytes=4 << 20)
    try:
        tps = {p: TopicPartition(topic, p) for p in wanted}
        consumer.assign(list(tps.values()))
        for p, tp in tps.items():
            consumer.seek(tp, wanted[p][0])
        pending = set(wanted)
        progress_at, last_positions = time.monotonic(), {}
        while pending:
            try:
                polled = consumer.poll(timeout_ms=200, max_records=POLL_RECORDS)
            except OffsetOutOfRangeError as exc:
                named = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
                gone = {tp.partition: offset for tp, offset in named.items()}
                raise KafkaAdminError(f"{topic}: offsets {gone} are outside the log (below its start: removed by "
                                      "retention since the start was read); read again from the new log start"
                                      ) from None
            for tp, records in polled.items():
                p = tp.partition
                if p not in pending:
                    continue
                stop = wanted[p][1]
                inside = [r for r in records if r.offset < stop] if records[-1].offset >= stop else records
                if inside:
                    on_records(p, inside)
            for p in list(pending):
                tp, stop = tps[p], wanted[p][1]
                position = consumer.position(tp)
                high = consumer.highwater(tp)
                if position >= stop or (high is not None and position >= high):
                    ended[p] = min(position, stop)
                    pending.discard(p)
                    consumer.pause(tp)
                elif last_positions.get(p) != position:
                    last_positions[p] = position
                    progress_at = time.monotonic()
            if pending and time.monotonic() - progress_at > stall_timeout_s:
                raise KafkaAdminError(f"{topic}: reading partitions {sorted(pending)} made no progress for "
                                      f"{stall_timeout_s:.0f} s")
    finally:
        consumer.close()
    return ended
