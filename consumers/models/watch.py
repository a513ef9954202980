"""Watches: consumer groups that Tally monitors but does not run (docs/watch.md).

A watch names a group, a topic and a cluster; optionally the table the group writes and how a record maps
to a row (`record_id`: value, key, json:PATH or offset; `row_id`: the table's columns). Its delivery audit
(consumers/reconciliation/watch_audit.py) settles each partition range by range: `WatchPartition` keeps
where the audit stands and what lag and status were measured, `WatchRange` one row per settled range with
what it found (offsets of the first findings included), `WatchFinding` every finding, a row per run of
consecutive offsets alike (for the export and the trace).
"""
from django.db import models
from django.utils import timezone

from consumers.models.reconciliation import UNKNOWN, Status

# Offsets listed per range and per finding kind: enough to trace a demo's losses one by one, small enough
# for one JSON column when a whole range is lost.
OFFSETS_LISTED = 1000
# Ranges a watch's detail lists, newest first (its page, the API, `watch show`): a watch with a finding at every
# check adds thousands a day, and findings.csv has them all.
RANGES_SHOWN = 200


class Watch(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    group_id = models.CharField(max_length=255)
    topic = models.CharField(max_length=249)
    cluster = models.CharField(max_length=100, default="default",
                               help_text="The Kafka cluster the group reads (default: the KAFKA_* settings).")
    topic_id = models.CharField(max_length=36, blank=True, default="", help_text=(
        "The topic's id (KIP-516) the watch audits: a topic deleted and created again under its name has another. "
        "Empty: the broker gives none (or not seen yet)."))
    # The audit: all empty for a watch of lag and status only.
    # `table` (on the search_path) or `schema.table`: consumers/engine/table_names.py (63 + 1 + 63 characters).
    sink_table = models.CharField(max_length=127, blank=True, default="",
                                  help_text="table or schema.table: the table the group writes.")
    record_id = models.CharField(max_length=300, blank=True, default="",
                                 help_text="value, key, json:PATH or offset: what in a record names its row.")
    row_id = models.CharField(max_length=200, blank=True, default="",
                              help_text="The table's column(s) holding the record id (PART_COL,OFFSET_COL for "
                                        "offset).")
    start_from = models.CharField(max_length=40, default="earliest",
                                  help_text="earliest, latest or an ISO datetime: where the audit starts.")
    settle_seconds = models.PositiveIntegerField(default=30, help_text=(
        "A committed range is audited once its commit is this old: a consumer that commits before it writes "
        "needs the time to write."))
    ignore = models.JSONField(default=list, blank=True,
                              help_text="SPEC=VALUE strings: records the consumer skips on purpose.")
    keyed = models.BooleanField(default=False, help_text=(
        "An update stream the consumer upserts: one row per id, for its latest record; a tombstone expects none."))
    created_at = models.DateTimeField(default=timezone.now)
    # What the last check measured, for lists and alerts (per partition: WatchPartition).
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OK)
    lag_records = models.BigIntegerField(null=True, blank=True)
    lag_seconds = models.FloatField(null=True, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    last_notes = models.JSONField(default=list, blank=True, help_text=(
        "What the last check noted, e.g. why rows at positions without a record are not counted as phantoms."))

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def reported_status(self) -> str:
        """The status the last check measured; UNKNOWN before the first check (the row's default OK was never
        measured: a watch just created must not read as healthy on a list, the API or /metrics)."""
        return self.status if self.checked_at else UNKNOWN

    @property
    def audits(self) -> bool:
        """It names a table: delivery is audited, not only lag."""
        return bool(self.sink_table)

    @property
    def row_columns(self) -> list[str]:
        return [c for c in self.row_id.split(",") if c]


class WatchPartition(models.Model):
    """One partition of a watch: where its audit stands (`settled_offset`: positions below it are settled),
    the group's commits as Tally saw them, and the latest lag and status."""

    watch = models.ForeignKey(Watch, on_delete=models.CASCADE, related_name="partitions")
    partition = models.PositiveIntegerField()
    start_offset = models.BigIntegerField(help_text="Where the audit of this partition started.")
    settled_offset = models.BigIntegerField()
    # [[offset, iso time], ...]: the committed offsets seen by recent checks, oldest first. A range is
    # settled once the commit that covers it was seen at least settle_seconds ago.
    commits_seen = models.JSONField(default=list)
    committed = models.BigIntegerField(null=True, blank=True)
    moved_at = models.DateTimeField(null=True, blank=True, help_text="When the committed offset last changed.")
    log_start = models.BigIntegerField(null=True, blank=True)
    high_watermark = models.BigIntegerField(null=True, blank=True)
    lag_records = models.BigIntegerField(null=True, blank=True)
    lag_seconds = models.FloatField(null=True, blank=True)
    checked = models.BigIntegerField(default=0)
    lost = models.BigIntegerField(default=0)
    duplicated = models.BigIntegerField(default=0)
    phantom = models.BigIntegerField(default=0)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OK)
    checked_at = models.DateTimeField(null=True, blank=True)
    # Positions below this may have been emptied by compaction (the topic was seen compacted): a row at a hole
    # there is never a phantom, whatever the policy is now (consumers/reconciliation/watch_compaction.py).
    compacted_below = models.BigIntegerField(null=True, blank=True)
    compacting = models.BooleanField(default=False, help_text="The last cleanup.policy read was compacted.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["watch", "partition"], name="uniq_watch_partition")]
        ordering = ["watch", "partition"]

    def __str__(self):
        return f"{self.watch}[{self.partition}] settled={self.settled_offset}"

    @property
    def position(self):
        return self.committed

    @property
    def reported_status(self) -> str:
        """As Watch.reported_status, for this partition (one the topic gained since the last check too)."""
        return self.status if self.checked_at else UNKNOWN


class WatchRangeQuerySet(models.QuerySet):
    def newest(self):
        """Newest first, in the order watch_range_newest_idx holds them: a watch's page reads its first
        RANGES_SHOWN from the index, never sorting a history of hundreds of thousands of ranges."""
        return self.order_by("-checked_at", "partition", "-start")


class WatchRange(models.Model):
    """One settled range [start, end) of positions of one partition, and what its audit found. Records
    counts the data records the range held (holes — transaction markers, aborted records — are positions
    without a record, never lost)."""

    watch = models.ForeignKey(Watch, on_delete=models.CASCADE, related_name="ranges")
    partition = models.PositiveIntegerField()
    start = models.BigIntegerField()
    end = models.BigIntegerField(help_text="Exclusive.")
    records = models.BigIntegerField(default=0)
    ignored = models.BigIntegerField(default=0, help_text="Records matching an ignore spec: no row expected.")
    superseded = models.BigIntegerField(default=0, help_text="Keyed: records a later record of their id replaced.")
    unreadable = models.BigIntegerField(default=0, help_text="Records whose id could not be derived (no row expected).")
    lost = models.BigIntegerField(default=0)
    duplicated = models.BigIntegerField(default=0, help_text="Extra rows: rows beyond the one expected.")
    phantom = models.BigIntegerField(default=0)
    # [offset, ...] and [[offset, rows], ...]: the first OFFSETS_LISTED of each, in offset order.
    lost_offsets = models.JSONField(default=list)
    duplicated_offsets = models.JSONField(default=list)
    phantom_offsets = models.JSONField(default=list)
    note = models.CharField(max_length=300, blank=True, default="")
    engine = models.CharField(max_length=10, default="postgres")
    checked_at = models.DateTimeField(default=timezone.now)

    objects = WatchRangeQuerySet.as_manager()

    class Meta:
        ordering = ["watch", "partition", "start"]
        indexes = [models.Index(fields=["watch", "partition", "start"], name="watch_range_idx"),
                   models.Index(fields=["watch", "-checked_at", "partition", "-start"], name="watch_range_newest_idx")]

    @property
    def findings(self) -> bool:
        return bool(self.lost or self.duplicated or self.phantom)


class WatchFinding(models.Model):
    """Findings of a watch's audit: records lost or duplicated, or phantom rows' positions, at `run_length`
    consecutive offsets from `offset`, all of one kind (and, duplicated, the same extra rows). WatchRange lists
    the first OFFSETS_LISTED of each kind per range; these rows hold all of them (the CSV export, the trace).
    A consumer that loses records loses them in runs (committed past them, or rewound over them), so a run
    per row keeps a million lost records one row, not a million. Written by the audit in one INSERT ... SELECT
    from its findings statement."""

    LOST, DUPLICATED, PHANTOM = "lost", "duplicated", "phantom"

    watch = models.ForeignKey(Watch, on_delete=models.CASCADE, related_name="finding_rows")
    partition = models.PositiveIntegerField()
    offset = models.BigIntegerField(help_text="The run's first offset.")
    run_length = models.BigIntegerField(default=1, help_text="Consecutive offsets from `offset`.")
    kind = models.CharField(max_length=10)
    extra = models.BigIntegerField(default=0, help_text="duplicated: the rows beyond those expected, at each offset.")
    checked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["watch", "partition", "offset"]
        indexes = [models.Index(fields=["watch", "partition", "offset"], name="watch_finding_idx")]

    def __str__(self):
        return f"{self.watch_id}[{self.partition}]@{self.offset}+{self.run_length} {self.kind}"
