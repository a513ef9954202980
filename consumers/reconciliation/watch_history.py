"""Retention of a watch's audit history: the ranges it checked longer ago than TALLY_RETAIN_WATCH_HISTORY_DAYS
fold into one summary range per partition, and their findings (one `WatchFinding` per record) go.

A watch of a consumer that loses records stores a range with findings at every check (every 30 s by default),
and every finding: about 2,880 ranges a day, for as long as the watch lives. What stays:
  - the partition's totals (`WatchPartition.checked`, `lost`, ...), which count the whole audit;
  - the summary range [first offset, end of the last folded range) with the folded ranges' counts, so an alert
    still names the offsets within which records were lost, and a group reset behind it is audited afresh from
    its start with its counts taken off the totals (watch_commits.reopen);
  - the newest range of each partition, however old: the next check may extend it.
The ranges of a partition are checked in offset order, so the ones past retention are always its first ones.
Called by the retention task beside consumers/operations/retention.py (which sits below this package).
"""
from datetime import datetime
from itertools import takewhile

from django.db import transaction
from django.db.models import Exists, Max, OuterRef, Sum
from django.utils import timezone

from consumers.models import Watch, WatchFinding, WatchPartition, WatchRange
from consumers.operations.retention import DELETE_BATCH, Kind, delete_in_batches

WATCH_HISTORY = Kind("watch ranges and findings", "TALLY_RETAIN_WATCH_HISTORY_DAYS")
SUMMARY_NOTE = "checked longer ago than the retention setting: ranges folded, their findings removed"
COUNTED = ("records", "ignored", "superseded", "unreadable", "lost", "duplicated", "phantom")


def expired(ranges: list[WatchRange], cutoff: datetime) -> list[WatchRange]:
    """Of a partition's ranges in offset order, the first ones checked before `cutoff`, never the newest."""
    return list(takewhile(lambda r: r.checked_at < cutoff, ranges[:-1]))


def fold_partition(wp: WatchPartition, cutoff: datetime) -> int:
    """Fold `wp`'s ranges past retention into one, DELETE_BATCH at a time, each in a transaction under the locks a
    check takes (a watch a check holds now is left for the next run); then delete the findings below the summary.
    Returns how many ranges were folded away."""
    if not _to_fold(expired(_ranges(wp, 3), cutoff)):
        return 0    # the hourly question for most partitions: one read of three rows from watch_range_idx
    folded = 0
    while True:
        with transaction.atomic():
            if Watch.objects.select_for_update(skip_locked=True).filter(pk=wp.watch_id).first() is None:
                return folded
            WatchPartition.objects.select_for_update().filter(pk=wp.pk).first()
            old = expired(_ranges(wp, DELETE_BATCH + 1), cutoff)
            if not _to_fold(old):
                break
            summary, rest_ids = old[0], [r.pk for r in old[1:]]
            sums = WatchRange.objects.filter(pk__in=rest_ids).aggregate(
                **{field: Sum(field) for field in COUNTED}, end=Max("end"), checked_at=Max("checked_at"))
            WatchRange.objects.filter(pk=summary.pk).update(
                end=sums["end"] or summary.end, checked_at=sums["checked_at"] or summary.checked_at,
                lost_offsets=[], duplicated_offsets=[], phantom_offsets=[], note=SUMMARY_NOTE,
                **{field: getattr(summary, field) + (sums[field] or 0) for field in COUNTED})
            WatchRange.objects.filter(pk__in=rest_ids).delete()
            folded += len(rest_ids)
    if old:
        # Checked before the cutoff too: a group reset behind the summary re-audits its offsets, and what that
        # finds again is new.
        delete_in_batches(WatchFinding.objects.filter(watch_id=wp.watch_id, partition=wp.partition,
                                                      offset__lt=old[0].end, checked_at__lt=cutoff))
    return folded


def _ranges(wp: WatchPartition, limit: int) -> list[WatchRange]:
    return list(WatchRange.objects.filter(watch_id=wp.watch_id, partition=wp.partition).order_by("start")[:limit])


def _to_fold(old: list[WatchRange]) -> bool:
    """Whether ranges past retention hold more than their summary: several ranges, or one with its detail."""
    return bool(old) and not (len(old) == 1 and old[0].note == SUMMARY_NOTE)


def apply(now: datetime | None = None) -> dict[str, int]:
    """Fold every watch partition's ranges past retention; returns how many ranges were folded away."""
    cutoff = WATCH_HISTORY.cutoff(now or timezone.now())
    return {"watch_ranges": sum(fold_partition(wp, cutoff) for wp in WatchPartition.objects.order_by("pk"))}


def counts(now: datetime | None = None) -> list[dict]:
    """For the admin's history page, as consumers/operations/retention.counts."""
    cutoff = WATCH_HISTORY.cutoff(now or timezone.now())
    return [{"name": WATCH_HISTORY.name, "setting": WATCH_HISTORY.setting, "days": WATCH_HISTORY.days(),
             "rows": WatchRange.objects.count(),
             "past_retention": WatchRange.objects.filter(checked_at__lt=cutoff).exclude(note=SUMMARY_NOTE)
             .filter(Exists(WatchRange.objects.filter(watch=OuterRef("watch"), partition=OuterRef("partition"),
                                                      start__gt=OuterRef("start")))).count()}]


def past_retention(watch: Watch, partition: int, offset: int) -> bool:
    """Whether the audit's result for `offset` was folded into a summary (watch_trace says so)."""
    return WatchRange.objects.filter(watch=watch, partition=partition, start__lte=offset, end__gt=offset,
                                     note=SUMMARY_NOTE).exists()
