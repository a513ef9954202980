"""A group whose offsets are reset behind what the watch already settled: the re-read records are audited
again, so what the consumer writes a second time is found. A topic deleted and created again under the same name
is not such a reset: it is reported, and none of its records is mixed into the old topic's audit."""
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from psycopg2 import sql

from consumers.kafka import admin
from consumers.kafka import ranges as kafka_ranges
from consumers.kafka.admin import Watermarks
from consumers.models import WatchFinding, WatchRange
from consumers.operations import watch_setup
from consumers.reconciliation import watch_audit, watch_commits, watch_pass
from tests.watch_helpers import as_offsets, drop_tables, produce, stored_findings

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def table_name():
    name = f"team_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(name)).as_string(cur.cursor))
    yield name
    drop_tables(name)


def write(table: str, ids) -> None:
    with connection.cursor() as cur:
        for value in ids:
            cur.execute(sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(sql.Identifier(table)).as_string(cur.cursor),
                        [value])


def watch_of_ten(make_topic, table: str, name: str, *, rows, committed: int, settle_seconds: int = 0):
    """A topic of the values 1..10, the team's table holding `rows`, its group (named after the watch) committed
    at `committed`, and a watch of them auditing by value: (watch, topic, group)."""
    topic, group = make_topic(name), f"{name}-{uuid.uuid4().hex[:6]}"
    produce(topic, [(None, str(v).encode()) for v in range(1, 11)])
    write(table, rows)
    admin.commit_offsets(group, topic, {0: committed})
    watch, _ = watch_setup.create(watch_setup.WatchSpec(name=name, group=group, topic=topic, sink_table=table,
                                                        record_id="value", row_id="id",
                                                        settle_seconds=settle_seconds))
    return watch, topic, group


def test_a_reset_behind_a_commit_not_yet_settled_is_audited_from_the_reset_commit(make_topic, table_name):
    """The group commits 10, then is reset to 6 before that commit settled (the settled mark is at 4): the range
    up to 10 is audited once the consumer has committed past it again, not as soon as the old commit of 10 is
    settle-seconds old, when the consumer has not read those records a second time yet."""
    watch, topic, group = watch_of_ten(make_topic, table_name, "unsettled", rows=range(1, 11), committed=4,
                                       settle_seconds=30)
    now = timezone.now()
    watch_audit.check_watch(watch, now=now)
    assert watch_audit.check_watch(watch, now=now + timedelta(seconds=30)).partitions[0]["settled_offset"] == 4
    admin.commit_offsets(group, topic, {0: 10})
    watch_audit.check_watch(watch, now=now + timedelta(seconds=40))   # commit 10 seen, not settled
    admin.commit_offsets(group, topic, {0: 6})                         # the team resets the group to offset 6
    reset = watch_audit.check_watch(watch, now=now + timedelta(seconds=70))
    assert reset.status == "REWIND" and reset.partitions[0]["settled_offset"] == 4

    write(table_name, range(7, 11))   # it reads offsets 6..9 again and writes their rows a second time
    admin.commit_offsets(group, topic, {0: 10})
    watch_audit.check_watch(watch, now=now + timedelta(seconds=100))
    after = watch_audit.check_watch(watch, now=now + timedelta(seconds=130))
    assert (after.checked, after.lost, after.duplicated) == (10, 0, 4)
    assert as_offsets(after.duplicated_offsets) == {(0, o) for o in range(6, 10)}


def test_a_reset_behind_the_audit_reopens_the_ranges_and_finds_the_rewritten_records(make_topic, table_name):
    # The record with value 3 (offset 2) was lost.
    watch, topic, group = watch_of_ten(make_topic, table_name, "reset", rows=[v for v in range(1, 11) if v != 3],
                                       committed=10)
    now = timezone.now()
    first = watch_audit.check_watch(watch, now=now)
    assert (first.checked, first.lost, first.duplicated) == (10, 1, 0)

    admin.commit_offsets(group, topic, {0: 5})   # the team resets the group to offset 5
    reset = watch_audit.check_watch(watch, now=now + timedelta(seconds=30))
    assert reset.status == "ERR" and reset.partitions[0]["settled_offset"] == 5
    assert (reset.checked, reset.lost, as_offsets(reset.lost_offsets)) == (5, 1, {(0, 2)})

    write(table_name, range(6, 11))   # it reads offsets 5..9 again and writes their rows a second time
    admin.commit_offsets(group, topic, {0: 10})
    after = watch_audit.check_watch(watch, now=now + timedelta(seconds=60))
    assert (after.checked, after.lost, after.duplicated) == (10, 1, 5)
    assert as_offsets(after.duplicated_offsets) == {(0, o) for o in range(5, 10)}
    assert stored_findings(watch, "kind") == [(0, 2, "lost")] + [(0, o, "duplicated") for o in range(5, 10)]
    # Stored as runs: the five duplicates of the re-audit are one row.
    assert sorted(WatchFinding.objects.filter(watch=watch).values_list("offset", "run_length", "kind")) == \
        [(2, 1, "lost"), (5, 5, "duplicated")]
    assert sum(r.records for r in WatchRange.objects.filter(watch=watch)) == 10


def test_a_group_deleted_and_read_again_from_the_start_is_a_reset_too(make_topic, table_name):
    """The group's offsets vanish between two checks (the team deleted the group, or Kafka expired its offsets),
    then it reads from the start again: its next commit is behind the last one seen, so the records it writes a
    second time are found."""
    watch, topic, group = watch_of_ten(make_topic, table_name, "regone", rows=range(1, 11), committed=10)
    now = timezone.now()
    assert watch_audit.check_watch(watch, now=now).clean
    assert admin.delete_groups([group]) == {group: "OK"}
    gone = watch_audit.check_watch(watch, now=now + timedelta(seconds=30))
    assert gone.partitions[0]["committed"] is None

    write(table_name, range(1, 6))   # it reads from the start again, writes 1..5 a second time, commits 5
    admin.commit_offsets(group, topic, {0: 5})
    reset = watch_audit.check_watch(watch, now=now + timedelta(seconds=60))
    assert reset.partitions[0]["settled_offset"] == 5
    assert (reset.checked, reset.duplicated, as_offsets(reset.duplicated_offsets)) == (5, 5, {(0, o) for o in range(5)})

    write(table_name, range(6, 11))
    admin.commit_offsets(group, topic, {0: 10})
    after = watch_audit.check_watch(watch, now=now + timedelta(seconds=90))
    assert (after.checked, after.lost, after.duplicated) == (10, 0, 10)


class RetainedFrom:
    """The watch's Kafka calls, with the log start moved to `log_start` (retention, DeleteRecords: the embedded
    broker implements neither)."""

    def __init__(self, log_start: int):
        self.real, self.log_start = admin.on(), log_start

    def watermarks(self, topic, *args, **kwargs):
        return {p: Watermarks(max(m.log_start, self.log_start), m.high, m.stable)
                for p, m in self.real.watermarks(topic, *args, **kwargs).items()}

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_records_deleted_before_the_group_read_them_are_its_loss_not_the_audits(make_topic, table_name):
    """The group committed 2 (its rows 1..2 written), then retention moved the log start to 6 before it read on:
    offsets 2..5 never reached the table. That is ERR while the group sits behind the log start, and the range
    says the group never read them; offsets 0..1, which it read, are the ones the audit could not judge."""
    watch, topic, group = watch_of_ten(make_topic, table_name, "retained", rows=[1, 2], committed=2)
    now = timezone.now()
    behind = watch_audit.check_watch(watch, now=now, kafka=RetainedFrom(6))
    assert behind.status == "ERR" and behind.partitions[0]["settled_offset"] == 6
    assert [(r.start, r.end, r.note) for r in WatchRange.objects.filter(watch=watch).order_by("start")] == [
        (0, 2, watch_commits.RETENTION_NOTE), (2, 6, watch_commits.DELETED_UNREAD_NOTE)]

    write(table_name, range(7, 11))   # the consumer jumps to the log start and delivers 6..9
    admin.commit_offsets(group, topic, {0: 10})
    after = watch_audit.check_watch(watch, now=now + timedelta(seconds=30), kafka=RetainedFrom(6))
    assert (after.checked, after.lost, after.partitions[0]["settled_offset"]) == (4, 0, 10)
    assert WatchRange.objects.filter(watch=watch, note=watch_commits.DELETED_UNREAD_NOTE).count() == 1


def recreate(topic: str) -> None:
    """The team deletes the topic and creates it again under the same name: its offsets start again from 0, and
    Kafka drops the groups' commits on it."""
    from kafka.admin import KafkaAdminClient, NewTopic

    client = KafkaAdminClient(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS)
    try:
        client.delete_topics([topic])
        client.create_topics([NewTopic(topic, 1, 1)])
    finally:
        client.close()


@pytest.mark.parametrize("through", ["check", "pass"])
def test_a_topic_deleted_and_created_again_is_reported_not_audited_as_the_old_one(make_topic, table_name, through):
    """The watch audited offsets 0..9 of the old topic (value 3 lost). The team re-creates the topic; its consumer
    reads the new one from offset 0 and commits 10 again (a check sees the same commit: nothing to audit) or 30
    (a check would read offsets 10..29 of the new topic as if they followed the old one). Either way the watch
    says the topic was re-created, ERR, and audits nothing of the new topic on top of the old one's ranges."""
    watch, topic, group = watch_of_ten(make_topic, table_name, f"recreated-{through}", committed=10,
                                       rows=[v for v in range(1, 11) if v != 3])
    now = timezone.now()
    assert watch_audit.check_watch(watch, now=now).lost == 1
    recreate(topic)
    new_records = 10 if through == "pass" else 30
    produce(topic, [(None, str(v).encode()) for v in range(101, 101 + new_records)])
    write(table_name, range(101, 101 + new_records))
    admin.commit_offsets(group, topic, {0: new_records})
    later = now + timedelta(seconds=30)
    if through == "pass":
        [report] = [r for r in watch_pass.check_all(now=later) if r.watch == watch.name]
    else:
        report = watch_audit.check_watch(watch, now=later)
    assert report.status == "ERR" and "deleted and created again" in report.error, report
    assert (report.checked, report.lost, report.partitions[0]["settled_offset"]) == (10, 1, 10)
    watch.refresh_from_db()
    assert "deleted and created again" in watch.last_error
    assert sum(r.records for r in WatchRange.objects.filter(watch=watch)) == 10


def test_records_a_reset_forward_skipped_are_lost(make_topic, table_name):
    """The team moved the group's offsets forward (kafka-consumer-groups --reset-offsets --to-offset 8) past
    records it had not read: the audit cannot tell an operator's skip from a consumer's loss, so the skipped
    records are lost, and the watch's status is ERR."""
    watch, topic, group = watch_of_ten(make_topic, table_name, "skipped", rows=[1, 2, 3], committed=3)
    assert watch_audit.check_watch(watch).clean
    admin.commit_offsets(group, topic, {0: 8})   # the reset: 4..8 are never read
    write(table_name, [9, 10])
    admin.commit_offsets(group, topic, {0: 10})

    report = watch_audit.check_watch(watch)

    assert as_offsets(report.lost_offsets) == {(0, o) for o in range(3, 8)}
    assert (report.lost, report.checked, report.status) == (5, 10, "ERR")


@pytest.mark.parametrize("through", ["check", "pass"])
def test_a_commit_past_the_log_end_is_err_and_the_records_produced_below_it_are_then_lost(make_topic, table_name,
                                                                                          through):
    """The group committed 15 on a log that ends at 10 (broker data loss, an unclean leader election, a consumer
    committing what it never read). The watch said OK with lag 0. It is ERR with a note; the records produced next,
    offsets 10..14, are skipped by the group, and the audit finds them lost once they exist."""
    watch, topic, group = watch_of_ten(make_topic, table_name, f"ahead-{through}", rows=range(1, 11), committed=15)
    now = timezone.now()

    def check(at):
        if through == "pass":
            [report] = [r for r in watch_pass.check_all(now=at) if r.watch == watch.name]
            return report
        return watch_audit.check_watch(watch, now=at)

    ahead = check(now)
    assert (ahead.status, ahead.partitions[0]["status"], ahead.checked, ahead.lost) == ("ERR", "ERR", 10, 0)
    assert ahead.notes == ["partition 0: the group committed offset 15, past the log end 10; the records produced "
                           "at offsets 10 to 14 will never reach it"]

    produce(topic, [(None, str(v).encode()) for v in range(11, 16)])
    caught = check(now + timedelta(seconds=30))
    assert (caught.status, caught.checked, caught.lost, as_offsets(caught.lost_offsets)) == (
        "ERR", 15, 5, {(0, o) for o in range(10, 15)})
    assert caught.notes == []


class MarksReadEarly:
    """The watch's Kafka calls, whose first reading of the watermarks is from before the group read its last
    records (a busy topic: the group commits between Tally's two reads)."""

    def __init__(self, high: int):
        self.real, self.high, self.readings = admin.on(), high, 0

    def watermarks(self, topic, *args, **kwargs):
        self.readings += 1
        marks = self.real.watermarks(topic, *args, **kwargs)
        if self.readings > 1:
            return marks
        return {p: Watermarks(m.log_start, self.high, min(m.stable, self.high)) for p, m in marks.items()}

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_a_commit_past_marks_read_before_it_is_not_taken_for_one_past_the_log_end(make_topic, table_name):
    watch, _, _ = watch_of_ten(make_topic, table_name, "busy", rows=range(1, 11), committed=10)
    kafka = MarksReadEarly(high=7)

    report = watch_audit.check_watch(watch, kafka=kafka)

    assert (report.status, report.checked, report.notes, kafka.readings) == ("OK", 10, [], 2)


class OpenTransaction:
    """The watch's Kafka calls while a producer's transaction holds offsets `stable`.. open (a Flink sink between
    checkpoints, a crashed producer's transaction not yet timed out): the last stable offset is `stable`, and a
    read_committed reader cannot pass it. The embedded broker keeps no transaction open, so reads are held here
    as Kafka would hold them: a read asked past `stable` makes no progress, and fails."""

    def __init__(self, stable: int, monkeypatch):
        self.real, self.stable, self.asked = admin.on(), stable, []
        real_read = kafka_ranges.read_ranges

        def read_committed(topic, ranges, on_records, **kwargs):
            self.asked.append(dict(ranges))
            if any(stop > self.stable for _, stop in ranges.values()):
                raise admin.KafkaAdminError(f"{topic}: reading partitions [0] made no progress for 30 s")
            return real_read(topic, ranges, on_records, **kwargs)
        monkeypatch.setattr(kafka_ranges, "read_ranges", read_committed)

    def watermarks(self, topic, *args, **kwargs):
        return {p: Watermarks(m.log_start, m.high, min(self.stable, m.high))
                for p, m in self.real.watermarks(topic, *args, **kwargs).items()}

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.parametrize("keyed", [False, True])
def test_a_commit_past_an_open_transaction_settles_up_to_it_and_the_rest_once_it_ends(make_topic, table_name,
                                                                                     monkeypatch, keyed):
    """A read_uncommitted group committed 10 while offsets 6.. belong to an open transaction (a keyed watch also
    reads the unsettled tail). The check read to the high watermark, made no progress past the last stable offset
    for 30 s and failed as ERR, holding its locks; now it settles to 6, and the rest once the transaction ends."""
    topic, group = make_topic("txn"), f"txn-{uuid.uuid4().hex[:6]}"
    produce(topic, [(f"k{v}".encode(), str(v).encode()) for v in range(1, 11)])
    write(table_name, range(1, 11))
    admin.commit_offsets(group, topic, {0: 10})
    watch, _ = watch_setup.create(watch_setup.WatchSpec(name=f"txn-{keyed:d}", group=group, topic=topic,
                                                        sink_table=table_name, record_id="value", row_id="id",
                                                        keyed=keyed, settle_seconds=0))
    kafka = OpenTransaction(6, monkeypatch)
    now = timezone.now()

    held = watch_audit.check_watch(watch, now=now, kafka=kafka)

    assert (held.status, held.error, held.checked, held.partitions[0]["settled_offset"]) == ("OK", "", 6, 6)
    assert kafka.asked == [{0: (0, 6)}]
    kafka.stable = 10   # the transaction committed
    ended = watch_audit.check_watch(watch, now=now + timedelta(seconds=30), kafka=kafka)
    assert (ended.status, ended.checked, ended.lost, ended.partitions[0]["settled_offset"]) == ("OK", 10, 0, 10)
