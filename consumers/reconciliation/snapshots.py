"""Lag and throughput snapshots for charts and the lag evaluation rules, kept bounded.

`take_snapshots()` (Celery beat, every SNAPSHOT_INTERVAL) stores one LagSnapshot per pipeline partition,
one pipeline total (partition NULL), one total per consumer group that Tally does not run
(pipeline NULL, group_id set), and each watch's partitions and total as its last check measured them.
`downsample()` keeps the table bounded:

    age < 1 hour      raw samples (resolution 0)
    age < 1 day       one sample per minute     (resolution 60)
    age < 30 days     one sample per 15 minutes (resolution 900)
    older             deleted

A bucket keeps the highest lag and position (a chart must not hide a spike) and the mean throughput.
Cut-offs are aligned to bucket boundaries, so a bucket is always built from all of its samples at once.
"""
import logging
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone
from psycopg2 import sql

from consumers.engine.tables import table
from consumers.kafka import admin as kafka_admin
from consumers.kafka import clusters
from consumers.kafka.errors import ClusterConfigError
from consumers.models import DeliveryMode, LagSnapshot, PartitionOffset, Pipeline, Watch
from consumers.operations import groups

log = logging.getLogger("tally.snapshots")

SNAPSHOT_INTERVAL = timedelta(seconds=60)  # Burrow's window is 10 samples: 10 minutes at this interval
# (resolution in seconds, kept at the finer resolution for this long before being merged into it)
TIERS = ((60, timedelta(hours=1)), (900, timedelta(days=1)))
RETENTION = timedelta(days=30)


def take_snapshots(*, kafka=None, now: datetime | None = None) -> int:
    """Sample every pipeline and every external group; returns the number of rows written."""
    now = now or timezone.now()
    rows: list[LagSnapshot] = []
    for pipeline in Pipeline.objects.order_by("name"):
        try:
            rows += _pipeline_samples(pipeline, kafka or kafka_admin.on(pipeline.cluster), now)
        except Exception:  # one unreachable topic must not cost the others their sample
            log.exception("snapshot of pipeline %s failed", pipeline.name)
    for cluster in _cluster_names(kafka):
        try:
            rows += _group_samples(cluster, kafka or kafka_admin.on(cluster), now)
        except Exception:  # one cluster down must not cost the others their samples
            log.exception("snapshot of consumer groups of cluster %s failed", cluster)
    rows += _watch_samples(now)
    _fill_rates(rows)
    LagSnapshot.objects.bulk_create(rows)
    return len(rows)


def _cluster_names(kafka) -> list[str]:
    """Every configured cluster (only "default" with a stand-in `kafka`, or when the clusters file is broken)."""
    if kafka is not None:
        return [clusters.DEFAULT]
    try:
        return clusters.names()
    except ClusterConfigError as exc:
        log.error("%s", exc)
        return [clusters.DEFAULT]


def _group_samples(cluster: str, kafka, now: datetime) -> list[LagSnapshot]:
    rows = []
    for group_id in groups.list_groups(kafka=kafka, cluster=cluster):
        report = groups.describe(group_id, kafka=kafka, cluster=cluster, now_ms=now.timestamp() * 1000)
        positions = [p.committed for p in report.partitions if p.committed is not None]
        rows.append(LagSnapshot(group_id=group_id, cluster=cluster, partition=None, taken_at=now,
                                lag_records=report.lag_records, lag_seconds=report.lag_seconds,
                                position=sum(positions) if positions else None,
                                high_watermark=_sum(p.high_watermark for p in report.partitions)))
    return rows


def _pipeline_samples(pipeline: Pipeline, kafka, now: datetime) -> list[LagSnapshot]:
    marks = kafka.watermarks(pipeline.topic)
    positions = dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))
    if pipeline.delivery_mode != DeliveryMode.EXACTLY_ONCE:
        # The classic modes resume from Kafka: what lies below its committed offset is not lag any more.
        for p, offset in kafka.committed_offsets(pipeline.group_id, pipeline.topic).items():
            if offset is not None:
                positions[p] = max(positions.get(p, offset), offset)
    samples, behind = [], {}
    for p, mark in sorted(marks.items()):
        position = positions.get(p, pipeline.initial_position(mark))
        lag = max(0, mark.end - position)   # as reconciliation measures it: an open transaction is not lag
        samples.append(LagSnapshot(pipeline=pipeline, group_id=pipeline.group_id, cluster=pipeline.cluster,
                                   partition=p, taken_at=now,
                                   lag_records=lag, lag_seconds=0.0 if lag == 0 else None, position=position,
                                   high_watermark=mark.high))
        if lag:
            behind[p] = max(position, mark.log_start)
    if behind:
        stamps = kafka.record_timestamps(pipeline.topic, behind)
        for sample in samples:
            if stamps.get(sample.partition) is not None:
                sample.lag_seconds = max(0.0, now.timestamp() - stamps[sample.partition] / 1000)
    total = LagSnapshot(pipeline=pipeline, group_id=pipeline.group_id, cluster=pipeline.cluster, partition=None,
                        taken_at=now,
                        lag_records=_sum(s.lag_records for s in samples),
                        lag_seconds=max((s.lag_seconds for s in samples if s.lag_seconds is not None), default=None),
                        position=_sum(s.position for s in samples),
                        high_watermark=_sum(s.high_watermark for s in samples))
    return samples + [total]


def _watch_samples(now: datetime) -> list[LagSnapshot]:
    """Every watch's partitions as its last check measured them (the check reads Kafka; a sample does not
    read it again), and its total. group_id stays empty: the series is the watch's, not the group's."""
    rows = []
    for watch in Watch.objects.prefetch_related("partitions").order_by("name"):
        parts = [wp for wp in watch.partitions.all() if wp.checked_at is not None]
        samples = [LagSnapshot(watch=watch, cluster=watch.cluster, partition=wp.partition, taken_at=now,
                               lag_records=wp.lag_records,
                               lag_seconds=wp.lag_seconds, position=wp.committed, high_watermark=wp.high_watermark)
                   for wp in parts]
        if samples:
            samples.append(LagSnapshot(
                watch=watch, cluster=watch.cluster, partition=None, taken_at=now,
                lag_records=_sum(s.lag_records for s in samples),
                lag_seconds=max((s.lag_seconds for s in samples if s.lag_seconds is not None), default=None),
                position=_sum(s.position for s in samples), high_watermark=_sum(s.high_watermark for s in samples)))
        rows += samples
    return rows


def _series(row) -> tuple:
    """A sample's series: its pipeline's or its watch's partition, or an external group's total on its cluster."""
    external = not (row["pipeline_id"] or row["watch_id"])
    return (row["pipeline_id"], row["watch_id"], (row["cluster"], row["group_id"]) if external else "",
            row["partition"])


def _fill_rates(rows: list[LagSnapshot]) -> None:
    """records_per_second of each new sample: position change since the previous sample of its series."""
    if not rows:
        return
    pipeline_ids = {r.pipeline_id for r in rows if r.pipeline_id}
    watch_ids = {r.watch_id for r in rows if r.watch_id}
    group_ids = {r.group_id for r in rows if not r.pipeline_id and not r.watch_id}
    series = (Q(pipeline_id__in=pipeline_ids) | Q(watch_id__in=watch_ids)
              | Q(pipeline__isnull=True, watch__isnull=True, group_id__in=group_ids))
    latest = (LagSnapshot.objects.filter(series)
              .order_by("pipeline_id", "watch_id", "cluster", "group_id", "partition", "-taken_at")
              .distinct("pipeline_id", "watch_id", "cluster", "group_id", "partition")
              .values("pipeline_id", "watch_id", "cluster", "group_id", "partition", "taken_at", "position"))
    previous = {_series(s): s for s in latest}
    for row in rows:
        before = previous.get(_series({"pipeline_id": row.pipeline_id, "watch_id": row.watch_id,
                                       "cluster": row.cluster, "group_id": row.group_id,
                                       "partition": row.partition}))
        if before and before["position"] is not None and row.position is not None:
            seconds = (row.taken_at - before["taken_at"]).total_seconds()
            if seconds > 0 and row.position >= before["position"]:
                row.records_per_second = (row.position - before["position"]) / seconds


def downsample(*, now: datetime | None = None) -> dict[str, int]:
    """Merge old samples into coarser buckets and delete what is past retention. Idempotent."""
    now = now or timezone.now()
    result = {}
    snapshots = table(LagSnapshot)
    with transaction.atomic(), connection.cursor() as cur:
        for resolution, keep_finer_for in TIERS:
            cutoff = _floor(now - keep_finer_for, resolution)
            cur.execute(sql.SQL(
                "INSERT INTO {0} (pipeline_id, watch_id, group_id, cluster, partition, taken_at, "
                "resolution_seconds, lag_records, lag_seconds, position, high_watermark, records_per_second) "
                "SELECT pipeline_id, watch_id, group_id, cluster, partition, "
                "to_timestamp(floor(extract(epoch FROM taken_at) / %(r)s) * %(r)s) AS bucket, %(r)s, "
                "max(lag_records), max(lag_seconds), max(position), max(high_watermark), avg(records_per_second) "
                "FROM {0} WHERE resolution_seconds < %(r)s AND taken_at < %(cutoff)s "
                "GROUP BY pipeline_id, watch_id, group_id, cluster, partition, bucket").format(snapshots),
                {"r": resolution, "cutoff": cutoff})
            result[f"buckets_{resolution}s"] = cur.rowcount
            cur.execute(sql.SQL("DELETE FROM {} WHERE resolution_seconds < %s AND taken_at < %s").format(snapshots),
                        [resolution, cutoff])
            result[f"merged_into_{resolution}s"] = cur.rowcount
        cur.execute(sql.SQL("DELETE FROM {} WHERE taken_at < %s").format(snapshots), [now - RETENTION])
        result["deleted"] = cur.rowcount
    return result


def _floor(moment: datetime, seconds: int) -> datetime:
    epoch = int(moment.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=UTC)


def _sum(values):
    values = [v for v in values if v is not None]
    return sum(values) if values else None
