"""Django admin for Tally's models. Positions, the ledger, dead letters, runs, the audit log and
reconciliation results are read-only here: editing them would break the invariants of the commit
protocol (DESIGN.md) — positions move only through commits and audited rewinds."""
from django.contrib import admin

from consumers.models import (
    ActionLog,
    AuditJob,
    BatchLedger,
    ConsumerRun,
    DeadLetter,
    LagSnapshot,
    PartitionHealth,
    PartitionOffset,
    Pipeline,
    PipelineHealth,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Lists and shows rows; never adds, changes or deletes them."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Pipeline)
class PipelineAdmin(admin.ModelAdmin):
    list_display = ("name", "topic", "sink_table", "delivery_mode", "engine", "desired_state", "epoch")
    list_filter = ("delivery_mode", "engine", "desired_state")
    search_fields = ("name", "topic", "sink_table", "group_id")
    # The epoch fences writers and the supervision fields belong to the supervisor: never typed by hand.
    readonly_fields = ("epoch", "restart_attempts", "restart_after", "last_error", "created_at", "updated_at")


@admin.register(PartitionOffset)
class PartitionOffsetAdmin(ReadOnlyAdmin):
    list_display = ("pipeline", "partition", "next_offset", "replay_until", "updated_at")
    list_filter = ("pipeline",)


@admin.register(BatchLedger)
class BatchLedgerAdmin(ReadOnlyAdmin):
    list_display = ("pipeline", "partition", "first_offset", "end_offset", "records", "rows_written",
                    "dead_letters", "epoch", "superseded_from", "note", "committed_at")
    list_filter = ("pipeline", "partition")
    date_hierarchy = "committed_at"


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    list_display = ("pipeline", "partition", "offset", "error", "created_at")
    list_filter = ("pipeline",)
    search_fields = ("error",)


@admin.register(ConsumerRun)
class ConsumerRunAdmin(ReadOnlyAdmin):
    list_display = ("pipeline", "epoch", "host", "pid", "state", "records_processed", "heartbeat_at", "ended_at")
    list_filter = ("state", "pipeline")


@admin.register(ActionLog)
class ActionLogAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor", "action", "pipeline", "group_id", "dry_run", "result")
    list_filter = ("action", "result", "dry_run")
    search_fields = ("actor", "group_id", "message")


@admin.register(PartitionHealth)
class PartitionHealthAdmin(ReadOnlyAdmin):
    list_display = ("pipeline", "partition", "status", "lag_records", "lag_seconds", "lost", "duplicated",
                    "phantom", "verified_offset", "checked_at")
    list_filter = ("status", "pipeline")


@admin.register(PipelineHealth)
class PipelineHealthAdmin(ReadOnlyAdmin):
    list_display = ("pipeline", "status", "lag_records", "lag_seconds", "records_per_second", "lost",
                    "duplicated", "phantom", "checked_at")
    list_filter = ("status",)


@admin.register(LagSnapshot)
class LagSnapshotAdmin(ReadOnlyAdmin):
    list_display = ("taken_at", "pipeline", "group_id", "partition", "lag_records", "lag_seconds",
                    "records_per_second", "resolution_seconds")
    list_filter = ("pipeline",)


@admin.register(AuditJob)
class AuditJobAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "topic", "group_id", "table", "status", "progress", "requested_by")
    list_filter = ("status",)
