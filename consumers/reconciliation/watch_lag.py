"""A watched group's lag and status, shared by a watch's check (watch_audit) and the pass that only measures the
watches with nothing new to audit (watch_pass): lag in records (to the last stable offset) and in seconds (the age
of the record at the committed offset), whether the group has members, and each partition's status by the rules
every monitored consumer shares (monitored.partition_status)."""
from datetime import datetime

from consumers.models import Watch, WatchPartition
from consumers.reconciliation import monitored


def behind_log_start(wp: WatchPartition) -> bool:
    """The group's committed offset is below the log start: records it has not read were deleted (a loss)."""
    return wp.committed is not None and wp.log_start is not None and wp.committed < wp.log_start


def ahead_of_log_end(wp: WatchPartition) -> bool:
    """The group's committed offset is past the log end (broker data loss, an unclean leader election, a consumer
    committing offsets it never read): the records produced below it will never reach the group (a loss)."""
    return wp.committed is not None and wp.high_watermark is not None and wp.committed > wp.high_watermark


def committed_ahead(committed: dict, marks: dict) -> bool:
    """Whether any partition's commit is past the log end of these marks."""
    return any(offset is not None and p in marks and offset > marks[p].high for p, offset in committed.items())


def ahead_notes(parts: dict) -> list[str]:
    return [f"partition {p}: the group committed offset {wp.committed}, past the log end {wp.high_watermark}; "
            f"the records produced at offsets {wp.high_watermark} to {wp.committed - 1} will never reach it"
            for p, wp in sorted(parts.items()) if ahead_of_log_end(wp)]


def measure(watch: Watch, parts: dict, marks: dict, kafka, now: datetime, notes: list) -> None:
    """Lag in records (to the last stable offset: a read_committed consumer cannot pass an open transaction)
    and in seconds (the age of the record at the committed offset)."""
    behind = measure_records(parts, marks)
    if behind:
        ended: set[int] = set()
        try:
            stamps = kafka.record_timestamps(watch.topic, behind, ended=ended)
        except Exception as exc:  # lag in records stands; seconds stay unknown
            notes.append(lag_seconds_unknown(exc))
            stamps = {}
        measure_seconds(parts, stamps, now)
        caught_up(parts, ended)


def measure_records(parts: dict, marks: dict) -> dict[int, int]:
    """Lag in records of each partition; returns {partition: offset} of the records whose age is the lag in
    seconds of the partitions behind (the others' is 0, until measure_seconds says)."""
    behind = {}
    for p, wp in parts.items():
        mark = marks.get(p)
        if mark is None:
            continue
        wp.log_start, wp.high_watermark = mark.log_start, mark.high
        position = wp.committed if wp.committed is not None else wp.start_offset
        wp.lag_records = max(0, mark.end - position)
        wp.lag_seconds = 0.0 if wp.lag_records == 0 else None
        if wp.lag_records:
            behind[p] = max(position, mark.log_start)
    return behind


def measure_seconds(parts: dict, stamps: dict[int, int | None], now: datetime) -> None:
    """Lag in seconds from the timestamps (ms) of the records measure_records named."""
    for p, stamp in stamps.items():
        if stamp is not None:
            parts[p].lag_seconds = max(0.0, now.timestamp() - stamp / 1000)


def caught_up(parts: dict, ended) -> None:
    """Partitions whose committed offset has only holes before the log end (a consumer that committed its last
    record + 1, below the final transaction marker): nothing is left to consume, so no lag."""
    for p in ended:
        parts[p].lag_records, parts[p].lag_seconds = 0, 0.0


def lag_seconds_unknown(exc: Exception) -> str:
    return f"lag in seconds unknown: {type(exc).__name__}"


def evaluate(parts: dict, alive: bool, rewound: set, now: datetime, history: dict, created_at: datetime) -> None:
    """Each partition's status, by the rules every monitored consumer shares, over `history` (the window's lag
    samples per partition, monitored.window_samples)."""
    for p, wp in parts.items():
        wp.status = monitored.partition_status(
            history.get(p, []), position=wp.committed, lag=wp.lag_records, moved_at=wp.moved_at or created_at,
            alive=alive, rewound=p in rewound,
            incident=bool(wp.lost or wp.duplicated or wp.phantom) or behind_log_start(wp) or ahead_of_log_end(wp),
            now=now)


def group_alive(kafka, group_id: str, notes: list) -> bool:
    try:
        return kafka.describe_group(group_id).has_active_members
    except Exception as exc:  # noqa: BLE001 - unknown membership: a stuck group then reads as stopped
        notes.append(f"group membership unknown: {type(exc).__name__}")
        return False
