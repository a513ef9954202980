"""The Kafka reads of one reconciliation pass over many pipelines (or one check pass over many watches), made in
bulk per cluster.

Reconciling a pipeline alone reads its group's committed offsets and its topic's watermarks (a new consumer,
its bootstrap and three round trips): ~40 ms, most of an idle pipeline's cost, and seconds for a pass over
hundreds. A pass reads them for all the pipelines of a cluster at its start instead, on one consumer and one
admin client (consumers/kafka/admin.py: `committed_offsets_of_groups`, `watermarks_of_topics`), and hands each
pipeline a `PassKafka`: the `kafka` object `reconcile_pipeline` takes, answering those two calls from the bulk
read and every other call (records held, record timestamps) as the cluster's own calls do.

What this keeps true: Kafka is still read before each pipeline's database snapshot, only earlier (by at most
the pass's length). Lag measured against earlier marks is lag as of the pass's start. The one finding earlier
marks could make up is "position ahead of the log end", for a pipeline that consumed records produced after
the bulk read: `fresh()` gives the cluster's own calls, with which reconcile_pipeline reads that pipeline's
Kafka again before believing it. A bulk read that fails leaves its calls to the per-pipeline reads, which
report their own errors as before.

A watch pass (consumers/reconciliation/watch_pass.py) reads the same two for its watches, and their groups'
membership (`describe_groups`), through `for_watches`.
"""
import logging

from consumers.kafka import admin as kafka_admin

log = logging.getLogger("tally.reconcile")


class PassKafka:
    """The pass's Kafka calls for the pipelines (or watches) of one cluster."""

    def __init__(self, cluster: str, committed: dict | None, marks: dict | None, groups: dict | None = None):
        self._calls = kafka_admin.on(cluster)
        self._committed = committed   # {group: {topic: {partition: offset}}}, None: the bulk read failed
        self._marks = marks           # {topic: {partition: Watermarks}}, None: the bulk read failed
        self._groups = groups or {}   # {group: GroupDescription}, empty: not read in bulk

    def committed_offsets(self, group_id: str, topic: str, partitions: list[int] | None = None) -> dict:
        if self._committed is None:
            return self._calls.committed_offsets(group_id, topic, partitions)
        offsets = dict(self._committed.get(group_id, {}).get(topic, {}))
        return offsets if partitions is None else {p: offsets.get(p) for p in partitions}

    def describe_group(self, group_id: str):
        if group_id in self._groups:
            return self._groups[group_id]
        return self._calls.describe_group(group_id)

    def read_in_bulk(self, topic: str) -> bool:
        """Whether the bulk read holds the topic's watermarks and the committed offsets."""
        return self._committed is not None and self._marks is not None and topic in self._marks

    def watermarks(self, topic: str) -> dict:
        if self._marks is None:
            return self._calls.watermarks(topic)
        if topic not in self._marks:   # absent from the cluster at the pass's start: ask alone, for its own error
            return self._calls.watermarks(topic)
        return dict(self._marks[topic])

    def fresh(self):
        """The cluster's own calls, read now (for a pipeline whose positions passed the marks read earlier)."""
        return self._calls

    def __getattr__(self, name):
        return getattr(self._calls, name)


def for_pipelines(pipelines) -> dict[str, PassKafka]:
    """{cluster name: PassKafka} for the clusters of `pipelines`, each read once now."""
    by_cluster: dict[str, list] = {}
    for pipeline in pipelines:
        by_cluster.setdefault(pipeline.cluster, []).append(pipeline)
    return {cluster: PassKafka(cluster, *_bulk_reads(cluster, members)) for cluster, members in by_cluster.items()}


def for_watches(watches) -> dict[str, PassKafka]:
    """{cluster name: PassKafka} for the clusters of `watches`, each read once now; with their groups'
    membership (a watch's status tells a stopped group from a stalled one)."""
    by_cluster: dict[str, list] = {}
    for watch in watches:
        by_cluster.setdefault(watch.cluster, []).append(watch)
    return {cluster: PassKafka(cluster, *_bulk_reads(cluster, members), _descriptions(cluster, members))
            for cluster, members in by_cluster.items()}


def _descriptions(cluster: str, watches) -> dict:
    try:
        return kafka_admin.on(cluster).describe_groups(sorted({w.group_id for w in watches}))
    except Exception as exc:  # noqa: BLE001 - each watch's own read reports the cause
        log.info("watch pass: the groups of cluster %s in one read failed (%s: %s); describing them per watch",
                 cluster, type(exc).__name__, exc)
        return {}


def _bulk_reads(cluster: str, pipelines) -> tuple[dict | None, dict | None]:
    calls = kafka_admin.on(cluster)
    committed = marks = None
    try:
        committed = calls.committed_offsets_of_groups(sorted({p.group_id for p in pipelines}))
    except Exception as exc:  # noqa: BLE001 - each pipeline's own read reports the cause
        log.info("reconciliation: the committed offsets of cluster %s in one read failed (%s: %s); "
                 "reading them per pipeline", cluster, type(exc).__name__, exc)
    try:
        marks = calls.watermarks_of_topics(sorted({p.topic for p in pipelines}))
    except Exception as exc:  # noqa: BLE001 - each pipeline's own read reports the cause
        log.info("reconciliation: the watermarks of cluster %s in one read failed (%s: %s); "
                 "reading them per pipeline", cluster, type(exc).__name__, exc)
    return committed, marks
