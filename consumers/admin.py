"""Django admin for Tally's models. Positions, the ledger, dead letters, runs, the action log and
reconciliation results are read-only here: editing them would break the invariants of the commit
protocol (DESIGN.md) — positions move only through commits and audited rewinds.

Pipelines are added, changed (the reading settings, while stopped) and deleted through
consumers.operations.pipeline_setup, validated and audited like every other door (consumers/admin_pipelines.py).
Operators act from here too (consumers/admin_actions.py): pipelines start, stop, pause, resume, restart
and rewind; dead letters are replayed or discarded — through the same functions as the dashboard."""
from django.contrib import admin
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from consumers import admin_actions
from consumers.admin_actions import OperatorActionsMixin, dashboard_link, pipeline_dashboard_url
from consumers.admin_base import BoundedDatesChangeList, FormRefusalsAudited, ReadOnlyAdmin
from consumers.admin_pipelines import PipelineAdminMixin
from consumers.models import (
    ActionLog,
    BatchLedger,
    ConsumerRun,
    DeadLetter,
    DeadLetterReplay,
    LagSnapshot,
    PartitionHealth,
    PartitionOffset,
    Pipeline,
    PipelineHealth,
    TopicCheckJob,
)


class PipelineLinkMixin:
    """A column linking the row's pipeline to its dashboard page."""

    @admin.display(description="dashboard")
    def dashboard(self, obj):
        pipeline = obj if isinstance(obj, Pipeline) else obj.pipeline
        return dashboard_link(pipeline_dashboard_url(pipeline), pipeline.name) if pipeline else "—"


@admin.register(Pipeline)
class PipelineAdmin(FormRefusalsAudited, PipelineAdminMixin, OperatorActionsMixin, PipelineLinkMixin, admin.ModelAdmin):
    list_display = ("name", "topic", "sink_table", "delivery_mode", "engine", "desired_state", "epoch", "dashboard")
    list_filter = ("delivery_mode", "engine", "desired_state")
    search_fields = ("name", "topic", "sink_table", "group_id")
    # The epoch fences writers and the supervision fields belong to the supervisor: never typed by hand.
    # The desired state changes only through the audited actions below, never by editing the row.
    readonly_fields = ("desired_state", "epoch", "restart_attempts", "restart_after", "last_error", "created_at",
                       "updated_at", "dashboard")
    actions = [admin_actions.start, admin_actions.stop, admin_actions.pause, admin_actions.resume,
               admin_actions.restart, admin_actions.rewind]
    operator_actions = ("start", "stop", "pause", "resume", "restart", "rewind")

    def pipelines_of(self, selected_ids):
        return list(Pipeline.objects.filter(pk__in=[i for i in selected_ids if i.isascii() and i.isdigit()]))


@admin.register(PartitionOffset)
class PartitionOffsetAdmin(PipelineLinkMixin, ReadOnlyAdmin):
    list_display = ("pipeline", "partition", "next_offset", "replay_until", "updated_at", "dashboard")
    list_filter = ("pipeline",)


@admin.register(BatchLedger)
class BatchLedgerAdmin(ReadOnlyAdmin):
    list_display = ("pipeline", "partition", "first_offset", "end_offset", "records", "rows_written",
                    "dead_letters", "epoch", "superseded_from", "note", "committed_at")
    list_filter = ("pipeline", "partition")
    date_hierarchy = "committed_at"

    def get_changelist(self, request, **kwargs):
        return BoundedDatesChangeList


@admin.register(DeadLetter)
class DeadLetterAdmin(OperatorActionsMixin, PipelineLinkMixin, ReadOnlyAdmin):
    list_display = ("pipeline", "partition", "offset", "error", "replay_attempts", "discarded_at", "created_at",
                    "dashboard")
    list_filter = ("pipeline", ("discarded_at", admin.EmptyFieldListFilter))
    search_fields = ("error", "discard_reason")
    actions = [admin_actions.replay_dead_letters, admin_actions.replay_dead_letters_from_kafka,
               admin_actions.discard_dead_letters]
    operator_actions = ("replay_dead_letters", "replay_dead_letters_from_kafka", "discard_dead_letters")

    def pipelines_of(self, selected_ids):
        ids = [i for i in selected_ids if i.isascii() and i.isdigit()]
        return list(Pipeline.objects.filter(dead_letters__pk__in=ids).distinct())


@admin.register(DeadLetterReplay)
class DeadLetterReplayAdmin(PipelineLinkMixin, ReadOnlyAdmin):
    list_display = ("pipeline", "partition", "offset", "rows_written", "source", "actor", "replayed_at", "dashboard")
    list_filter = ("pipeline", "source")


@admin.register(ConsumerRun)
class ConsumerRunAdmin(ReadOnlyAdmin):
    list_display = ("pipeline", "epoch", "host", "pid", "liveness", "state", "records_processed", "heartbeat_at",
                    "ended_at")
    list_filter = ("state", "pipeline")

    def get_queryset(self, request):
        return super().get_queryset(request).with_liveness(timezone.now())

    @admin.display(description="liveness")
    def liveness(self, obj):
        """By the one rule (ConsumerRun.liveness): a killed run reads dead, whatever its stored state says."""
        shown = obj.liveness
        return f"{shown.label}: {shown.reason}" if shown.kind == "dead" else shown.label


@admin.register(ActionLog)
class ActionLogAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor", "action", "pipeline", "group_id", "dry_run", "result", "dashboard")
    list_filter = ("action", "result", "dry_run")
    search_fields = ("actor", "group_id", "message")

    @admin.display(description="dashboard")
    def dashboard(self, obj):
        if obj.pipeline_id:
            return dashboard_link(pipeline_dashboard_url(obj.pipeline), obj.pipeline.name)
        if obj.group_id:
            try:
                return dashboard_link(reverse("group", kwargs={"group_id": obj.group_id}), obj.group_id)
            except NoReverseMatch:   # an id no URL can hold (a newline): a refusal stores what was asked
                return obj.group_id
        return dashboard_link(reverse("action_log"), "action log")


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


@admin.register(TopicCheckJob)
class TopicCheckJobAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "topic", "group_id", "table", "status", "progress", "requested_by")
    list_filter = ("status",)

    def get_queryset(self, request):
        return super().get_queryset(request).of_pipelines()
