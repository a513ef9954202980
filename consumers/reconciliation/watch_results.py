"""What a watch's check found, and where it is kept: the range results and the report a check returns, the ranges
and counts stored per partition, the watch's status and lag, and the report of a check that failed. Apart from the
audit (watch_audit) because the pass over quiet watches (watch_pass) stores and reports with the same functions
without auditing anything."""
import logging
from dataclasses import dataclass, field
from datetime import datetime

from consumers.models import Status, Watch, WatchPartition, WatchRange, error_text
from consumers.reconciliation import monitored, watch_listing

log = logging.getLogger("tally.watch")


@dataclass
class RangeResult:
    partition: int
    start: int
    end: int
    records: int = 0
    ignored: int = 0
    superseded: int = 0
    unreadable: int = 0
    lost: int = 0
    duplicated: int = 0
    phantom: int = 0
    lost_offsets: list = field(default_factory=list)
    duplicated_offsets: list = field(default_factory=list)   # [[offset, extra rows], ...]
    phantom_offsets: list = field(default_factory=list)
    note: str = ""

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.phantom or self.note)


@dataclass
class WatchReport:
    watch: str
    status: str
    checked: int
    lost: int
    duplicated: int
    phantom: int
    lag_records: int | None
    lag_seconds: float | None
    lost_offsets: list
    duplicated_offsets: list
    partitions: list = field(default_factory=list)
    new_ranges: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    error: str = ""

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.phantom or self.error)

    def as_json(self) -> dict:
        """What `watch check --json` prints: these fields, exactly (the API's check answers them too). `error` is why
        the check failed (null when it did not): the command exits 1 then, and a script reading the JSON needs it."""
        return {"lost": self.lost, "duplicated": self.duplicated, "phantom": self.phantom, "checked": self.checked,
                "lag": {"records": self.lag_records, "seconds": self.lag_seconds}, "status": self.status,
                "lost_offsets": self.lost_offsets, "duplicated_offsets": self.duplicated_offsets,
                "notes": list(self.notes), "error": self.error or None}


def store_ranges(watch: Watch, parts: dict, new_ranges: list[RangeResult], now: datetime) -> None:
    """One WatchRange per new range; a clean range that continues the previous clean one extends it (a
    watch checked every 30 s would otherwise keep thousands of identical rows a day)."""
    for result in new_ranges:
        wp = parts[result.partition]
        wp.settled_offset = max(wp.settled_offset, result.end)
        wp.checked += result.records
        wp.lost += result.lost
        wp.duplicated += result.duplicated
        wp.phantom += result.phantom
        last = WatchRange.objects.filter(watch=watch, partition=result.partition).order_by("-start").first()
        if result.clean and last is not None and last.end == result.start and not last.findings and not last.note:
            WatchRange.objects.filter(pk=last.pk).update(
                end=result.end, records=last.records + result.records, ignored=last.ignored + result.ignored,
                superseded=last.superseded + result.superseded, unreadable=last.unreadable + result.unreadable,
                checked_at=now)
            continue
        WatchRange.objects.create(
            watch=watch, partition=result.partition, start=result.start, end=result.end, records=result.records,
            ignored=result.ignored, superseded=result.superseded, unreadable=result.unreadable, lost=result.lost,
            duplicated=result.duplicated, phantom=result.phantom, lost_offsets=result.lost_offsets,
            duplicated_offsets=result.duplicated_offsets, phantom_offsets=result.phantom_offsets, note=result.note,
            checked_at=now)


def store_report(watch: Watch, parts: dict, new_ranges: list, notes: list, now: datetime) -> WatchReport:
    summarise(watch, parts.values(), now, notes)
    Watch.objects.filter(pk=watch.pk).update(status=watch.status, lag_records=watch.lag_records,
                                             lag_seconds=watch.lag_seconds, checked_at=now, last_error="",
                                             last_notes=notes)
    return report_of(watch, parts.values(), watch_listing.listed_offsets(watch, parts=parts.values()), new_ranges,
                     notes)


def summarise(watch: Watch, rows, now: datetime, notes: list[str]) -> None:
    """The watch's status (its worst partition's), lag in records (their sum) and in seconds (their most), and
    the check's notes, set on `watch` (not saved)."""
    lags = [wp.lag_records for wp in rows if wp.lag_records is not None]
    ages = [wp.lag_seconds for wp in rows if wp.lag_seconds is not None]
    watch.status = monitored.worst(wp.status for wp in rows)
    watch.lag_records, watch.lag_seconds = sum(lags) if lags else None, max(ages) if ages else None
    watch.checked_at, watch.last_error, watch.last_notes = now, "", list(notes)


def report_of(watch: Watch, rows, listed: tuple[list, list], new_ranges: list, notes: list) -> WatchReport:
    """The report of a check that stored its findings: `watch` and `rows` as stored, `listed` its listed_offsets."""
    rows = sorted(rows, key=lambda wp: wp.partition)
    lost, duplicated = listed
    return WatchReport(
        watch.name, watch.status, sum(wp.checked for wp in rows), sum(wp.lost for wp in rows),
        sum(wp.duplicated for wp in rows), sum(wp.phantom for wp in rows), watch.lag_records, watch.lag_seconds,
        lost, duplicated, partitions=[partition_json(wp) for wp in rows], new_ranges=new_ranges, notes=notes)


def partition_json(wp: WatchPartition) -> dict:
    return {"partition": wp.partition, "start_offset": wp.start_offset, "settled_offset": wp.settled_offset,
            "committed": wp.committed, "log_start": wp.log_start, "high_watermark": wp.high_watermark,
            "lag_records": wp.lag_records, "lag_seconds": wp.lag_seconds, "checked": wp.checked, "lost": wp.lost,
            "duplicated": wp.duplicated, "phantom": wp.phantom, "status": wp.reported_status}


def failed(watch: Watch, reason: str, now: datetime) -> WatchReport:
    log.warning("watch %s: %s", watch.name, reason)
    Watch.objects.filter(pk=watch.pk).update(status=Status.ERR, checked_at=now, last_error=error_text(reason))
    WatchPartition.objects.filter(watch=watch).update(status=Status.ERR, checked_at=now)
    watch.refresh_from_db()
    rows = list(WatchPartition.objects.filter(watch=watch).order_by("partition"))
    lost, duplicated = watch_listing.listed_offsets(watch, parts=rows)
    return WatchReport(watch.name, Status.ERR, sum(wp.checked for wp in rows), sum(wp.lost for wp in rows),
                       sum(wp.duplicated for wp in rows), sum(wp.phantom for wp in rows), watch.lag_records,
                       watch.lag_seconds, lost, duplicated, partitions=[partition_json(wp) for wp in rows],
                       error=reason)
