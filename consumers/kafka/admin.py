"""Every Kafka admin call Tally makes: partitions, watermarks, group offsets, groups, resets.

One module so that broker quirks are handled once. The embedded broker (Tansu) answers ListOffsets
"latest" with the base offset of the last record batch + 1, which is too low for multi-record batches;
the high watermark carried by a Fetch reply is right on every broker, so `watermarks()` reads it from a
fetch. On real Kafka the two agree.
"""
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import KafkaConnectionError
from kafka.structs import OffsetAndMetadata

from consumers.kafka import clusters
from consumers.kafka.errors import KafkaAdminError, KafkaUnreachable  # noqa: F401 (their home; callers import them here)

log = logging.getLogger("tally.kafka")


def admin_client(cluster=None, **overrides) -> KafkaAdminClient:
    """An admin client for the cluster (a Cluster, a name, or None: the default), after a fast preflight."""
    return clusters.admin(clusters.preflight(cluster), **overrides)


def probe_consumer(cluster=None, **overrides) -> KafkaConsumer:
    """A group-less consumer for reads (watermarks, timestamps); never commits, never creates a topic."""
    config = {"enable_auto_commit": False, "group_id": None, "allow_auto_create_topics": False,
              "consumer_timeout_ms": 1000, "client_id": "tally-admin", **overrides}
    return clusters.consumer(clusters.preflight(cluster), **config)


@contextlib.contextmanager
def admin_session(cluster=None):
    """An admin client for one piece of work. A cluster that cannot be used fails at once (within seconds)
    with KafkaUnreachable naming the cluster, the step and the cause: the admin client's own bootstrap would
    retry for the whole request timeout (30 s) first, holding a web request or a CLI that long."""
    client = admin_client(cluster)
    try:
        yield client
    finally:
        client.close()


def shared_read(cluster, call):
    """`call(admin_client)` on the cluster's shared admin client (clusters.shared_admin), for read-only calls
    that run on every check. A reused client whose connection went stale (a broker restart) fails once: the
    call is tried once more on a new client, so only a second failure is reported. A broker's refusal (no
    ACL) is its answer, not a stale connection: it is raised at once, asked once."""
    try:
        with clusters.shared_admin(cluster) as client:
            return call(client)
    except KafkaUnreachable:  # a cluster that cannot be used (its preflight says why): no retry
        raise
    except Exception as exc:  # noqa: BLE001 - the retry below reports the real failure
        if clusters.broker_refused(exc):
            raise
        log.info("shared admin client of %s failed (%s); trying a new one", cluster or clusters.DEFAULT,
                 type(exc).__name__)
    with clusters.shared_admin(cluster) as client:
        return call(client)


def partitions_for(topic: str, cluster=None) -> list[int]:
    consumer = probe_consumer(cluster)
    try:
        partitions = consumer.partitions_for_topic(topic)
    finally:
        consumer.close()
    if not partitions:
        raise KafkaAdminError(f"Topic {topic!r} does not exist or has no partitions.")
    return sorted(partitions)


def topic_partitions_or_problem(topic: str, cluster=None) -> tuple[list[int] | None, str | None]:
    """The topic's partitions, or why they cannot be had, in words a person can act on: the one wording for
    every door that creates a pipeline or a watch."""
    on = "" if (cluster or clusters.DEFAULT) == clusters.DEFAULT else f" cluster {cluster!r}"
    try:
        return partitions_for(topic, cluster=cluster), None
    except KafkaUnreachable as exc:   # TLS, authentication, unreachable: not "the topic is missing"
        return None, f"cannot use Kafka to check topic {topic!r}: {exc}"
    except KafkaAdminError:
        return None, (f"topic {topic!r} does not exist in Kafka{on}: create it first (e.g. kafka-topics.sh "
                      f"--create --topic {topic}) or check the name")
    except Exception as exc:  # the broker is down: say so rather than claim the topic is missing
        return None, f"cannot reach Kafka{on} to check topic {topic!r}: {type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Watermarks:
    log_start: int
    high: int
    # The last stable offset (read_committed): a consumer cannot pass an open transaction, so lag and
    # "caught up" are measured against it. None when the broker's Fetch reply did not carry it.
    stable: int | None = None
    # The topic's id (KIP-516) in the metadata the marks were read with: a topic deleted and created again under
    # the same name has another, and its offsets start again. None when the broker gives none (before Kafka 2.8).
    topic_id: str | None = None

    @property
    def end(self) -> int:
        """Where a read_committed consumer's position ends up when it has read everything it can."""
        if self.stable is not None and self.log_start <= self.stable <= self.high:
            return self.stable
        return self.high


def topic_id_of(marks: dict[int, Watermarks]) -> str:
    """The topic id one topic's watermarks were read with; "" when the broker gave none."""
    return next((m.topic_id for m in marks.values() if m.topic_id), "")


def watermarks(topic: str, partitions: list[int] | None = None, timeout_s: float = 10.0,
               cluster=None) -> dict[int, Watermarks]:
    """Log start offset and high watermark per partition. The high watermark comes from a Fetch reply
    (see module docstring): seek to ListOffsets' "latest" and fetch once, which costs at most one record
    batch per partition."""
    consumer = _watermark_consumer(cluster)
    try:
        partitions = partitions if partitions is not None else sorted(consumer.partitions_for_topic(topic) or [])
        if not partitions:
            raise KafkaAdminError(f"Topic {topic!r} does not exist or has no partitions.")
        marks = _read_watermarks(consumer, [TopicPartition(topic, p) for p in partitions], timeout_s)
    finally:
        consumer.close()
    return {tp.partition: mark for tp, mark in marks.items()}


def watermarks_of_topics(topics: list[str], timeout_s: float = 10.0, cluster=None) -> dict[str, dict[int, Watermarks]]:
    """`watermarks()` of many topics at once, {topic: {partition: Watermarks}}, on one consumer: one metadata
    request, one ListOffsets each way and fetches of all their partitions together, instead of a consumer and
    their round trips per topic (a reconciliation pass over hundreds of pipelines). A topic the cluster does
    not have is absent from the result."""
    consumer = _watermark_consumer(cluster)
    try:
        known = consumer.topics()   # one metadata request for all topics; partitions_for_topic then reads its cache
        tps = [TopicPartition(topic, p) for topic in sorted(set(topics) & known)
               for p in sorted(consumer.partitions_for_topic(topic))]
        marks = _read_watermarks(consumer, tps, timeout_s) if tps else {}
    finally:
        consumer.close()
    result: dict[str, dict[int, Watermarks]] = {}
    for tp, mark in marks.items():
        result.setdefault(tp.topic, {})[tp.partition] = mark
    return result


def _watermark_consumer(cluster) -> KafkaConsumer:
    # fetch_max_wait_ms: an empty partition's fetch otherwise waits the default 500 ms for data to arrive
    return probe_consumer(cluster, max_partition_fetch_bytes=1 << 16, fetch_max_wait_ms=20,
                          isolation_level="read_committed")


def _read_watermarks(consumer: KafkaConsumer, tps: list, timeout_s: float) -> dict:
    stable = _record_last_stable_offsets(consumer)
    consumer.assign(tps)
    starts = consumer.beginning_offsets(tps)
    listed_ends = consumer.end_offsets(tps)
    for tp in tps:
        # Seeking one below the listed end makes the broker send a batch (and its high watermark)
        # even when the listed end is exact; on an empty partition the fetch still carries it.
        consumer.seek(tp, max(starts[tp], listed_ends[tp] - 1))
    high = _fetch_high_watermarks(consumer, tps, timeout_s)
    ids = _topic_ids(consumer, {tp.topic for tp in tps})
    return {tp: Watermarks(starts[tp], max(high[tp], listed_ends[tp]), stable.get(tp), ids.get(tp.topic))
            for tp in tps}


def _topic_ids(consumer: KafkaConsumer, topics: set[str]) -> dict[str, str]:
    """The topics' ids from the metadata the consumer read (Metadata v10+), {topic: id} of those it has one for."""
    topic_id = getattr(getattr(consumer, "_cluster", None), "topic_id", None)
    if topic_id is None:  # another kafka-python: no ids, so a re-created topic goes unnoticed, as before
        return {}
    found = {topic: topic_id(topic) for topic in topics}
    return {topic: str(found_id) for topic, found_id in found.items() if found_id is not None}


def _record_last_stable_offsets(consumer: KafkaConsumer) -> dict:
    """kafka-python keeps a Fetch reply's high watermark but drops its last stable offset: record it from
    the replies this (probe) consumer parses. Returns the dict it fills, {TopicPartition: offset}."""
    stable: dict = {}
    fetcher = getattr(consumer, "_fetcher", None)
    parse = getattr(fetcher, "_parse_fetched_data", None)
    if parse is None:  # another kafka-python: fall back to the high watermark
        return stable

    def parse_and_record(completed_fetch):
        offset = getattr(completed_fetch.partition_data, "last_stable_offset", None)
        if offset is not None and offset >= 0:
            stable[completed_fetch.topic_partition] = offset
        return parse(completed_fetch)

    fetcher._parse_fetched_data = parse_and_record
    return stable


def _fetch_high_watermarks(consumer: KafkaConsumer, tps, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        marks = {tp: consumer.highwater(tp) for tp in tps}
        if all(mark is not None for mark in marks.values()):
            return marks
        if time.monotonic() > deadline:
            missing = [f"{tp.topic}[{tp.partition}]" for tp, mark in marks.items() if mark is None]
            raise KafkaAdminError(f"No fetch reply with a high watermark for partitions {', '.join(missing)}")
        # Pause partitions that already answered so their records are not fetched again and again.
        consumer.pause(*[tp for tp, mark in marks.items() if mark is not None])
        # Short: an empty fetch reply does not end a poll early. A poll parses fetch replies only up to
        # max_records: one per partition still waiting, so the partitions of many topics answer in one poll.
        waiting = sum(1 for mark in marks.values() if mark is None)
        consumer.poll(timeout_ms=20, max_records=max(1, waiting))


def records_held(topic: str, partition: int, ranges: list[tuple[int, int]], timeout_s: float = 10.0,
                 cluster=None) -> list[list[int]]:
    """The offsets of the data records the topic holds in each [start, end) of `ranges`, as a read_committed
    consumer sees them: transaction markers, aborted and compacted records are holes, not records.
    Reconciliation asks this only for offsets the sink lacks, to tell a hole from a loss."""
    held: list[list[int]] = [[] for _ in ranges]
    if not ranges:
        return held
    consumer = probe_consumer(cluster, isolation_level="read_committed", max_partition_fetch_bytes=1 << 16,
                              fetch_max_wait_ms=20)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        for i, (start, end) in enumerate(ranges):
            consumer.seek(tp, start)
            deadline = time.monotonic() + timeout_s
            while consumer.position(tp) < end:
                high = consumer.highwater(tp)
                if high is not None and consumer.position(tp) >= high:
                    break  # nothing more in the log
                if time.monotonic() > deadline:
                    raise KafkaAdminError(f"{topic}[{partition}]: could not read offsets {start}..{end - 1}")
                for record in consumer.poll(timeout_ms=100, max_records=max(1, end - start)).get(tp, []):
                    if start <= record.offset < end:
                        held[i].append(record.offset)
    finally:
        consumer.close()
    return held


def high_watermarks(topic: str, partitions: list[int] | None = None, cluster=None) -> dict[int, int]:
    return {p: w.high for p, w in watermarks(topic, partitions, cluster=cluster).items()}


def committed_offsets(group_id: str, topic: str, partitions: list[int] | None = None,
                      cluster=None) -> dict[int, int | None]:
    """Kafka's committed offset of a group per partition (None where the group has committed nothing)."""
    result = shared_read(cluster, lambda admin: admin.list_group_offsets({group_id: None})).get(group_id, {})
    committed = {tp.partition: (meta.offset if meta.offset >= 0 else None)
                 for tp, meta in result.items() if tp.topic == topic}
    if partitions is not None:
        committed = {p: committed.get(p) for p in partitions}
    return committed


def committed_offsets_of_groups(group_ids: list[str], cluster=None) -> dict[str, dict[str, dict[int, int | None]]]:
    """`committed_offsets()` of many groups at once, {group: {topic: {partition: offset or None}}}: one
    OffsetFetch per coordinator (brokers with OffsetFetch v8) instead of one per group."""
    result = shared_read(cluster, lambda admin: admin.list_group_offsets({group: None for group in group_ids}))
    committed: dict[str, dict[str, dict[int, int | None]]] = {group: {} for group in group_ids}
    for group, offsets in result.items():
        for tp, meta in offsets.items():
            committed.setdefault(group, {}).setdefault(tp.topic, {})[tp.partition] = (
                meta.offset if meta.offset >= 0 else None)
    return committed


def group_committed_offsets(group_id: str, cluster=None) -> dict[str, dict[int, int]]:
    """Every committed offset of a group: {topic: {partition: offset}} (for groups Tally does not run)."""
    with admin_session(cluster) as admin:
        result = admin.list_group_offsets({group_id: None}).get(group_id, {})
    committed: dict[str, dict[int, int]] = {}
    for tp, meta in result.items():
        if meta.offset >= 0:
            committed.setdefault(tp.topic, {})[tp.partition] = meta.offset
    return committed


def commit_offsets(group_id: str, topic: str, offsets: dict[int, int], cluster=None) -> None:
    """Set a group's committed offsets (the group must have no active members). Setting offsets is
    idempotent, so a connection the broker dropped mid-request is tried once more on a new one."""
    wanted = {TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()}
    try:
        with admin_session(cluster) as admin:
            errors = admin.alter_group_offsets(group_id, wanted)
    except KafkaConnectionError as exc:
        log.warning("offset change for group %s: %s; trying once more", group_id, exc)
        with admin_session(cluster) as admin:
            errors = admin.alter_group_offsets(group_id, wanted)
    failed = {tp.partition: err.__name__ for tp, err in errors.items() if err.__name__ != "NoError"}
    if failed:
        raise KafkaAdminError(f"Kafka refused the offset change for group {group_id!r}: {failed}")


def offsets_for_time(topic: str, partitions: list[int], timestamp_ms: int, cluster=None) -> dict[int, int | None]:
    """Earliest offset whose timestamp is >= timestamp_ms, per partition (None: no such record)."""
    with admin_session(cluster) as admin:
        result = admin.list_partition_offsets({TopicPartition(topic, p): timestamp_ms for p in partitions})
    # Kafka answers -1 (kafka-python: None) when no record is that recent; a broker that answers an offset with
    # no record's timestamp (-1) means the same, so it is not taken as a position (offset 0 would rewind all).
    return {tp.partition: (ot.offset if ot is not None and ot.offset >= 0 and ot.timestamp >= 0 else None)
            for tp, ot in result.items()}


def record_timestamps(topic: str, offsets: dict[int, int], timeout_s: float = 5.0,
                      cluster=None, ended: set | None = None) -> dict[int, int | None]:
    """Timestamp (ms) of the first record at or after each partition's offset; None where there is no such record.
    Used for lag in seconds: the age of the record at the consumer's position. `ended`, when given, gets the
    partitions read to the log end without a record: only holes (transaction markers) lie between the offset and
    the end, so nothing is left to consume there."""
    found: set = set()
    stamps = record_timestamps_of_topics({(topic, p): o for p, o in offsets.items()}, timeout_s, cluster, found)
    if ended is not None:
        ended.update(p for _, p in found)
    return {p: stamps[(topic, p)] for p in offsets}


def record_timestamps_of_topics(offsets: dict[tuple[str, int], int], timeout_s: float = 5.0,
                                cluster=None, ended: set | None = None) -> dict[tuple[str, int], int | None]:
    """record_timestamps() of partitions of several topics, {(topic, partition): offset}, with one consumer;
    `ended` gets the (topic, partition) read to the log end without a record."""
    result: dict[tuple[str, int], int | None] = {key: None for key in offsets}
    if not offsets:
        return result
    # earliest: an offset retention removed since the caller's watermarks is read from the log start (its oldest
    # record gives the age), never jumped to the log end, where it would pass for a read that found only holes.
    consumer = probe_consumer(cluster, max_partition_fetch_bytes=1 << 16, auto_offset_reset="earliest")
    try:
        tps = {key: TopicPartition(*key) for key in offsets}
        consumer.assign(list(tps.values()))
        for key, tp in tps.items():
            consumer.seek(tp, offsets[key])
        deadline = time.monotonic() + timeout_s
        pending = set(offsets)
        while pending and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200, max_records=len(pending) * 4).items():
                key = (tp.topic, tp.partition)
                for record in records:
                    if key in pending and record.offset >= offsets[key]:
                        result[key] = record.timestamp
                        pending.discard(key)
                        consumer.pause(tp)
            # A partition whose high watermark is at the offset has no record there yet; one read past the offset
            # to its high watermark without a record holds only holes there (a transaction's marker).
            for key in list(pending):
                mark = consumer.highwater(tps[key])
                if mark is not None and mark <= offsets[key]:
                    pending.discard(key)
                elif mark is not None and consumer.position(tps[key]) >= mark:
                    pending.discard(key)
                    if ended is not None:
                        ended.add(key)
    finally:
        consumer.close()
    return result


def read_records(topic: str, offsets: dict[int, list[int]], timeout_s: float = 10.0,
                 cluster=None) -> dict[tuple[int, int], tuple]:
    """The records at the given offsets, {(partition, offset): (key, value, timestamp_ms, headers)}; an offset with
    no record (removed by retention or compaction, a transaction marker, past the end) is absent.
    Reads read_committed, as the engines do, so an aborted record is never returned."""
    found: dict[tuple[int, int], tuple] = {}
    wanted = {p: sorted(set(os_)) for p, os_ in offsets.items() if os_}
    if not wanted:
        return found
    consumer = probe_consumer(cluster, isolation_level="read_committed")
    try:
        tps = {p: TopicPartition(topic, p) for p in wanted}
        consumer.assign(list(tps.values()))
        for p, tp in tps.items():
            consumer.seek(tp, wanted[p][0])
        last = {p: os_[-1] for p, os_ in wanted.items()}
        deadline = time.monotonic() + timeout_s
        pending = set(wanted)
        while pending and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                for record in records:
                    if record.offset in wanted[tp.partition]:
                        found[(tp.partition, record.offset)] = (record.key, record.value, record.timestamp,
                                                                tuple(record.headers or ()))
                    if record.offset >= last[tp.partition]:
                        pending.discard(tp.partition)
                        consumer.pause(tp)
            for p in list(pending):
                # Past the last wanted offset (holes at the end) or at the log end: nothing more to find.
                position = consumer.position(tps[p])
                mark = consumer.highwater(tps[p])
                if position > last[p] or (mark is not None and position >= mark):
                    pending.discard(p)
    finally:
        consumer.close()
    return found


def cleanup_policy(topic: str, cluster=None) -> str:
    """The topic's cleanup.policy: "delete", "compact" or "compact,delete". A topic whose configs the broker
    lists without it has Kafka's default, "delete" (real Kafka lists every config; the embedded broker only
    those the topic was created with). Raises when the broker refuses (no DESCRIBE_CONFIGS ACL on the topic)."""
    described = shared_read(cluster, lambda admin: admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all"))
    entry = described.get("topic", {}).get(topic, {}).get("cleanup.policy")
    return (entry or {}).get("value") or "delete"


@dataclass
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str = ""
    members: list[dict] = field(default_factory=list)

    @property
    def has_active_members(self) -> bool:
        return bool(self.members) or self.state.lower() in ("stable", "preparingrebalance",
                                                            "completingrebalance")


def _admin_failure(what: str, exc: Exception) -> KafkaAdminError:
    """A clear message for an admin call the broker refused or failed (e.g. IncompatibleBrokerVersion:
    the broker does not implement the request)."""
    if isinstance(exc, KafkaUnreachable):
        return KafkaUnreachable(f"Kafka could not {what}: {exc}")
    reason = type(exc).__name__
    detail = str(exc) if str(exc) and str(exc) != reason else ""
    return KafkaAdminError(f"Kafka could not {what}: {reason}" + (f" ({detail})" if detail else ""))


def list_groups(cluster=None) -> list[str]:
    try:
        with admin_session(cluster) as admin:
            groups = admin.list_groups()
    except Exception as exc:  # any broker-side refusal becomes one clear error for the CLI and the API
        raise _admin_failure("list consumer groups", exc) from exc
    names = []
    for group in groups:
        if isinstance(group, dict):
            names.append(group.get("group_id") or group.get("group"))
        else:
            names.append(group[0])
    return sorted(n for n in names if n)


def describe_group(group_id: str, cluster=None) -> GroupDescription:
    """State and members of a group (see clusters._AdminClient for the embedded broker's quirk)."""
    return describe_groups([group_id], cluster=cluster)[group_id]


def describe_groups(group_ids, cluster=None) -> dict[str, GroupDescription]:
    """describe_group() of several groups in one call on the shared admin client (a pass over many watches)."""
    groups = list(dict.fromkeys(group_ids))
    if not groups:
        return {}
    described = shared_read(cluster, lambda admin: admin.describe_groups(groups, include_authorized_operations=False))
    if not isinstance(described, dict):   # older kafka-python: a list in the order asked
        described = dict(zip(groups, described, strict=False))
    return {g: _group_description(g, described.get(g)) for g in groups}


def _group_description(group_id: str, info) -> GroupDescription:
    if info is None:
        return GroupDescription(group_id, "Dead")
    info = info if isinstance(info, dict) else info._asdict()
    members = []
    for member in info.get("members") or []:
        member = member if isinstance(member, dict) else member._asdict()
        assignment = member.get("member_assignment") or {}
        if not isinstance(assignment, dict):
            assignment = getattr(assignment, "_asdict", lambda: {})()
        members.append({"member_id": member.get("member_id"), "client_id": member.get("client_id"),
                        "host": member.get("client_host"),
                        "assignment": _assignment_partitions(assignment)})
    return GroupDescription(group_id, str(info.get("group_state") or info.get("state") or "Unknown"),
                            str(info.get("protocol_type") or ""), members)


def _assignment_partitions(assignment: dict) -> dict[str, list[int]]:
    partitions = assignment.get("assignment") or assignment.get("assigned_partitions") or []
    result: dict[str, list[int]] = {}
    for item in partitions:
        if isinstance(item, TopicPartition):
            result.setdefault(item.topic, []).append(item.partition)
        elif isinstance(item, dict):
            result.setdefault(item.get("topic"), []).extend(item.get("partitions") or [])
        elif isinstance(item, list | tuple) and len(item) == 2:
            result.setdefault(item[0], []).extend(item[1])
    return result


def delete_groups(group_ids: list[str], cluster=None) -> dict[str, str]:
    """Delete consumer groups (their committed offsets and membership). Returns {group: "OK" or the error}.
    A group that does not exist counts as deleted."""
    if not group_ids:
        return {}
    try:
        with admin_session(cluster) as admin:
            result = admin.delete_groups(list(group_ids))
    except Exception as exc:  # the whole request failed: every group reports why, as documented
        message = str(_admin_failure("delete consumer groups", exc))
        return {group: message for group in group_ids}
    outcomes = {group: ("OK" if _outcome_name(outcome) in ("OK", "NoError")
                        or "GroupIdNotFound" in _outcome_name(outcome) else _outcome_name(outcome))
                for group, outcome in result.items()}
    return {group: outcomes.get(group, "no answer from Kafka") for group in group_ids}


def _outcome_name(outcome) -> str:
    """kafka-python reports a group's outcome as "OK", an error class or an error instance."""
    if isinstance(outcome, type):
        return outcome.__name__
    if isinstance(outcome, Exception):
        return f"{type(outcome).__name__}: {outcome}" if str(outcome) else type(outcome).__name__
    return str(outcome)


@dataclass(frozen=True)
class KafkaRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None


def read_record(topic: str, partition: int, offset: int, timeout_s: float = 5.0, cluster=None) -> KafkaRecord | None:
    """The committed record at exactly `offset`, or None: the offset holds no data record (a transaction
    marker, an aborted or compacted record) or is at or beyond the log end."""
    consumer = probe_consumer(cluster, isolation_level="read_committed", max_partition_fetch_bytes=1 << 20)
    tp = TopicPartition(topic, partition)
    try:
        consumer.assign([tp])
        consumer.seek(tp, offset)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=200, max_records=1).get(tp, []):
                if record.offset == offset:
                    return KafkaRecord(partition, offset, record.key, record.value, record.timestamp)
                if record.offset > offset:
                    return None  # a hole: the fetch skipped past it
            mark = consumer.highwater(tp)
            if mark is not None and mark <= offset:
                return None
            if mark is not None and consumer.position(tp) >= mark:
                return None  # read to the end without meeting it
    finally:
        consumer.close()
    return None


def find_records_by_key(topic: str, key: bytes, partitions: list[int], limit_per_partition: int,
                        timeout_s: float = 10.0, cluster=None) -> tuple[list[KafkaRecord], int]:
    """Records with this key among the last `limit_per_partition` of each partition (a bounded scan: Kafka
    has no key index). Returns (matches, records scanned)."""
    marks = watermarks(topic, partitions, cluster=cluster)
    consumer = probe_consumer(cluster, isolation_level="read_committed")
    matches, scanned = [], 0
    try:
        tps = [TopicPartition(topic, p) for p in partitions if marks[p].high > marks[p].log_start]
        ends = {tp.partition: marks[tp.partition].high for tp in tps}
        if not tps:
            return [], 0
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, max(marks[tp.partition].log_start, ends[tp.partition] - limit_per_partition))
        pending = {tp.partition for tp in tps}
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200, max_records=5000).items():
                for record in records:
                    scanned += 1
                    if record.key == key:
                        matches.append(KafkaRecord(tp.partition, record.offset, record.key, record.value,
                                                   record.timestamp))
            for tp in tps:
                if tp.partition in pending and consumer.position(tp) >= ends[tp.partition]:
                    pending.discard(tp.partition)
                    consumer.pause(tp)
    finally:
        consumer.close()
    return sorted(matches, key=lambda r: (r.partition, r.offset)), scanned


class ClusterAdmin:
    """This module's calls bound to one cluster: `on("prod").watermarks(topic)` is
    `watermarks(topic, cluster="prod")`. Code that takes a `kafka` object (reconciliation, groups, snapshots;
    tests hand them stand-ins) is given one of these."""

    CALLS = ("partitions_for", "watermarks", "watermarks_of_topics", "records_held", "high_watermarks",
             "committed_offsets", "committed_offsets_of_groups", "group_committed_offsets", "commit_offsets",
             "offsets_for_time", "record_timestamps", "record_timestamps_of_topics", "read_records",
             "list_groups", "describe_group", "describe_groups", "delete_groups", "read_record",
             "find_records_by_key", "cleanup_policy")

    def __init__(self, cluster=None):
        self.cluster = cluster

    def __getattr__(self, name):
        if name not in self.CALLS:
            raise AttributeError(name)
        call = globals()[name]
        bound = functools.partial(call, cluster=self.cluster)
        functools.update_wrapper(bound, call)
        return bound


def on(cluster=None) -> ClusterAdmin:
    return ClusterAdmin(cluster)
