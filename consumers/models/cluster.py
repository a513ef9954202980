"""What Tally last saw of each Kafka cluster: the Clusters page's "reachable or not, and the last error".

A cluster's settings are not here (they live in the environment and the clusters file, with their secrets);
only what a check found, written by consumers/operations/cluster_status.py. Messages never hold a secret.
"""
from django.db import models
from django.utils import timezone

from consumers.pg_text import error_text


class ClusterStatusQuerySet(models.QuerySet):
    def record(self, name: str, *, reachable: bool, error: str = "", brokers=(), topics=None) -> "ClusterStatus":
        """A check's outcome; a failure is also kept as the last error."""
        now = timezone.now()
        values = {"checked_at": now, "reachable": reachable, "error": error_text(error), "brokers": list(brokers),
                  "topics": topics}
        if not reachable:
            values.update(last_error=error_text(error), last_error_at=now)
        status, _ = self.update_or_create(name=name[:64], defaults=values)
        return status

    def record_failure(self, name: str, error: str) -> None:
        """A failure seen outside a check (a run that could not connect): the last error, nothing else."""
        now = timezone.now()
        self.update_or_create(name=name[:64], defaults={"last_error": error_text(error), "last_error_at": now})


class ClusterStatus(models.Model):
    name = models.CharField(max_length=64, unique=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    reachable = models.BooleanField(default=False)
    error = models.TextField(blank=True, default="")       # the last check's failure, "" when it passed
    brokers = models.JSONField(default=list)
    topics = models.IntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")  # the last failure seen, kept after a passing check
    last_error_at = models.DateTimeField(null=True, blank=True)

    objects = ClusterStatusQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} ({'reachable' if self.reachable else 'unreachable'})"
