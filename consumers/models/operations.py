"""The action log of operator actions (start, stop, pause, resume, restart, rewind, group offset reset)."""
from django.db import models
from django.utils import timezone


class ActionResult(models.TextChoices):
    RUNNING = "running", "running"
    DONE = "done", "done"
    REFUSED = "refused", "refused"
    FAILED = "failed", "failed"


# Actions that move a pipeline's positions: reconciliation and alerts read those that took effect back from the log
# (consumers/reconciliation/rewinds.py).
REWIND_ACTIONS = ("rewind", "reset_group")


class ActionLogQuerySet(models.QuerySet):
    def rewinds_in_effect(self):
        """Rewinds and group resets that took effect: dry runs and refused or failed ones changed nothing."""
        return (self.filter(action__in=REWIND_ACTIONS, dry_run=False)
                .exclude(result__in=(ActionResult.REFUSED, ActionResult.FAILED)))

    def of_pipeline_named(self, name: str):
        """The entries of the pipeline called `name`, also after it was deleted: a deletion keeps the name in its
        entries' parameters (pipeline_setup.delete)."""
        return self.filter(models.Q(pipeline__name=name) | models.Q(pipeline__isnull=True, params__pipeline=name))

    def deleted_pipeline_names(self) -> list[str]:
        """Names of deleted pipelines, from their deletion entries (a refusal may name a pipeline never made)."""
        names = self.filter(pipeline__isnull=True, action="delete", result=ActionResult.DONE,
                            params__has_key="pipeline").order_by().values_list("params__pipeline", flat=True)
        return sorted({name for name in names if isinstance(name, str)})


class ActionLog(models.Model):
    pipeline = models.ForeignKey("consumers.Pipeline", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="actions")
    group_id = models.CharField(max_length=255, blank=True, default="",
                                help_text="For actions on consumer groups that Tally does not run.")
    action = models.CharField(max_length=30)
    actor = models.CharField(max_length=150, help_text="Username, 'cli', or 'supervisor'.")
    params = models.JSONField(default=dict)
    dry_run = models.BooleanField(default=False)
    offsets_before = models.JSONField(default=dict)
    offsets_after = models.JSONField(default=dict)
    result = models.CharField(max_length=10, choices=ActionResult.choices, default=ActionResult.RUNNING)
    message = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = ActionLogQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        # The action log's pages (every pipeline's entries newest first) and retention's "older than" read it.
        indexes = [models.Index(fields=["pipeline", "-created_at"], name="action_pipeline_idx"),
                   models.Index(fields=["-created_at"], name="action_created_idx"),
                   # Only deletions: deleted_pipeline_names reads these, not every entry without a pipeline.
                   models.Index(fields=["id"], name="action_deleted_pipeline_idx",
                                condition=models.Q(pipeline__isnull=True, action="delete"))]

    @property
    def cluster(self) -> str:
        """The Kafka cluster the entry is about: its pipeline's, else the one its parameters name (group resets
        and watches keep it there), else "" for actions that touch no cluster."""
        return self._pipeline_or_params("cluster")

    @property
    def pipeline_name(self) -> str:
        """The pipeline the entry is about, also after the pipeline was deleted (its name stays in params)."""
        return self._pipeline_or_params("name", "pipeline")

    def _pipeline_or_params(self, attribute: str, key: str = "") -> str:
        """The pipeline's `attribute` while it exists; else what the entry's parameters kept under `key`."""
        if self.pipeline_id:
            return getattr(self.pipeline, attribute)
        params = self.params if isinstance(self.params, dict) else {}
        return str(params.get(key or attribute) or "")

    @property
    def is_rewind(self) -> bool:
        # Rewinds are planned: monitoring must not treat the rewound range as an incident.
        return self.action in ("rewind", "reset_group")
