"""What reconciliation found, per pipeline and partition, and lag/throughput snapshots for charts."""
from django.db import models
from django.db.models import OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce, Least
from django.utils import timezone

from consumers.models.pipeline import BatchLedger


class Status(models.TextChoices):
    """Lag evaluation status (rules documented in docs/reconciliation.md)."""
    OK = "OK", "OK"
    WARN = "WARN", "WARN"
    ERR = "ERR", "ERR"
    STALL = "STALL", "STALL"
    STOP = "STOP", "STOP"
    REWIND = "REWIND", "REWIND"


# What lists, the API and /metrics show for something never measured (a pipeline never reconciled, a watch never
# checked): not a Status, as nothing was evaluated, and never stored.
UNKNOWN = "UNKNOWN"


class PartitionHealthQuerySet(models.QuerySet):
    def verify_again_from(self, offset: int) -> int:
        """Move the incremental mark back to at most `offset`: reconciliation reads those offsets again (after a
        rewind moved the position there, or a dead-letter replay wrote them). Back to the start of the ledger row
        that holds `offset`: a range verified from inside a batch has no whole ledger row to count its holes by,
        and below the log start Kafka can no longer tell a transaction marker from a lost record."""
        # Only a row that still holds `offset` (a rewind trims rows from its new position: superseded_from), and the
        # nearest below it: the index is walked down from `offset`, not up from the partition's first row.
        covering = (BatchLedger.objects.filter(pipeline=OuterRef("pipeline"), partition=OuterRef("partition"),
                                               first_offset__lte=offset, end_offset__gt=offset)
                    .filter(Q(superseded_from__isnull=True) | Q(superseded_from__gt=offset))
                    .order_by("-first_offset").values("first_offset")[:1])
        return self.update(verified_offset=Least("verified_offset", Coalesce(Subquery(covering), Value(offset))))


class PartitionHealth(models.Model):
    """The latest reconciliation of one partition, and the incremental mark `verified_offset`:
    offsets below it have been verified and are not read again (a rewind moves it back)."""

    objects = PartitionHealthQuerySet.as_manager()

    pipeline = models.ForeignKey("consumers.Pipeline", on_delete=models.CASCADE, related_name="partition_health")
    partition = models.PositiveIntegerField()
    verified_offset = models.BigIntegerField(default=0)
    # Highest ledger row id already taken into account: a newer row that starts below verified_offset (an
    # at-least-once re-write) moves the mark back. Per partition, ledger ids follow commit order (the
    # commit protocol inserts them while holding the partition's offset row lock).
    verified_ledger_id = models.BigIntegerField(default=0)
    log_start = models.BigIntegerField(null=True)
    high_watermark = models.BigIntegerField(null=True)
    next_offset = models.BigIntegerField(null=True)
    kafka_committed = models.BigIntegerField(null=True)
    lag_records = models.BigIntegerField(null=True)
    lag_seconds = models.FloatField(null=True)
    lost = models.BigIntegerField(default=0)
    duplicated = models.BigIntegerField(default=0)
    phantom = models.BigIntegerField(default=0)
    dead_lettered = models.BigIntegerField(default=0)
    unrecoverable = models.BigIntegerField(default=0)
    findings = models.JSONField(default=list)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OK)
    checked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pipeline", "partition"], name="uniq_health_partition")]
        ordering = ["pipeline", "partition"]


class PipelineHealth(models.Model):
    pipeline = models.OneToOneField("consumers.Pipeline", on_delete=models.CASCADE, related_name="health")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OK)
    lost = models.BigIntegerField(default=0)
    duplicated = models.BigIntegerField(default=0)
    phantom = models.BigIntegerField(default=0)
    dead_lettered = models.BigIntegerField(default=0)
    lag_records = models.BigIntegerField(null=True)
    lag_seconds = models.FloatField(null=True)
    records_per_second = models.FloatField(null=True)
    checked_at = models.DateTimeField(default=timezone.now)


class LagSnapshot(models.Model):
    """Periodic lag/throughput sample of a pipeline or a watch. partition=None is the total. Old samples are downsampled
    (resolution grows) and finally deleted so the table stays bounded."""

    pipeline = models.ForeignKey("consumers.Pipeline", null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="snapshots")
    # A watch's samples (pipeline NULL): the same series per partition and total as a pipeline's.
    watch = models.ForeignKey("consumers.Watch", null=True, blank=True, on_delete=models.CASCADE,
                              related_name="snapshots")
    group_id = models.CharField(max_length=255, blank=True, default="")
    # The Kafka cluster of the group: two clusters can each have a group of one name.
    cluster = models.CharField(max_length=64, default="default")
    partition = models.IntegerField(null=True, blank=True)
    taken_at = models.DateTimeField(default=timezone.now)
    resolution_seconds = models.PositiveIntegerField(default=0)
    lag_records = models.BigIntegerField(null=True)
    lag_seconds = models.FloatField(null=True)
    position = models.BigIntegerField(null=True)
    high_watermark = models.BigIntegerField(null=True)
    records_per_second = models.FloatField(null=True)

    class Meta:
        indexes = [models.Index(fields=["pipeline", "partition", "taken_at"], name="snapshot_series_idx"),
                   models.Index(fields=["watch", "partition", "taken_at"], name="snapshot_watch_series_idx"),
                   models.Index(fields=["group_id", "taken_at"], name="snapshot_group_idx"),
                   models.Index(fields=["taken_at"], name="snapshot_time_idx")]
