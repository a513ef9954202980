"""Topic check jobs: a topic range checked against a sink table, key by key, with Spark."""
from django.db import models
from django.utils import timezone


class TopicCheckStatus(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    DONE = "done", "done"
    FAILED = "failed", "failed"


class TopicCheckJobQuerySet(models.QuerySet):
    def of_pipelines(self):
        """Checks of a pipeline's own sink table: the only ones anybody is shown. (Checks once took any
        table; the results of those may hold other tables' keys.)"""
        return self.filter(pipeline__isnull=False, table=models.F("pipeline__sink_table"))


class TopicCheckJob(models.Model):
    pipeline = models.ForeignKey("consumers.Pipeline", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="topic_checks")
    topic = models.CharField(max_length=249)
    group_id = models.CharField(max_length=255)
    table = models.CharField(max_length=63)
    key_column = models.CharField(max_length=63)
    value_parser = models.CharField(max_length=100, default="int_value")
    status = models.CharField(max_length=10, choices=TopicCheckStatus.choices, default=TopicCheckStatus.QUEUED)
    progress = models.FloatField(default=0.0, help_text="0..1")
    progress_message = models.CharField(max_length=200, blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    requested_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = TopicCheckJobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
