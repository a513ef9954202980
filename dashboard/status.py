"""What the pages, the JSON API and /metrics show, read from the models in a fixed, small number of
queries (no query per pipeline or partition: the overview must stay fast with hundreds of them).

Reconciliation (consumers/reconciliation/reconcile.py) writes PartitionHealth / PipelineHealth / LagSnapshot;
this module only reads them, together with the positions the commit protocol keeps.
"""
from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import Count, Exists, Max, OuterRef, Q
from django.utils import timezone

from consumers.kafka import clusters
from consumers.models import (
    UNKNOWN,
    ActionLog,
    ConsumerRun,
    DeadLetter,
    LagSnapshot,
    PartitionHealth,
    PartitionOffset,
    Pipeline,
    PipelineHealth,
)

CHART_WINDOW = timedelta(hours=6)
# A chart needs a few hundred points at most; beyond that the browser draws pixels nobody can tell apart.
CHART_MAX_POINTS = 720
RECENT_ROWS = 20


@dataclass
class PipelineRow:
    """One line of the overview (and of the API's pipeline list)."""

    pipeline: Pipeline
    status: str
    lag_records: int | None
    lag_seconds: float | None
    records_per_second: float | None
    lost: int | None          # None (each count) before the first reconciliation: nothing was measured
    duplicated: int | None
    phantom: int | None
    dead_lettered: int | None
    checked_at: object

    @property
    def name(self):
        return self.pipeline.name

    def as_json(self) -> dict:
        p = self.pipeline
        return {"name": p.name, "topic": p.topic, "cluster": p.cluster, "group_id": p.group_id,
                "sink_table": p.sink_table,
                "delivery_mode": p.delivery_mode, "engine": p.engine, "desired_state": p.desired_state,
                "epoch": p.epoch, "status": self.status, "lag_records": self.lag_records,
                "lag_seconds": self.lag_seconds, "records_per_second": self.records_per_second,
                "lost": self.lost, "duplicated": self.duplicated, "phantom": self.phantom,
                "dead_lettered": self.dead_lettered,
                "last_reconciliation": self.checked_at.isoformat() if self.checked_at else None}


def _row(pipeline: Pipeline) -> PipelineRow:
    health = getattr(pipeline, "health", None)
    if health is None:
        return PipelineRow(pipeline, UNKNOWN, None, None, None, None, None, None, None, None)
    return PipelineRow(pipeline, health.status, health.lag_records, health.lag_seconds,
                       health.records_per_second, health.lost, health.duplicated, health.phantom,
                       health.dead_lettered, health.checked_at)


def pipeline_rows() -> list[PipelineRow]:
    """Every pipeline with its latest reconciliation: one query."""
    return [_row(p) for p in Pipeline.objects.select_related("health").order_by("name")]


def pipeline_row(pipeline: Pipeline) -> PipelineRow:
    return _row(pipeline)


@dataclass
class GroupRow:
    """A consumer group Tally does not run, as last sampled by reconciliation's snapshots."""

    group_id: str
    lag_records: int | None
    lag_seconds: float | None
    records_per_second: float | None
    taken_at: object
    cluster: str = "default"

    def as_json(self) -> dict:
        return {"group_id": self.group_id, "cluster": self.cluster, "lag_records": self.lag_records,
                "lag_seconds": self.lag_seconds,
                "records_per_second": self.records_per_second,
                "sampled_at": self.taken_at.isoformat() if self.taken_at else None}


def external_group_rows() -> list[GroupRow]:
    """The whole-group sample of every group that is not a pipeline's, from the latest snapshot pass (one `now`
    for every sample of a pass, consumers/reconciliation/snapshots.py). A group the pass did not sample -- Kafka
    no longer lists it (deleted, its offsets expired) or it is a pipeline's group again -- is left out: its last
    sample would otherwise be shown and exported as its lag for as long as snapshots are kept."""
    latest_pass = LagSnapshot.objects.aggregate(at=Max("taken_at"))["at"]
    pipelines_group = Pipeline.objects.filter(group_id=OuterRef("group_id"), cluster=OuterRef("cluster"))
    latest = (LagSnapshot.objects.filter(pipeline__isnull=True, partition__isnull=True, taken_at=latest_pass)
              .exclude(group_id="").exclude(Exists(pipelines_group))
              .order_by("cluster", "group_id", "-taken_at").distinct("cluster", "group_id"))
    return [GroupRow(s.group_id, s.lag_records, s.lag_seconds, s.records_per_second, s.taken_at, s.cluster)
            for s in latest]


@dataclass
class PartitionRow:
    partition: int
    next_offset: int | None
    replay_until: int | None
    health: PartitionHealth | None

    def __getattr__(self, name):
        # Health fields (log_start, high_watermark, lag_records, ...) read through; None before a check.
        health = self.__dict__.get("health")
        if name in _HEALTH_FIELDS:
            return getattr(health, name) if health is not None else None
        raise AttributeError(name)

    @property
    def ahead(self) -> dict | None:
        """The "position ahead of log end" finding of the last reconciliation, if any."""
        findings = self.health.findings if self.health is not None else None
        return next((f for f in findings or [] if isinstance(f, dict) and f.get("kind") == "ahead"), None)

    def as_json(self) -> dict:
        data = {"partition": self.partition, "next_offset": self.next_offset, "replay_until": self.replay_until}
        for name in _HEALTH_FIELDS:
            value = getattr(self, name)
            data[name] = value.isoformat() if hasattr(value, "isoformat") else value
        if self.health is not None and self.health.next_offset is not None and self.next_offset is None:
            data["next_offset"] = self.health.next_offset
        return data


_HEALTH_FIELDS = ("log_start", "high_watermark", "kafka_committed", "lag_records", "lag_seconds",
                  "verified_offset", "lost", "duplicated", "phantom", "dead_lettered", "unrecoverable",
                  "findings", "status", "checked_at")


def partition_rows(pipeline: Pipeline) -> list[PartitionRow]:
    """Per-partition state: the DB position joined with the latest reconciliation. Two queries."""
    offsets = {o.partition: o for o in PartitionOffset.objects.filter(pipeline=pipeline)}
    health = {h.partition: h for h in PartitionHealth.objects.filter(pipeline=pipeline)}
    rows = []
    for partition in sorted(set(offsets) | set(health)):
        offset = offsets.get(partition)
        rows.append(PartitionRow(partition, offset.next_offset if offset else None,
                                 offset.replay_until if offset else None, health.get(partition)))
    return rows


CHART_RANGES = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "24h": timedelta(hours=24)}
DEFAULT_CHART_RANGE = "1h"


def chart_series(pipeline: Pipeline, now=None, range_name: str = DEFAULT_CHART_RANGE) -> dict:
    """Lag and throughput over the chosen range for the pipeline total, as parallel arrays (uPlot's data
    shape: x in Unix seconds), with the range's bounds so that one sample is drawn in its hour, not years."""
    if range_name not in CHART_RANGES:
        raise ValueError(unknown_chart_range(range_name))
    now = now or timezone.now()
    window = CHART_RANGES[range_name]
    samples = list(LagSnapshot.objects.filter(pipeline=pipeline, partition__isnull=True,
                                              taken_at__gte=now - window)
                   .order_by("-taken_at").values_list("taken_at", "lag_records", "lag_seconds",
                                                      "records_per_second")[:CHART_MAX_POINTS])
    samples.reverse()
    return {"t": [round(s[0].timestamp(), 3) for s in samples], "lag_records": [s[1] for s in samples],
            "lag_seconds": [s[2] for s in samples], "records_per_second": [s[3] for s in samples],
            "from": round((now - window).timestamp(), 3), "to": round(now.timestamp(), 3),
            "range": range_name}


def unknown_chart_range(range_name: str) -> str:
    """Why a chart range is refused ("" for one of CHART_RANGES): another range than asked would mislead."""
    if range_name in CHART_RANGES:
        return ""
    return f"Unknown range {range_name[:40]!r}: choose one of {', '.join(CHART_RANGES)}."


def recent_dead_letters(pipeline: Pipeline, limit: int = RECENT_ROWS):
    return list(DeadLetter.objects.filter(pipeline=pipeline).order_by("-created_at", "-offset")[:limit])


def recent_actions(pipeline: Pipeline | None = None, limit: int = RECENT_ROWS):
    actions = ActionLog.objects.select_related("pipeline")
    if pipeline is not None:
        actions = actions.filter(pipeline=pipeline)
    return list(actions.order_by("-created_at")[:limit])


def recent_group_actions(group_id: str, cluster: str, limit: int = 20) -> list[ActionLog]:
    """The newest entries about a group on a cluster: an entry names its cluster in its parameters; one that
    names none (written before clusters) is about the default cluster."""
    on_cluster = Q(params__cluster=cluster)
    if cluster == clusters.DEFAULT:
        on_cluster |= ~Q(params__has_key="cluster")
    entries = ActionLog.objects.select_related("pipeline").filter(on_cluster, group_id=group_id)
    return list(entries.order_by("-created_at")[:limit])


def action_log_pipelines() -> tuple[list[str], list[str]]:
    """(pipelines now, deleted pipelines): the names the action log can be filtered by."""
    names = list(Pipeline.objects.order_by("name").values_list("name", flat=True))
    current = set(names)
    return names, [n for n in ActionLog.objects.deleted_pipeline_names() if n not in current]


def unknown_action_log_pipeline(name: str, names: tuple[list[str], list[str]] | None = None) -> str:
    """The refusal of a filter by a name no pipeline ever had ("" for a name one has, or had). `names`: what
    action_log_pipelines() returned, when the caller has it already."""
    current, deleted = names or action_log_pipelines()
    if name in current or name in deleted:
        return ""
    return f"No pipeline named {name[:100]!r}, now or deleted: choose one the list offers."


def recent_runs(pipeline: Pipeline, limit: int = 10, now=None):
    """The newest runs, each with its `liveness` by the one rule (a killed run reads dead, never running)."""
    runs = ConsumerRun.objects.filter(pipeline=pipeline).with_liveness(now or timezone.now())
    return list(runs.order_by("-started_at")[:limit])


@dataclass
class PipelineSummary:
    """Counts for the header of the pipeline page."""

    dead_letters: int = 0
    pending_dead_letters: int = 0   # not discarded: what a replay could still turn into rows
    live_runs: int = 0
    last_heartbeat: object = None
    extra: dict = field(default_factory=dict)

    @property
    def discarded_dead_letters(self) -> int:
        return self.dead_letters - self.pending_dead_letters


def pipeline_summary(pipeline: Pipeline, runs, now=None) -> PipelineSummary:
    last = max((r.heartbeat_at for r in runs), default=None)
    serving = ConsumerRun.objects.filter(pipeline=pipeline).serving(now or timezone.now()).count()
    letters = DeadLetter.objects.filter(pipeline=pipeline).aggregate(
        total=Count("pk"), pending=Count("pk", filter=Q(discarded_at=None)))
    return PipelineSummary(dead_letters=letters["total"], pending_dead_letters=letters["pending"],
                           live_runs=serving, last_heartbeat=last)


def last_reconciliation():
    # Every pipeline has a PipelineHealth row once reconciled; one that never ran has no PartitionHealth.
    return PipelineHealth.objects.aggregate(last=Max("checked_at"))["last"]


HEALTH_FIELDS = ("status", "lost", "duplicated", "phantom", "dead_lettered", "lag_records", "lag_seconds")
PARTITION_FIELDS = ("partition", "log_start", "high_watermark", "next_offset", "kafka_committed", "lag_records",
                    "lag_seconds", "lost", "duplicated", "phantom", "dead_lettered", "unrecoverable", "findings",
                    "status")


def stored_reconciliation(pipeline: Pipeline) -> dict:
    """The last reconciliation as stored (PipelineHealth / PartitionHealth), in the shape of
    consumers.reconcile_report.report_json: reading it writes nothing."""
    health = PipelineHealth.objects.filter(pipeline=pipeline).first()
    entry = {"name": pipeline.name, "checked_at": health.checked_at.isoformat() if health else None}
    entry.update({name: getattr(health, name) if health else None for name in HEALTH_FIELDS})
    entry["partitions"] = [
        {name: getattr(part, name) for name in PARTITION_FIELDS} | {"checked_at": part.checked_at.isoformat()}
        for part in PartitionHealth.objects.filter(pipeline=pipeline).order_by("partition")]
    return {"pipelines": [entry]}


@dataclass
class MappedColumn:
    """A sink column of a `json` pipeline and what writes it."""

    name: str
    pg_type: str
    source: str | None   # the --map source, or the field of the column's name; None: the mapping does not write it
    mapped: bool         # the source is the pipeline's own --map (not the field of the column's name)
    left_to: str = ""    # who fills a column the mapping does not write: "its default" or "PostgreSQL" (generated)


def json_mapping(pipeline: Pipeline) -> tuple[list[MappedColumn], str]:
    """A `json` pipeline's columns and the source of each, compiled as its next run would compile them (one
    catalog query), and "" -- or the stored --map alone and why it does not compile against the table now."""
    from django.db import connection

    from consumers.engine import json_map

    mapping = dict(pipeline.json_map or {})
    stored = [MappedColumn(column, "", source, True) for column, source in mapping.items()]
    with connection.cursor() as cursor:
        columns = json_map.read_columns(cursor.cursor, pipeline.sink_table)
        if columns is None:
            return stored, f"sink table {pipeline.sink_table!r} does not exist"
    try:
        plan = json_map.plan(columns, mapping)
    except json_map.MappingInvalid as exc:
        return stored, str(exc)
    written = {w.column.name: w for w in plan.columns}
    rows = []
    for column in columns:
        if column.name in written:
            rows.append(MappedColumn(column.name, column.pg_type, written[column.name].source,
                                     not written[column.name].field))
        elif column.name not in json_map.PROVENANCE_COLUMNS:
            rows.append(MappedColumn(column.name, column.pg_type, None, False,
                                     "PostgreSQL" if column.generated else "its default"))
    return rows, ""
