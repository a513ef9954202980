"""What reconciliation reports: per partition and per pipeline, and the JSON shape of the CLI and the API
(`{"pipelines": [{"name", "status", "lost", "duplicated", "phantom", "dead_lettered", "lag_records",
"lag_seconds", "partitions": [{"partition", "log_start", "high_watermark", "next_offset", "kafka_committed",
"lost", "duplicated", "phantom", "findings", ...}]}]}`). Counts are numbers of records."""
from dataclasses import dataclass, field
from datetime import datetime

from consumers.models import Status
from consumers.reconciliation.findings import Finding

# Kinds that are incidents (exit code 1, status ERR); dead letters are accounted for, hence exact.
INCIDENT_KINDS = ("lost", "duplicated", "phantom", "gap", "overlap", "unrecoverable")


@dataclass
class PartitionReport:
    partition: int
    log_start: int | None = None
    high_watermark: int | None = None
    next_offset: int | None = None
    kafka_committed: int | None = None
    lag_records: int | None = None
    lag_seconds: float | None = None
    lost: int = 0
    duplicated: int = 0
    phantom: int = 0
    dead_lettered: int = 0
    unrecoverable: int = 0
    gap: int = 0
    overlap: int = 0
    skipped: int = 0                  # offsets an operator rewind forward skipped on purpose (not lost)
    superseded: int = 0               # upsert: records overwritten by a later record of their key (not lost)
    deleted: int = 0                  # upsert: keys whose last record, a tombstone, deleted their row
    findings: list[Finding] = field(default_factory=list)
    status: str = Status.OK
    verified_offset: int | None = None
    checked_from: int | None = None   # the range read by this run: [checked_from, verified_offset)
    proven: bool = True               # the cheap aggregate proved the new range without locating anything

    @property
    def incident(self) -> bool:
        return any(f.kind in INCIDENT_KINDS and not f.planned for f in self.findings)

    def as_json(self) -> dict:
        return {"partition": self.partition, "log_start": self.log_start, "high_watermark": self.high_watermark,
                "next_offset": self.next_offset, "kafka_committed": self.kafka_committed,
                "lag_records": self.lag_records, "lag_seconds": self.lag_seconds, "lost": self.lost,
                "duplicated": self.duplicated, "phantom": self.phantom, "dead_lettered": self.dead_lettered,
                "unrecoverable": self.unrecoverable, "gap": self.gap, "overlap": self.overlap,
                "skipped_by_rewind": self.skipped, "superseded": self.superseded, "deleted": self.deleted,
                "status": self.status, "verified_offset": self.verified_offset,
                "findings": [f.as_json() for f in self.findings]}


@dataclass
class PipelineReport:
    name: str
    status: str
    delivery_mode: str
    partitions: list[PartitionReport]
    lag_records: int | None
    lag_seconds: float | None
    records_per_second: float | None
    checked_at: datetime
    kafka_error: str = ""
    sink_error: str = ""     # the sink cannot be written (dropped, a column or privilege missing): ERR
    db_ms: float = 0.0       # time spent in PostgreSQL (verification, history, storing)
    kafka_ms: float = 0.0    # time spent in Kafka calls (committed offsets, watermarks, timestamps)

    def _sum(self, name: str) -> int:
        return sum(getattr(p, name) for p in self.partitions)

    lost = property(lambda self: self._sum("lost"))
    duplicated = property(lambda self: self._sum("duplicated"))
    phantom = property(lambda self: self._sum("phantom"))
    dead_lettered = property(lambda self: self._sum("dead_lettered"))
    unrecoverable = property(lambda self: self._sum("unrecoverable"))
    gap = property(lambda self: self._sum("gap"))
    overlap = property(lambda self: self._sum("overlap"))

    @property
    def exact(self) -> bool:
        """No loss, duplication, phantom, gap, overlap or unrecoverable record in any partition, and a sink
        that can be checked at all."""
        return not self.sink_error and not any(p.incident for p in self.partitions)

    def as_json(self) -> dict:
        return {"name": self.name, "status": self.status, "delivery_mode": self.delivery_mode,
                "exact": self.exact, "lost": self.lost, "duplicated": self.duplicated, "phantom": self.phantom,
                "dead_lettered": self.dead_lettered, "unrecoverable": self.unrecoverable, "gap": self.gap,
                "overlap": self.overlap, "lag_records": self.lag_records, "lag_seconds": self.lag_seconds,
                "records_per_second": self.records_per_second, "kafka_error": self.kafka_error or None,
                "sink_error": self.sink_error or None,
                "checked_at": self.checked_at.isoformat(),
                "partitions": [p.as_json() for p in self.partitions]}


def report_json(reports: list[PipelineReport]) -> dict:
    """The JSON shape of the CLI and `/api/pipelines/NAME/reconciliation`."""
    return {"pipelines": [r.as_json() for r in reports]}


def count_findings(report: PartitionReport) -> None:
    """Set the report's counts from its findings (planned ones are skipped records, not lost)."""
    totals: dict[str, int] = {}
    for finding in report.findings:
        kind = "skipped" if finding.planned and finding.kind == "lost" else finding.kind
        if finding.planned and kind == "gap":
            continue
        totals[kind] = totals.get(kind, 0) + int(finding.count)
    report.skipped = totals.get("skipped", 0)
    report.lost, report.duplicated = totals.get("lost", 0), totals.get("duplicated", 0)
    report.phantom, report.dead_lettered = totals.get("phantom", 0), totals.get("dead_letter", 0)
    report.unrecoverable, report.gap = totals.get("unrecoverable", 0), totals.get("gap", 0)
    report.overlap = totals.get("overlap", 0)
    report.superseded, report.deleted = totals.get("superseded", 0), totals.get("deleted", 0)
