"""A monitored consumer: a pipeline Tally runs, or a watch of a group Tally does not run.

Both have lag in records and seconds per partition, a status by the same rules (lag_status.py) over the same
kind of history (LagSnapshot series), and delivery findings. Lists (the overview, /metrics, the API) and the
status of a watch go through this one interface instead of a copy per kind.
"""
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings

from consumers.models import LagSnapshot, Pipeline, PipelineHealth, Status, Watch, WatchPartition
from consumers.reconciliation import lag_status

PIPELINE, WATCH = "pipeline", "watch"


def status_window() -> timedelta:
    return timedelta(seconds=getattr(settings, "RECONCILE_WINDOW_SECONDS", 600))


def window_samples(*, pipeline=None, watch=None, now: datetime) -> dict[int, list[lag_status.Sample]]:
    """The window's lag samples per partition of a pipeline or a watch, oldest first."""
    if pipeline is None:
        return watches_window_samples([watch.pk], now=now).get(watch.pk, {})
    history: dict[int, list[lag_status.Sample]] = {}
    since = now - status_window()
    for s in (LagSnapshot.objects.filter(pipeline=pipeline, partition__isnull=False, taken_at__gte=since)
              .order_by("taken_at").values("partition", "taken_at", "position", "lag_records")):
        history.setdefault(s["partition"], []).append(lag_status.Sample(s["taken_at"], s["position"], s["lag_records"]))
    return history


def watches_window_samples(watch_ids, *, now: datetime) -> dict[int, dict[int, list[lag_status.Sample]]]:
    """window_samples() of several watches in one query: {watch id: {partition: samples}} (a pass over many)."""
    history: dict[int, dict[int, list[lag_status.Sample]]] = {}
    for s in (LagSnapshot.objects.filter(watch_id__in=list(watch_ids), pipeline__isnull=True, partition__isnull=False,
                                         taken_at__gte=now - status_window())
              .order_by("taken_at").values("watch_id", "partition", "taken_at", "position", "lag_records")):
        history.setdefault(s["watch_id"], {}).setdefault(s["partition"], []).append(
            lag_status.Sample(s["taken_at"], s["position"], s["lag_records"]))
    return history


def partition_status(samples: list, *, position, lag, moved_at, alive: bool, rewound: bool, incident: bool,
                     now: datetime) -> str:
    """One partition's status from its window of samples and what is true now."""
    facts = lag_status.PartitionFacts(samples + [lag_status.Sample(now, position, lag)], lag, moved_at, alive,
                                      rewound, incident, now, status_window())
    return lag_status.evaluate(facts)


def worst(statuses) -> str:
    return lag_status.worst(statuses)


@dataclass
class MonitoredPartition:
    partition: int
    position: int | None
    high_watermark: int | None
    lag_records: int | None
    lag_seconds: float | None
    status: str


@dataclass
class MonitoredConsumer:
    kind: str                   # pipeline | watch
    name: str
    group_id: str
    topic: str
    status: str
    lag_records: int | None
    lag_seconds: float | None
    # None where nothing was measured: before the first check, and for a watch that names no table (lag only).
    lost: int | None
    duplicated: int | None
    phantom: int | None
    checked_at: datetime | None
    partitions: list[MonitoredPartition] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"/{'pipelines' if self.kind == PIPELINE else 'watches'}/{self.name}/"

    def as_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "group_id": self.group_id, "topic": self.topic,
                "status": self.status, "lag_records": self.lag_records, "lag_seconds": self.lag_seconds,
                "lost": self.lost, "duplicated": self.duplicated, "phantom": self.phantom,
                "checked_at": self.checked_at.isoformat() if self.checked_at else None,
                "partitions": [p.__dict__ for p in self.partitions]}


def of_watch(watch: Watch, partitions=None) -> MonitoredConsumer:
    rows = partitions if partitions is not None else list(WatchPartition.objects.filter(watch=watch))
    audited = watch.checked_at is not None and watch.audits
    return MonitoredConsumer(
        WATCH, watch.name, watch.group_id, watch.topic, watch.reported_status, watch.lag_records, watch.lag_seconds,
        *((sum(p.lost for p in rows), sum(p.duplicated for p in rows), sum(p.phantom for p in rows)) if audited
          else (None, None, None)), watch.checked_at,
        [MonitoredPartition(p.partition, p.committed, p.high_watermark, p.lag_records, p.lag_seconds,
                            p.reported_status) for p in sorted(rows, key=lambda p: p.partition)])


def of_pipeline(pipeline: Pipeline, health: PipelineHealth | None = None, partitions=None) -> MonitoredConsumer:
    if health is None:
        health = PipelineHealth.objects.filter(pipeline=pipeline).first()
    rows = partitions if partitions is not None else list(pipeline.partition_health.all())
    return MonitoredConsumer(
        PIPELINE, pipeline.name, pipeline.group_id, pipeline.topic, health.status if health else Status.OK,
        health.lag_records if health else None, health.lag_seconds if health else None,
        health.lost if health else None, health.duplicated if health else None, health.phantom if health else None,
        health.checked_at if health else None,
        [MonitoredPartition(p.partition, p.next_offset, p.high_watermark, p.lag_records, p.lag_seconds, p.status)
         for p in sorted(rows, key=lambda p: p.partition)])


# What of_watch reads: a list of hundreds of watches loads these only (not the audit's state, such as the
# commits a partition saw), and groups the partitions itself rather than through a prefetch's manager per watch.
WATCH_FIELDS = ("name", "group_id", "topic", "sink_table", "status", "lag_records", "lag_seconds", "checked_at")
WATCH_PARTITION_FIELDS = ("watch_id", "partition", "committed", "high_watermark", "lag_records", "lag_seconds",
                          "status", "checked_at", "lost", "duplicated", "phantom")


def watches() -> list[MonitoredConsumer]:
    """Every watch by name, in two queries."""
    partitions: dict[int, list[WatchPartition]] = {}
    for partition in WatchPartition.objects.only(*WATCH_PARTITION_FIELDS):
        partitions.setdefault(partition.watch_id, []).append(partition)
    return [of_watch(w, partitions.get(w.pk, [])) for w in Watch.objects.order_by("name").only(*WATCH_FIELDS)]


def all_consumers() -> list[MonitoredConsumer]:
    """Every pipeline and every watch, pipelines first, each kind by name (a few queries, not one per row)."""
    healths = {h.pipeline_id: h for h in PipelineHealth.objects.all()}
    result = [of_pipeline(pipeline, healths.get(pipeline.pk), list(pipeline.partition_health.all()))
              for pipeline in Pipeline.objects.order_by("name").prefetch_related("partition_health")]
    return result + watches()
