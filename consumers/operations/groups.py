"""Consumer groups that Tally does not run: list them and describe state, members and lag per partition.

The read side only (group offset resets are operator actions, in consumers/operations/group_reset.py). Everything comes
from Kafka through consumers/kafka/admin.py: the group's committed offsets, the high watermark from a
fetch (the embedded broker's ListOffsets is too low for multi-record batches), and the timestamp of the
record at the committed offset for lag in seconds.
"""
import time
from dataclasses import dataclass, field

from consumers.kafka import admin as kafka_admin
from consumers.kafka import clusters
from consumers.kafka.errors import ClusterConfigError, KafkaUnreachable
from consumers.models import Pipeline

# What each Kafka call of `describe` reads, as a person says it: a page names what it could not show.
WHAT_IS_READ = {"describe_group": "the group's state and members", "group_committed_offsets": "its committed offsets",
                "watermarks": "the log ends of its topics", "record_timestamps": "its lag in time"}


@dataclass
class GroupPartition:
    topic: str
    partition: int
    committed: int | None
    log_start: int | None
    high_watermark: int | None
    lag_records: int | None
    lag_seconds: float | None = None

    def as_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class GroupReport(kafka_admin.GroupDescription):
    """Kafka's description of a group, with its positions and lag per partition and what Tally knows of it."""
    partitions: list[GroupPartition] = field(default_factory=list)
    pipeline: str | None = None      # the Tally pipeline using this group id, if any
    errors: list[str] = field(default_factory=list)   # "CALL: EXCEPTION: MESSAGE" per failed Kafka call
    cluster: str = "default"         # the Kafka cluster the group is on
    failures: list[tuple[str, Exception]] = field(default_factory=list, repr=False)  # (call, error) of `errors`

    @property
    def problem(self) -> str:
        """The failed calls in a sentence a person reads, without call or exception names (kept in `errors`):
        what could not be read, and why in the cluster's own words. "" when every call answered."""
        if not self.failures:
            return ""
        unread = list(dict.fromkeys(WHAT_IS_READ.get(call, call) for call, _ in self.failures))
        reasons = list(dict.fromkeys(_reason(exc, self.cluster) for _, exc in self.failures))
        listed = unread[0] if len(unread) == 1 else f"{', '.join(unread[:-1])} and {unread[-1]}"
        return f"Tally could not read {listed} from Kafka: {'; '.join(reasons)}".rstrip(".") + "."

    @property
    def known(self) -> bool:
        """Kafka has members or committed offsets for it, or a pipeline uses it (Kafka describes any id,
        unknown ones included, as a group without members: Empty or Dead)."""
        return bool(self.has_active_members or self.partitions or self.pipeline)

    @property
    def unknown(self) -> bool:
        """Kafka answered and has no such group: no door shows it or acts on it (a reset would create it)."""
        return not self.known and not self.errors

    @property
    def lag_records(self) -> int | None:
        lags = [p.lag_records for p in self.partitions if p.lag_records is not None]
        return sum(lags) if lags else None

    @property
    def lag_seconds(self) -> float | None:
        ages = [p.lag_seconds for p in self.partitions if p.lag_seconds is not None]
        return max(ages) if ages else None

    def as_json(self) -> dict:
        return {"group_id": self.group_id, "cluster": self.cluster, "state": self.state,
                "protocol_type": self.protocol_type,
                "members": self.members, "pipeline": self.pipeline, "lag_records": self.lag_records,
                "lag_seconds": self.lag_seconds, "errors": self.errors,
                "partitions": [p.as_json() for p in self.partitions]}


def unknown_group_message(group_id: str, cluster: str | None = None) -> str:
    return (f"Kafka cluster {cluster or clusters.DEFAULT!r} has no consumer group {group_id!r}: "
            "no members and no committed offsets.")


def kafka_knows(group_id: str, *, cluster=None) -> bool:
    """The rule of GroupReport.known, on Kafka alone: the group has members or committed offsets. Kafka errors
    are raised, never read as "unknown"."""
    return bool(kafka_admin.describe_group(group_id, cluster=cluster).has_active_members
                or kafka_admin.group_committed_offsets(group_id, cluster=cluster))


def list_groups(*, include_pipelines: bool = False, kafka=None, cluster=None) -> list[str]:
    """Group ids known to a cluster's Kafka (the embedded broker lists only groups that committed offsets),
    without Tally's own pipelines' groups on that cluster unless asked. `kafka`: a stand-in in tests."""
    cluster = cluster or clusters.DEFAULT
    groups = (kafka or kafka_admin.on(cluster)).list_groups()
    if include_pipelines:
        return groups
    own = set(Pipeline.objects.filter(cluster=cluster).values_list("group_id", flat=True))
    return [g for g in groups if g not in own]


def groups_of_every_cluster(include_pipelines: bool = True) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """(cluster, group id) of every configured cluster's groups, and {cluster: error} for those that did not
    answer: one cluster down does not hide the others' groups."""
    found, errors = [], {}
    try:
        names = clusters.names()
    except ClusterConfigError as exc:
        names, errors["*"] = [clusters.DEFAULT], str(exc)
    for cluster in names:
        try:
            found += [(cluster, group) for group in list_groups(include_pipelines=include_pipelines, cluster=cluster)]
        except Exception as exc:  # this cluster down or refusing: say so, go on with the others
            errors[cluster] = str(exc) if isinstance(exc, kafka_admin.KafkaAdminError) else (
                f"Kafka cluster {cluster!r} did not answer: {type(exc).__name__}: {exc}")
    return found, errors


def describe(group_id: str, *, kafka=None, cluster=None, now_ms: float | None = None) -> GroupReport:
    """State, members, and per partition: committed offset, log start, high watermark, lag in records
    and in seconds. A failing Kafka call is reported in `errors`, the rest is still filled in."""
    cluster = cluster or clusters.DEFAULT
    kafka = kafka or kafka_admin.on(cluster)
    failures: list[tuple[str, Exception]] = []
    description = _call(failures, kafka.describe_group, None, group_id)
    report = GroupReport(group_id, description.state if description else "Unknown",
                         description.protocol_type if description else "",
                         description.members if description else [], cluster=cluster, failures=failures)
    report.pipeline = (Pipeline.objects.filter(group_id=group_id, cluster=cluster)
                       .values_list("name", flat=True).first())
    committed = _call(failures, kafka.group_committed_offsets, {}, group_id)
    now_ms = now_ms if now_ms is not None else time.time() * 1000
    for topic in sorted(committed):
        offsets = committed[topic]
        marks = _call(failures, kafka.watermarks, {}, topic)
        behind = {}
        for p in sorted(set(offsets) | set(marks)):
            mark, position = marks.get(p), offsets.get(p)
            # To the last stable offset, as reconciliation and watches measure: an open transaction is not lag.
            lag = max(0, mark.end - position) if mark is not None and position is not None else None
            part = GroupPartition(topic, p, position, mark.log_start if mark else None,
                                  mark.high if mark else None, lag, 0.0 if lag == 0 else None)
            report.partitions.append(part)
            if lag:
                behind[p] = max(position, mark.log_start)
        if behind:
            stamps = _call(failures, kafka.record_timestamps, {}, topic, behind)
            for part in report.partitions:
                if part.topic == topic and stamps.get(part.partition) is not None:
                    part.lag_seconds = max(0.0, (now_ms - stamps[part.partition]) / 1000)
    report.errors = [f"{call}: {type(exc).__name__}: {exc}" for call, exc in failures]
    return report


def _call(failures: list[tuple[str, Exception]], func, default, *args):
    try:
        return func(*args)
    except Exception as exc:  # Kafka half-down: report what could be read
        failures.append((func.__name__, exc))
        return default


def _reason(exc: Exception, cluster: str) -> str:
    """Why a call failed: a cluster that cannot be used names itself and its cause; anything else is said to
    come from the cluster."""
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, KafkaUnreachable) else f"Kafka cluster {cluster!r}: {text}"
