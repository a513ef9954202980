"""A pass over every watch (consumers/reconciliation/watch_pass.py): Kafka read once per cluster, the watches with
nothing new to audit measured together, every other watch checked as a check of its own would."""
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from psycopg2 import sql

from consumers.kafka import admin, clusters
from consumers.models import Status, Watch, WatchPartition
from consumers.operations import watch_setup
from consumers.reconciliation import monitored, watch_audit, watch_pass
from tests.watch_helpers import as_offsets, drop_tables, produce

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def team_watch(make_topic):
    """team_watch(name, records=5, committed=records, lost=(), settle=0, topic=None): a topic of `records` records
    (values 1..records; or `topic`, holding them already), a group that committed `committed`, and the team's table
    with a row per record up to the commit except the values in `lost`; a watch of them, made through watch_setup."""
    tables = []

    def make(name: str, records: int = 5, committed: int | None = None, lost=(), settle: int = 0,
             topic: str | None = None) -> Watch:
        committed = records if committed is None else committed
        table, group = f"team_{uuid.uuid4().hex[:8]}", f"{name}-{uuid.uuid4().hex[:6]}"
        tables.append(table)
        if topic is None:
            topic = make_topic(name)
            produce(topic, [(None, str(v).encode()) for v in range(1, records + 1)])
        with connection.cursor() as cur:
            cur.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(table)).as_string(cur.cursor))
            cur.execute(sql.SQL("INSERT INTO {} SELECT v FROM generate_series(1, %s) v WHERE NOT v = ANY(%s)").format(
                sql.Identifier(table)).as_string(cur.cursor), [committed, list(lost) or [0]])
        admin.commit_offsets(group, topic, {0: committed})
        spec = watch_setup.WatchSpec(name=name, group=group, topic=topic, sink_table=table, record_id="value",
                                     row_id="id", settle_seconds=settle)
        return watch_setup.create(spec)[0]

    yield make
    drop_tables(*tables)


@pytest.fixture
def spy(monkeypatch):
    """Counts of what a pass builds and calls: Kafka consumers and admin clients, and checks of a single watch."""
    counts = {"consumers": 0, "admins": 0, "checks": []}

    def counting(name, real):
        def call(*args, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)
        return call

    def check_watch(watch, **kwargs):
        counts["checks"].append(watch.name)
        return real_check(watch, **kwargs)

    real_check = watch_audit.check_watch
    monkeypatch.setattr(clusters, "consumer", counting("consumers", clusters.consumer))
    monkeypatch.setattr(clusters, "admin", counting("admins", clusters.admin))
    monkeypatch.setattr(watch_audit, "check_watch", check_watch)

    def reset():
        counts.update(consumers=0, admins=0, checks=[])
    counts["reset"] = reset
    return counts


def quiet_pass(spy, now):
    """A pass, with the queries it ran and the Kafka clients it built."""
    spy["reset"]()
    with CaptureQueriesContext(connection) as queries:
        reports = watch_pass.check_all(now=now)
    return reports, len(queries.captured_queries), spy["consumers"] + spy["admins"]


def test_a_pass_over_quiet_watches_costs_the_same_queries_and_kafka_clients_for_two_watches_as_for_four(
        team_watch, spy):
    now = timezone.now()
    team_watch("quiet-a"), team_watch("quiet-b")
    first = watch_pass.check_all(now=now)   # audits the two watches' records, one check each
    assert sorted(spy["checks"]) == ["quiet-a", "quiet-b"] and all(r.checked == 5 for r in first)
    reports, two_queries, two_clients = quiet_pass(spy, now + timedelta(seconds=30))
    assert spy["checks"] == [] and [r.status for r in reports] == [Status.OK, Status.OK]
    assert all(r.checked == 5 and r.lag_records == 0 for r in reports)

    team_watch("quiet-c"), team_watch("quiet-d")
    watch_pass.check_all(now=now + timedelta(seconds=60))
    reports, four_queries, four_clients = quiet_pass(spy, now + timedelta(seconds=90))
    assert spy["checks"] == [] and len(reports) == 4
    assert four_queries == two_queries
    assert four_clients == two_clients == 1   # one consumer reads every topic's watermarks; the admin is shared
    assert set(WatchPartition.objects.values_list("checked_at", flat=True)) == {now + timedelta(seconds=90)}


def test_a_quiet_watch_whose_group_stays_behind_turns_stopped_without_a_check_of_its_own(team_watch, spy):
    watch = team_watch("behind", records=10, committed=4)
    now = timezone.now()
    first = watch_pass.check_all(now=now)[0]
    assert (first.status, first.checked, first.lag_records) == (Status.OK, 4, 6)

    later = now + monitored.status_window() + timedelta(minutes=1)
    spy["reset"]()
    report = watch_pass.check_all(now=later)[0]
    assert spy["checks"] == []
    assert (report.status, report.checked, report.lag_records) == (Status.STOP, 4, 6)   # no member is alive
    assert report.lag_seconds > first.lag_seconds + monitored.status_window().total_seconds()
    watch.refresh_from_db()
    assert (watch.status, watch.checked_at) == (Status.STOP, later)
    assert WatchPartition.objects.get(watch=watch).status == Status.STOP


def test_a_commit_seen_by_one_pass_is_audited_by_the_first_pass_after_it_settles(team_watch, spy):
    team_watch("settles", records=10, lost=[3], settle=30)   # the record of value 3, offset 2, has no row
    now = timezone.now()
    seen = watch_pass.check_all(now=now)[0]
    assert spy["checks"] == [] and (seen.checked, seen.lost) == (0, 0)   # seen, not settled: nothing to audit

    early = watch_pass.check_all(now=now + timedelta(seconds=20))[0]
    assert spy["checks"] == [] and early.checked == 0
    settled = watch_pass.check_all(now=now + timedelta(seconds=31))[0]   # nothing new in Kafka, but settled
    assert spy["checks"] == ["settles"]
    assert (settled.checked, settled.lost, as_offsets(settled.lost_offsets)) == (10, 1, {(0, 2)})
    assert settled.status == Status.ERR

    spy["reset"]()
    again = watch_pass.check_all(now=now + timedelta(seconds=61))[0]
    assert spy["checks"] == []   # quiet again, and its findings still reported
    assert (again.status, again.checked, again.lost, as_offsets(again.lost_offsets)) == \
        (Status.ERR, 10, 1, {(0, 2)})


def test_a_group_reset_in_a_pass_goes_to_the_check_that_reopens_the_ranges(team_watch, spy):
    watch = team_watch("rewound", records=10)
    now = timezone.now()
    watch_pass.check_all(now=now)
    admin.commit_offsets(watch.group_id, watch.topic, {0: 4})
    spy["reset"]()
    report = watch_pass.check_all(now=now + timedelta(seconds=30))[0]
    assert spy["checks"] == ["rewound"]
    assert report.status == Status.REWIND and report.partitions[0]["settled_offset"] == 4


def test_a_watch_whose_topic_is_gone_fails_alone_with_the_reason_its_own_check_gives(team_watch):
    team_watch("still-here")
    gone = Watch.objects.create(name="gone", group_id="gone-group", topic=f"gone-{uuid.uuid4().hex[:8]}")
    reports = {r.watch: r for r in watch_pass.check_all()}
    assert reports["still-here"].status == Status.OK and not reports["still-here"].error
    assert reports["gone"].status == Status.ERR
    assert reports["gone"].error == watch_audit.check_watch(gone).error
    assert "does not exist" in reports["gone"].error


def test_a_watch_whose_table_is_dropped_stays_err_with_the_reason_through_quiet_passes(team_watch, spy):
    watch = team_watch("dropped")
    now = timezone.now()
    assert watch_pass.check_all(now=now)[0].status == Status.OK   # audited: nothing new after this
    drop_tables(watch.sink_table)

    for seconds in (30, 60):   # nothing new in Kafka: a pass would only measure, yet the table is gone
        spy["reset"]()
        report = watch_pass.check_all(now=now + timedelta(seconds=seconds))[0]
        assert spy["checks"] == ["dropped"]   # checked alone, not measured with the quiet ones
        assert report.status == Status.ERR and "no longer exist" in report.error
        watch.refresh_from_db()
        assert watch.status == Status.ERR and "no longer exist" in watch.last_error
    assert watch_audit.check_watch(watch, now=now + timedelta(seconds=90)).status == Status.ERR

    with connection.cursor() as cur:   # the table is back: the next pass is quiet and OK again
        cur.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(watch.sink_table)).as_string(
            cur.cursor))
    spy["reset"]()
    report = watch_pass.check_all(now=now + timedelta(seconds=120))[0]
    assert spy["checks"] == [] and report.status == Status.OK and not report.error


def test_a_watch_whose_id_column_changed_type_is_err_with_the_reason_and_settles_nothing(team_watch):
    """The team altered its id column to a type no record id compares with: the audit's statement fails. That is
    the watch's ERR with the reason, as a dropped table is, not a check that crashes and leaves the old status."""
    watch = team_watch("retyped", records=5, committed=3)
    now = timezone.now()
    assert watch_pass.check_all(now=now)[0].clean
    with connection.cursor() as cur:
        cur.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN id TYPE double precision").format(
            sql.Identifier(watch.sink_table)).as_string(cur.cursor))
    admin.commit_offsets(watch.group_id, watch.topic, {0: 5})

    reports = watch_pass.check_all(now=now + timedelta(seconds=30))
    assert [r.watch for r in reports] == ["retyped"]
    assert reports[0].status == Status.ERR and "could not be audited" in reports[0].error
    assert "double precision" in reports[0].error
    watch.refresh_from_db()
    assert watch.status == Status.ERR and "could not be audited" in watch.last_error
    assert WatchPartition.objects.get(watch=watch).settled_offset == 3   # nothing settled: audited once it can be


def test_two_watches_of_one_topic_are_checked_in_one_pass_each_finding_its_own(team_watch, spy):
    """Two groups on one topic: one bulk read serves both, and the lag in seconds of the one behind is read at its
    own position, not the other's."""
    whole = team_watch("whole", records=10)
    team_watch("part", committed=6, lost=[2], topic=whole.topic)   # offset 1 has no row in its table
    now = timezone.now()
    reports = {r.watch: r for r in watch_pass.check_all(now=now)}
    assert sorted(spy["checks"]) == ["part", "whole"]
    assert (reports["whole"].checked, reports["whole"].lost, reports["whole"].lag_records) == (10, 0, 0)
    assert (reports["part"].checked, reports["part"].lost, reports["part"].lag_records) == (6, 1, 4)
    assert as_offsets(reports["part"].lost_offsets) == {(0, 1)}

    spy["reset"]()
    later = {r.watch: r for r in watch_pass.check_all(now=now + timedelta(seconds=30))}
    assert spy["checks"] == []
    assert (later["part"].lag_records, later["whole"].lag_records, later["whole"].lag_seconds) == (4, 0, 0.0)
    assert later["part"].lag_seconds >= 30
