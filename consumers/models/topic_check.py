"""Topic check jobs: a topic range checked against a sink table, key by key, with Spark."""
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

PROGRESS_MESSAGE_LENGTH = 200


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

    def claim(self, now: datetime) -> int:
        """A worker takes a queued check (once: a duplicated task finds it taken)."""
        return self.filter(status=TopicCheckStatus.QUEUED).update(
            status=TopicCheckStatus.RUNNING, progress=0.0, progress_message="starting", heartbeat_at=now)

    def heartbeat(self, now: datetime) -> int:
        """A running check's worker is still there. A check already declared failed stays failed."""
        return self.filter(status=TopicCheckStatus.RUNNING).update(heartbeat_at=now)

    def stale(self, now: datetime):
        """Running checks whose worker stopped answering: no heartbeat within the lease (SIGKILL, a lost machine:
        the task is not acknowledged late, so nobody would ever run or end it). Checks running from before
        heartbeats were written have none."""
        return self.filter(models.Q(heartbeat_at__lt=now - topic_check_lease()) | models.Q(heartbeat_at__isnull=True),
                           status=TopicCheckStatus.RUNNING)

    def fail_stale(self, now: datetime) -> int:
        """End the stale checks as failed, saying why, so that an operator sees it and requests another."""
        lease = settings.TALLY_TOPIC_CHECK_LEASE_SECONDS
        return self.stale(now).fail(
            now, f"its worker stopped answering: no heartbeat for {lease} s (killed or lost); request it again")

    def fail(self, now: datetime, error: str) -> int:
        """End these checks as failed with `error`. Their progress line says so too: the last one a check
        reported ("starting", "reading partition 1") would read as if it were still under way."""
        line = f"failed: {error}"
        if len(line) > PROGRESS_MESSAGE_LENGTH:
            line = line[:PROGRESS_MESSAGE_LENGTH - 1] + "…"
        return self.update(status=TopicCheckStatus.FAILED, finished_at=now, error=error, progress_message=line)

    def lost(self, now: datetime):
        """Queued checks older than a worker needs to take their task, even one redelivered after a dead worker
        had reserved it (`topic_check_patience`). Only lost if their queue is empty too: the caller asks the broker
        (consumers/reconciliation/topic_check.py `fail_lost_checks`)."""
        return self.filter(status=TopicCheckStatus.QUEUED, created_at__lt=now - topic_check_patience())

    def fail_lost(self, now: datetime) -> int:
        waited = int(topic_check_patience().total_seconds())
        return self.lost(now).fail(
            now, f"no worker took it within {waited} s and its task is no longer queued (a worker died as it took "
                 "it, or the task broker lost it); request it again")


def topic_check_lease() -> timedelta:
    """How long a running check stays running after its last heartbeat."""
    return timedelta(seconds=settings.TALLY_TOPIC_CHECK_LEASE_SECONDS)


def topic_check_patience() -> timedelta:
    """How long a queued check's task may be out of the queue without a worker claiming it: a task a worker reserved
    and died with comes back after the broker's redelivery timeout, and is then taken; a lease more covers a worker
    that takes it late (a JVM starting, a full GC)."""
    return timedelta(seconds=settings.TALLY_TASK_REDELIVERY_SECONDS + settings.TALLY_TOPIC_CHECK_LEASE_SECONDS)


class TopicCheckJob(models.Model):
    # No index of its own: topic_check_pipeline_idx leads with it (the page's lookups, and a pipeline's delete).
    pipeline = models.ForeignKey("consumers.Pipeline", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="topic_checks", db_index=False)
    topic = models.CharField(max_length=249)
    group_id = models.CharField(max_length=255)
    table = models.CharField(max_length=63)
    key_column = models.CharField(max_length=63)
    value_parser = models.CharField(max_length=100, default="int_value")
    status = models.CharField(max_length=10, choices=TopicCheckStatus.choices, default=TopicCheckStatus.QUEUED)
    progress = models.FloatField(default=0.0, help_text="0..1")
    progress_message = models.CharField(max_length=PROGRESS_MESSAGE_LENGTH, blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    requested_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)  # written while it runs (TopicCheckJobQuerySet.stale)

    objects = TopicCheckJobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        # The topic checks page lists the newest checks of every pipeline, or of one: from the top of an index.
        indexes = [models.Index(fields=["-created_at"], name="topic_check_created_idx"),
                   models.Index(fields=["pipeline", "-created_at"], name="topic_check_pipeline_idx")]
