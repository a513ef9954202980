"""One check pass over every watch (the periodic task consumers.check_watches), cheap when little is new.

A check of one watch (watch_audit.check_watch) builds Kafka consumers of its own and runs about ten queries: 40 ms
for a watch with nothing new on a quiet machine, several times that under load, so a pass of 200 watches one check
after another took 8 s to 40 s, against a target of 5 s (issue 32). Most watches have nothing new to audit at most
passes. So a pass:
  1. reads Kafka once per cluster (pass_kafka.for_watches, as the reconciliation pass does for its pipelines):
     the watermarks of every watched topic with one consumer, the committed offsets of every watched group in
     one request, their membership in one;
  2. under one lock of the watches, works out in memory what each check would, with the check's own steps
     (watch_commits.observe and plan_ranges, watch_lag.measure_records and evaluate): a watch with no new settled
     range to audit, no group reset and no partition added is "quiet". The quiet watches' lag in seconds is read
     in one request per cluster, their status windows in one query, and their measurements stored in a few
     statements;
  3. checks every other watch with watch_audit.check_watch, handed the pass's reading of its cluster.
So a quiet watch's status still moves every pass (lag, stall and stop detection, the window's samples), and a
watch with something to audit gets exactly the check it always got.
"""
import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from consumers.kafka import admin as kafka_admin
from consumers.models import Watch, WatchPartition
from consumers.reconciliation import (
    monitored,
    pass_kafka,
    row_updates,
    watch_audit,
    watch_commits,
    watch_lag,
    watch_listing,
    watch_results,
)

log = logging.getLogger("tally.watch")

# What measuring a quiet watch changes: only these columns are written, so nothing else of a row is overwritten.
MEASURED = ["commits_seen", "committed", "moved_at", "log_start", "high_watermark", "lag_records", "lag_seconds",
            "status", "checked_at"]
SUMMARISED = ["status", "lag_records", "lag_seconds", "checked_at", "last_error", "last_notes"]


def check_all(*, kafka=None, now: datetime | None = None) -> list[watch_results.WatchReport]:
    """Check every watch; their reports by watch name. `kafka`: a stand-in for every cluster's Kafka calls (tests),
    with which each watch is checked alone."""
    now = now or timezone.now()
    watches = list(Watch.objects.order_by("name"))
    readings = pass_kafka.for_watches(watches) if kafka is None else {}
    try:
        quiet = _store_quiet(watches, readings, now)
    except Exception:  # noqa: BLE001 - the pass's shortcut must never cost a check: each watch is checked alone
        log.exception("watch pass: measuring the quiet watches together failed; checking each alone")
        quiet = {}
    reports = []
    for watch in watches:
        if watch.pk in quiet:
            reports.append(quiet[watch.pk])
            continue
        try:
            reports.append(watch_audit.check_watch(watch, kafka=readings.get(watch.cluster, kafka), now=now))
        except Exception:  # one broken watch must not hide the others
            log.exception("check of watch %s failed", watch.name)
    return reports


def _store_quiet(watches: list[Watch], readings: dict, now: datetime) -> dict[int, watch_results.WatchReport]:
    """Measure, evaluate and store every quiet watch; their reports by watch id. The others are left untouched."""
    served = [w for w in watches if w.cluster in readings and readings[w.cluster].read_in_bulk(w.topic)]
    if not served:
        return {}
    with transaction.atomic():
        # The same locks a check takes, watches first. A watch a check elsewhere holds is skipped here: it is
        # checked alone afterwards, waiting for that check as any check would.
        locked = set(Watch.objects.select_for_update(skip_locked=True).filter(pk__in=[w.pk for w in served])
                     .order_by("pk").values_list("pk", flat=True))
        rows: dict[int, dict] = defaultdict(dict)
        for wp in WatchPartition.objects.select_for_update().filter(watch_id__in=locked):
            rows[wp.watch_id][wp.partition] = wp
        with connection.cursor() as cursor:   # a watch whose table is gone is checked alone: it is an ERR
            gone = watch_audit.tables_gone(cursor.cursor, [w for w in served if w.pk in locked])
        quiet = [w for w in served if w.pk in locked and w.pk not in gone
                 and _observe_quiet(w, rows[w.pk], readings[w.cluster], now)]
        if not quiet:
            return {}
        notes = {w.pk: watch_audit.audit_notes(w.last_notes) for w in quiet}
        _measure(quiet, rows, readings, notes, now)
        history = monitored.watches_window_samples([w.pk for w in quiet], now=now)
        for watch in quiet:
            parts = rows[watch.pk]
            alive = watch_lag.group_alive(readings[watch.cluster], watch.group_id, notes[watch.pk])
            watch_lag.evaluate(parts, alive, set(), now, history.get(watch.pk, {}), watch.created_at)
            for wp in parts.values():
                wp.checked_at = now
            watch_results.summarise(watch, parts.values(), now, notes[watch.pk])
        row_updates.update_columns([wp for w in quiet for wp in rows[w.pk].values()], MEASURED)
        row_updates.update_columns(quiet, SUMMARISED)
    return {w.pk: watch_results.report_of(w, rows[w.pk].values(),
                                          watch_listing.listed_offsets(w, parts=rows[w.pk].values()), [], notes[w.pk])
            for w in quiet}


def _observe_quiet(watch: Watch, parts: dict, reading: pass_kafka.PassKafka, now: datetime) -> bool:
    """Observe the group's commits on the watch's rows as its check would (watch_commits.observe), and say whether
    the check would do no more than measure: no partition added, no group reset, no new settled range."""
    marks = reading.watermarks(watch.topic)
    if any(p not in parts for p in marks):   # the check creates the new partition's row
        return False
    if watch_commits.topic_recreated(watch, marks) or (kafka_admin.topic_id_of(marks) and not watch.topic_id):
        return False   # the check says the topic was re-created (ERR), or takes the topic's id for the watch
    committed = reading.committed_offsets(watch.group_id, watch.topic, sorted(marks))
    if watch_lag.committed_ahead(committed, marks):   # the check reads Kafka again before saying so, with a note
        return False
    rewound = [p for p, wp in parts.items() if watch_commits.observe(wp, committed.get(p), now, watch.settle_seconds)]
    if rewound:
        return False
    cutoff = now - timedelta(seconds=watch.settle_seconds)
    if not watch.audits:
        return True
    return not (watch_commits.unread_ranges(parts, marks) or watch_commits.plan_ranges(parts, marks, cutoff))


def _measure(quiet: list[Watch], rows: dict, readings: dict, notes: dict, now: datetime) -> None:
    """Lag in records of every quiet watch, and in seconds from one read of record timestamps per cluster."""
    behind = {w.pk: watch_lag.measure_records(rows[w.pk], readings[w.cluster].watermarks(w.topic)) for w in quiet}
    for cluster in sorted({w.cluster for w in quiet}):
        lagging = [w for w in quiet if w.cluster == cluster and behind[w.pk]]
        stamps, ended, failed = {}, set(), None
        for wanted in _rounds((w.topic, p, offset) for w in lagging for p, offset in behind[w.pk].items()):
            read_to_end: set = set()
            try:
                read = readings[cluster].record_timestamps_of_topics(wanted, ended=read_to_end)
            except Exception as exc:  # noqa: BLE001 - lag in records stands; seconds stay unknown, as in a check
                failed = exc
                break
            stamps.update({(topic, p, offset): stamp for (topic, p), stamp in read.items()
                           for offset in [wanted[(topic, p)]]})
            ended.update((topic, p, wanted[(topic, p)]) for topic, p in read_to_end)
        for w in lagging:
            if failed is not None:
                notes[w.pk].append(watch_lag.lag_seconds_unknown(failed))
                continue
            watch_lag.measure_seconds(rows[w.pk], {p: stamps.get((w.topic, p, offset))
                                                     for p, offset in behind[w.pk].items()}, now)
            watch_lag.caught_up(rows[w.pk], [p for p, offset in behind[w.pk].items()
                                             if (w.topic, p, offset) in ended])


def _rounds(wanted) -> list[dict[tuple[str, int], int]]:
    """(topic, partition, offset) triples as few reads as possible: a consumer reads a partition at one offset,
    and two watches of one topic (different groups) may want the same partition at two."""
    rounds: list[dict] = []
    for topic, p, offset in wanted:
        for one in rounds:
            if one.get((topic, p), offset) == offset:
                one[(topic, p)] = offset
                break
        else:
            rounds.append({(topic, p): offset})
    return rounds
