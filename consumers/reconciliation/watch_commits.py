"""The group's commits as a watch sees them, and what they settle: each check remembers the committed offsets it saw
and when (`WatchPartition.commits_seen`), a range is settled up to the newest commit seen at least the settle time
ago, and a group reset behind the settled mark reopens the ranges from there. Also the topic's identity (a topic
deleted and created again under its name is not the one audited). Apart from the audit (watch_audit) because the
pass over quiet watches (watch_pass) observes commits and plans ranges without auditing."""
import logging
from datetime import datetime, timedelta

from django.db.models import F
from django.utils.dateparse import parse_datetime

from consumers.kafka import admin as kafka_admin
from consumers.models import Watch, WatchFinding, WatchPartition, WatchRange
from consumers.reconciliation.watch_results import RangeResult

log = logging.getLogger("tally.watch")

RETENTION_NOTE = "removed by retention before the audit read them: not audited"
# Positions the log start passed while the group's committed offset was below them: the consumer never read them.
DELETED_UNREAD_NOTE = "deleted by retention before the group read them: never delivered"


def topic_recreated(watch: Watch, marks: dict) -> str:
    """Why the topic is no longer the one the watch audited, or "": deleted and created again under its name (another
    topic id), its offsets start again from 0, so the settled marks and ranges are the old topic's. Auditing on would
    take the new topic's records from the old mark on for the rest of the old one (and a group reset for a rewind):
    the watch says so instead, until it is created again."""
    now_id = kafka_admin.topic_id_of(marks)
    if not (watch.topic_id and now_id) or now_id == watch.topic_id:
        return ""
    return (f"topic {watch.topic!r} was deleted and created again (its id was {watch.topic_id}, it is {now_id}): its "
            "offsets start again, and what this watch audited was the old topic's records; delete the watch and "
            "create it again to audit the new topic")


def adopt_topic_id(watch: Watch, marks: dict) -> None:
    """A watch that has no topic id yet (created before watches kept one, or on a broker that gave none) takes the
    one Kafka gives now."""
    now_id = kafka_admin.topic_id_of(marks)
    if now_id and not watch.topic_id:
        Watch.objects.filter(pk=watch.pk, topic_id="").update(topic_id=now_id)
        watch.topic_id = now_id


def observe(wp: WatchPartition, committed: int | None, now: datetime, keep_seconds: int) -> bool:
    """Remember the committed offset seen now; True when it went back (the group's offsets were reset). A group
    whose offsets were gone at the last check (deleted, or expired) went back when it commits behind the last
    commit seen: it reads those records again."""
    seen = list(wp.commits_seen or [])
    previous = wp.committed if wp.committed is not None else (seen[-1][0] if seen else None)
    went_back = committed is not None and previous is not None and committed < previous
    if committed is not None and (not seen or seen[-1][0] != committed):
        seen.append([committed, now.isoformat()])
    if committed != wp.committed:
        wp.moved_at = now
    wp.committed = committed
    # Keep what a later check may still need: the commits of the settle window and the newest one before it.
    horizon = now - timedelta(seconds=keep_seconds)
    while len(seen) > 1 and parse_datetime(seen[1][1]) <= horizon:
        seen.pop(0)
    wp.commits_seen = seen
    return went_back


def reopen(watch: Watch, wp: WatchPartition, now: datetime) -> None:
    """The group's offsets went back behind what was settled: the consumer reads those records again (and may
    write them again), so the settled ranges from the one holding the new committed offset on are dropped,
    with their findings and counts, and audited afresh once the reset commit has settled. Commits seen past the
    reset commit settle nothing: the consumer has yet to read those records again."""
    if wp.committed is None:
        return
    wp.commits_seen = [seen for seen in wp.commits_seen or [] if seen[0] <= wp.committed]
    if wp.committed >= wp.settled_offset:
        return
    ranges = WatchRange.objects.filter(watch=watch, partition=wp.partition)
    holding = ranges.filter(end__gt=wp.committed).order_by("start").first()
    restart = max(wp.start_offset, holding.start if holding is not None else wp.committed)
    dropped = list(ranges.filter(start__gte=restart))
    for r in dropped:
        wp.checked -= r.records
        wp.lost -= r.lost
        wp.duplicated -= r.duplicated
        wp.phantom -= r.phantom
    WatchRange.objects.filter(pk__in=[r.pk for r in dropped]).delete()
    findings = WatchFinding.objects.filter(watch=watch, partition=wp.partition)
    findings.filter(offset__gte=restart).delete()
    findings.filter(offset__lt=restart, offset__gt=restart - F("run_length")).update(run_length=restart - F("offset"))
    wp.settled_offset = restart
    wp.commits_seen = [[wp.committed, now.isoformat()]]   # the re-read range settles from the reset on
    log.info("watch %s partition %s: offsets reset to %s; re-auditing from %s", watch.name, wp.partition,
             wp.committed, restart)


def _settled_end(wp: WatchPartition, cutoff: datetime) -> int | None:
    """The newest commit seen at or before `cutoff` (None: none is that old yet)."""
    settled = None
    for offset, seen_at in wp.commits_seen or []:
        if parse_datetime(seen_at) <= cutoff:
            settled = offset
    return settled


def plan_ranges(parts: dict, marks: dict, cutoff: datetime) -> dict[int, tuple[int, int, int]]:
    """{partition: (settled_offset, first readable offset, settled end)} of the partitions with a new range."""
    plans = {}
    for p, wp in parts.items():
        mark, end = marks.get(p), _settled_end(wp, cutoff)
        if mark is None or end is None:
            continue
        # A commit past the last stable offset (a read_uncommitted group, an open transaction): what lies beyond
        # it may yet abort and a read_committed reader cannot pass it, so it settles once the transaction ends. Past
        # the log end (data loss, a topic recreated): nothing there to read.
        end = min(end, mark.end)
        if end > wp.settled_offset:
            plans[p] = (wp.settled_offset, min(max(wp.settled_offset, mark.log_start), end), end)
    return plans


def keyed_tails(parts: dict, marks: dict, plans: dict) -> dict[int, int]:
    """{partition: first unsettled offset} of the partitions with no range to settle now. A keyed watch reads their
    unsettled records too, as it reads the planned partitions' tails: a key the producer wrote into two partitions
    has its latest record in the one whose commit has not settled yet, and judging the older record would report a
    row the consumer rightly replaced or deleted as lost."""
    return {p: max(wp.settled_offset, marks[p].log_start) for p, wp in parts.items()
            if p in marks and p not in plans and marks[p].end > max(wp.settled_offset, marks[p].log_start)}


def unread_ranges(parts: dict, marks: dict) -> list[RangeResult]:
    """The ranges the log start passed while the group's committed offset was below it: the part the group had
    committed (read) the audit can no longer judge; the rest the group never read, nor ever will."""
    ranges = []
    for p, wp in sorted(parts.items()):
        mark = marks.get(p)
        if mark is None or wp.committed is None or wp.committed >= mark.log_start \
                or wp.settled_offset >= mark.log_start:
            continue
        read_to = max(wp.settled_offset, wp.committed)
        if read_to > wp.settled_offset:
            ranges.append(RangeResult(p, wp.settled_offset, read_to, note=RETENTION_NOTE))
        ranges.append(RangeResult(p, read_to, mark.log_start, note=DELETED_UNREAD_NOTE))
    return ranges
