"""/metrics for Prometheus: lag (records, seconds), throughput, lost / duplicated / phantom, status, per
pipeline and partition — read from reconciliation's tables on each scrape by a custom collector, so the
numbers are the dashboard's numbers and no process has to keep them in memory.

Scrapes authenticate like the API: a logged-in session, or `Authorization: Token <key>` (Prometheus:
`authorization: {type: Token, credentials: <key>}`).
"""
from django.db.models import Count
from django.http import HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from rest_framework.exceptions import AuthenticationFailed

from consumers.access import can_view, record_refusal
from consumers.models import UNKNOWN, ConsumerRun, DeadLetter, PartitionHealth, Pipeline, Status
from consumers.reconciliation import monitored
from dashboard import status as dashboard_status
from dashboard.tokens import TokenAuthentication

STATUSES = [s.value for s in Status] + [UNKNOWN]
PIPELINE_LABELS = ["pipeline", "topic", "delivery_mode", "cluster"]


class TallyCollector:
    """Reads the latest reconciliation in a few queries (pipelines, partitions, groups, watches) per scrape."""

    def collect(self):
        yield from self._pipelines()
        yield from self._consumers()
        yield from self._partitions()
        yield from self._groups()
        yield from self._watches()

    def _pipelines(self):
        gauges = FieldGauges({
            "lag_records": ("tally_pipeline_lag_records", "Records behind the high watermark"),
            "lag_seconds": ("tally_pipeline_lag_seconds", "Age of the record at the position"),
            "records_per_second": ("tally_pipeline_throughput_records_per_second", "Records written per second"),
            "lost": ("tally_pipeline_lost_records", "Records consumed but not in the sink"),
            "duplicated": ("tally_pipeline_duplicated_records", "Records in the sink more than once"),
            "phantom": ("tally_pipeline_phantom_records", "Sink rows beyond the committed position"),
            "dead_lettered": ("tally_pipeline_dead_lettered_records", "Records dead-lettered"),
        }, PIPELINE_LABELS)
        status = StatusGauge("tally_pipeline_status", "1 for the pipeline's current status (OK, WARN, ERR, STALL, "
                             "STOP, REWIND, UNKNOWN), 0 for the others", PIPELINE_LABELS, every_state=True)
        checked = GaugeMetricFamily("tally_pipeline_last_reconciliation_timestamp_seconds",
                                    "When reconciliation last checked the pipeline", labels=PIPELINE_LABELS)
        for row in dashboard_status.pipeline_rows():
            labels = [row.name, row.pipeline.topic, row.pipeline.delivery_mode, row.pipeline.cluster]
            gauges.add(labels, row)
            status.set(labels, row.status)
            if row.checked_at:
                checked.add_metric(labels, row.checked_at.timestamp())
        yield from gauges.families()
        yield status
        yield checked

    def _consumers(self):
        """Is a consumer serving the pipeline, and how many dead letters wait for replay or discard: two grouped
        queries, so Alertmanager can page on "should run but is down" and on a dead-letter backlog."""
        now = timezone.now()
        alive = set(ConsumerRun.objects.serving(now).values_list("pipeline_id", flat=True).distinct())
        pending = dict(DeadLetter.objects.filter(discarded_at__isnull=True).values("pipeline_id")
                       .annotate(n=Count("pk")).values_list("pipeline_id", "n"))
        up = GaugeMetricFamily("tally_pipeline_consumer_up", "1 when a live consumer run (heartbeat within the "
                               "lease) serves the pipeline, else 0", labels=[*PIPELINE_LABELS, "desired_state"])
        letters = GaugeMetricFamily("tally_pipeline_dead_letters_pending",
                                    "Dead letters neither replayed nor discarded", labels=PIPELINE_LABELS)
        for pipeline in Pipeline.objects.order_by("name"):
            labels = [pipeline.name, pipeline.topic, pipeline.delivery_mode, pipeline.cluster]
            up.add_metric([*labels, pipeline.desired_state], 1.0 if pipeline.pk in alive else 0.0)
            letters.add_metric(labels, float(pending.get(pipeline.pk, 0)))
        yield up
        yield letters

    def _partitions(self):
        labels = ["pipeline", "topic", "partition", "cluster"]
        fields = {
            "lag_records": ("tally_partition_lag_records", "Records behind the high watermark"),
            "lag_seconds": ("tally_partition_lag_seconds", "Age of the record at the position"),
            "high_watermark": ("tally_partition_high_watermark", "Kafka's high watermark"),
            "log_start": ("tally_partition_log_start_offset", "Kafka's log start offset"),
            "next_offset": ("tally_partition_db_offset", "The database's next offset (Tally's position)"),
            "kafka_committed": ("tally_partition_kafka_committed_offset", "The group's committed offset in Kafka"),
            "lost": ("tally_partition_lost_records", "Records consumed but not in the sink"),
            "duplicated": ("tally_partition_duplicated_records", "Records in the sink more than once"),
            "phantom": ("tally_partition_phantom_records", "Sink rows beyond the committed position"),
        }
        gauges = FieldGauges(fields, labels)
        status = StatusGauge("tally_partition_status", "1, labelled with the partition's current status", labels,
                             every_state=False)
        rows = PartitionHealth.objects.select_related("pipeline").order_by("pipeline__name", "partition")
        for health in rows:
            values = [health.pipeline.name, health.pipeline.topic, str(health.partition), health.pipeline.cluster]
            gauges.add(values, health)
            status.set(values, health.status)
        yield from gauges.families()
        yield status

    def _groups(self):
        lag = GaugeMetricFamily("tally_group_lag_records", "Lag of consumer groups Tally does not run",
                                labels=["group", "cluster"])
        seconds = GaugeMetricFamily("tally_group_lag_seconds", "Lag in seconds of consumer groups Tally does not run",
                                    labels=["group", "cluster"])
        for group in dashboard_status.external_group_rows():
            if group.lag_records is not None:
                lag.add_metric([group.group_id, group.cluster], float(group.lag_records))
            if group.lag_seconds is not None:
                seconds.add_metric([group.group_id, group.cluster], float(group.lag_seconds))
        yield lag
        yield seconds

    def _watches(self):
        """Watches (groups Tally does not run, audited against their tables): the same numbers as a pipeline's,
        under tally_watch_*, per watch and per partition."""
        labels = ["watch", "group", "topic"]
        fields = {
            "lag_records": ("tally_watch_lag_records", "Records behind the log end (the group's committed offset)"),
            "lag_seconds": ("tally_watch_lag_seconds", "Age of the record at the group's committed offset"),
            "lost": ("tally_watch_lost_records", "Committed records with no row in the group's table"),
            "duplicated": ("tally_watch_duplicated_records", "Extra rows: rows beyond the one a record expects"),
            "phantom": ("tally_watch_phantom_records", "Rows that match no record"),
        }
        gauges = FieldGauges(fields, labels)
        status = StatusGauge("tally_watch_status", "1 for the watch's current status, 0 for the others", labels,
                             every_state=True)
        partition_lag = GaugeMetricFamily("tally_watch_partition_lag_records", "Records behind, per partition",
                                          labels=[*labels, "partition"])
        partition_status = StatusGauge("tally_watch_partition_status", "1, labelled with the status",
                                       [*labels, "partition"], every_state=False)
        for watch in monitored.watches():
            values = [watch.name, watch.group_id, watch.topic]
            gauges.add(values, watch)
            status.set(values, watch.status)
            for part in watch.partitions:
                if part.lag_records is not None:
                    partition_lag.add_metric([*values, str(part.partition)], float(part.lag_records))
                partition_status.set([*values, str(part.partition)], part.status)
        yield from gauges.families()
        yield from (status, partition_lag, partition_status)


class FieldGauges:
    """One gauge per attribute of a row ({attribute: (metric name, help)}); a row's None is no sample."""

    def __init__(self, fields: dict[str, tuple[str, str]], labels: list[str]):
        self._gauges = {field: GaugeMetricFamily(name, doc, labels=labels) for field, (name, doc) in fields.items()}

    def add(self, values: list[str], row) -> None:
        for field, gauge in self._gauges.items():
            value = getattr(row, field)
            if value is not None:
                gauge.add_metric(values, float(value))

    def families(self):
        return self._gauges.values()


class StatusGauge(GaugeMetricFamily):
    """A status as a gauge labelled `status`. With every_state, a series per state: 1 for the current one, 0 for
    the others, so an alert can compare them. Without it, the current state's series alone (1): a per-partition
    gauge for hundreds of partitions would otherwise multiply the scrape by the number of states."""

    def __init__(self, name: str, doc: str, labels: list[str], *, every_state: bool):
        super().__init__(name, doc, labels=[*labels, "status"])
        self._every_state = every_state

    def set(self, values: list[str], current: str) -> None:
        for state in STATUSES if self._every_state else [current]:
            self.add_metric([*values, state], 1.0 if state == current else 0.0)


def render_metrics() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TallyCollector())
    return generate_latest(registry)


def _user(request):
    """Who asks, by session or token; None when neither signs anyone in."""
    if request.user.is_authenticated:
        return request.user
    try:
        found = TokenAuthentication().authenticate(request)
    except AuthenticationFailed:
        return None
    return found[0] if found else None


def metrics_view(request):
    if request.method not in ("GET", "HEAD"):   # HEAD: a probe that a scrape would be answered
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
    user = _user(request)
    if user is None:
        return HttpResponse("Authentication required: log in, or send 'Authorization: Token <key>'.\n",
                            status=401, content_type="text/plain", headers={"WWW-Authenticate": "Token"})
    if not can_view(user):
        record_refusal(user, "view", "no role: /metrics is for viewers and operators", params={"path": request.path})
        return HttpResponse("Your account has no role: ask an administrator for the viewers or operators role.\n",
                            status=403, content_type="text/plain")
    return HttpResponse(render_metrics(), content_type=CONTENT_TYPE_LATEST)



