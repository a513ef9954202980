"""Retention of a watch's audit history (consumers/reconciliation/watch_history.py): ranges checked longer ago than
TALLY_RETAIN_WATCH_HISTORY_DAYS fold into one summary range per partition with their counts, their findings go,
the totals and the newest range stay; the trace, the report, the alerts and a group reset behind the summary read
it right. `now` is passed in."""
import csv
import io
import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from psycopg2 import sql

from alerts.models import AlertRule, RuleKind
from alerts.rules import WatchView, check
from consumers.kafka import admin
from consumers.models import Watch, WatchFinding, WatchPartition, WatchRange
from consumers.operations import watch_setup
from consumers.reconciliation import watch_audit, watch_history, watch_listing, watch_trace
from tests.views_helpers import client_of, make_viewer
from tests.waiting import patience
from tests.watch_helpers import produce

NOW = timezone.now()
COUNTS = ("start", "end", "records", "lost", "duplicated", "phantom", "lost_offsets", "duplicated_offsets", "note")


def ago(days: float):
    return NOW - timedelta(days=days)


def ranges_of(watch: Watch, partition: int) -> list[tuple]:
    return list(WatchRange.objects.filter(watch=watch, partition=partition).order_by("start").values_list(*COUNTS))


def checked_range(watch, partition, start, end, days, *, lost=(), duplicated=()):
    """A stored range and its findings as a check stores them, checked `days` ago."""
    WatchRange.objects.create(watch=watch, partition=partition, start=start, end=end, records=end - start,
                              lost=len(lost), duplicated=len(duplicated), lost_offsets=list(lost),
                              duplicated_offsets=[[o, 1] for o in duplicated], checked_at=ago(days))
    WatchFinding.objects.bulk_create(
        [WatchFinding(watch=watch, partition=partition, offset=o, kind=WatchFinding.LOST, checked_at=ago(days))
         for o in lost] +
        [WatchFinding(watch=watch, partition=partition, offset=o, kind=WatchFinding.DUPLICATED, extra=1,
                      checked_at=ago(days)) for o in duplicated])


@pytest.fixture
def watch():
    watch = Watch.objects.create(name="kept", group_id="g", topic="t", sink_table="s", record_id="value",
                                 row_id="id")
    for partition in (0, 1):
        WatchPartition.objects.create(watch=watch, partition=partition, start_offset=0, settled_offset=50,
                                      checked=50, lost=3, duplicated=1)
    return watch


def findings_of(watch) -> list[tuple]:
    return sorted(WatchFinding.objects.filter(watch=watch).values_list("partition", "offset"))


@pytest.mark.django_db
def test_ranges_past_retention_fold_into_one_summary_with_their_counts_and_their_findings_go(watch, settings):
    settings.TALLY_RETAIN_WATCH_HISTORY_DAYS = 90
    checked_range(watch, 0, 0, 10, 100)
    checked_range(watch, 0, 10, 20, 95, lost=[12, 13])
    checked_range(watch, 0, 20, 30, 92, duplicated=[25])
    checked_range(watch, 0, 30, 40, 10, lost=[35])
    checked_range(watch, 0, 40, 50, 1)
    checked_range(watch, 1, 0, 50, 200, lost=[5])   # old, but the partition's newest: the next check may extend it

    assert watch_history.apply(NOW) == {"watch_ranges": 2}

    assert ranges_of(watch, 0) == [(0, 30, 30, 2, 1, 0, [], [], watch_history.SUMMARY_NOTE),
                                   (30, 40, 10, 1, 0, 0, [35], [], ""), (40, 50, 10, 0, 0, 0, [], [], "")]
    assert ranges_of(watch, 1) == [(0, 50, 50, 1, 0, 0, [5], [], "")]
    assert findings_of(watch) == [(0, 35), (1, 5)]
    assert sorted(WatchPartition.objects.filter(watch=watch).values_list("checked", "lost", "duplicated")) == \
        [(50, 3, 1), (50, 3, 1)]    # the totals count the whole audit
    assert watch_history.apply(NOW) == {"watch_ranges": 0}
    assert len(ranges_of(watch, 0)) == 3

    later = NOW + timedelta(days=85)    # [30, 40) is now 95 days old: it joins the summary
    assert watch_history.apply(later) == {"watch_ranges": 1}
    assert ranges_of(watch, 0)[0] == (0, 40, 40, 3, 1, 0, [], [], watch_history.SUMMARY_NOTE)
    assert findings_of(watch) == [(1, 5)]


@pytest.mark.django_db
def test_a_long_history_folds_a_batch_per_transaction_into_the_same_summary(watch, settings, monkeypatch):
    settings.TALLY_RETAIN_WATCH_HISTORY_DAYS = 90
    monkeypatch.setattr(watch_history, "DELETE_BATCH", 3)
    for i in range(10):
        checked_range(watch, 0, i * 10, i * 10 + 10, 200 - i, lost=[i * 10 + 1])
    checked_range(watch, 0, 100, 110, 1)

    assert watch_history.apply(NOW) == {"watch_ranges": 9}

    assert ranges_of(watch, 0) == [(0, 100, 100, 10, 0, 0, [], [], watch_history.SUMMARY_NOTE),
                                   (100, 110, 10, 0, 0, 0, [], [], "")]
    assert findings_of(watch) == []


@pytest.mark.django_db
def test_the_summary_still_counts_for_alerts_and_the_listed_offsets_are_the_kept_ones(watch, settings):
    settings.TALLY_RETAIN_WATCH_HISTORY_DAYS = 90
    checked_range(watch, 0, 0, 20, 95, lost=[12, 13])
    checked_range(watch, 0, 20, 40, 1, lost=[35])
    WatchPartition.objects.filter(watch=watch, partition=1).update(lost=0, duplicated=0)
    watch_history.apply(NOW)

    finding = check(AlertRule(name="lost", kind=RuleKind.LOST), WatchView.load(watch, NOW))

    assert finding.summary == "3 lost records (partition 0: offsets within 0-19, 35)"
    assert watch_listing.listed_offsets(watch) == ([{"partition": 0, "offset": 35}], [])


@pytest.mark.django_db
def test_the_admin_page_counts_the_ranges_past_retention_but_never_the_newest_or_the_summary(watch, admin_client,
                                                                                              settings):
    settings.TALLY_RETAIN_WATCH_HISTORY_DAYS = 90
    checked_range(watch, 0, 0, 10, 100)
    checked_range(watch, 0, 10, 20, 95)
    checked_range(watch, 0, 20, 30, 1)
    checked_range(watch, 1, 0, 50, 200)
    assert watch_history.counts(NOW)[0]["past_retention"] == 2
    watch_history.apply(NOW)
    assert watch_history.counts(NOW)[0] == {"name": "watch ranges and findings", "days": 90, "rows": 3,
                                            "setting": "TALLY_RETAIN_WATCH_HISTORY_DAYS", "past_retention": 0}

    html = admin_client.get("/admin/consumers/history/").content.decode()

    row = html[html.index('data-kind="TALLY_RETAIN_WATCH_HISTORY_DAYS"'):]
    assert '<td class="rows">3</td>' in row[:row.index("</tr>")]


@pytest.mark.django_db(transaction=True)
def test_a_watch_a_check_holds_is_left_for_the_next_run(watch, settings):
    settings.TALLY_RETAIN_WATCH_HISTORY_DAYS = 90
    checked_range(watch, 0, 0, 10, 100, lost=[1])
    checked_range(watch, 0, 10, 20, 1)
    held, release = threading.Event(), threading.Event()

    def check_holding_the_watch():
        try:
            with transaction.atomic():
                Watch.objects.select_for_update().get(pk=watch.pk)   # the lock a check takes first
                held.set()
                release.wait(patience(30))
        finally:
            connection.close()

    holder = threading.Thread(target=check_holding_the_watch)
    holder.start()
    try:
        assert held.wait(patience(30))
        assert watch_history.apply(NOW) == {"watch_ranges": 0}
        assert ranges_of(watch, 0)[0][-1] == "" and findings_of(watch) == [(0, 1)]
    finally:
        release.set()
        holder.join()
    watch_history.apply(NOW)
    assert ranges_of(watch, 0)[0][-1] == watch_history.SUMMARY_NOTE and findings_of(watch) == []


def execute(statement: sql.Composable, params=()) -> None:
    with connection.cursor() as cur:
        cur.execute(statement.as_string(cur.cursor), params)


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_after_a_real_audit_the_trace_says_past_retention_and_a_reset_behind_the_summary_audits_afresh(
        make_topic, table_name):
    topic, group = make_topic("aged"), f"aged-{uuid.uuid4().hex[:6]}"
    produce(topic, [(None, str(v).encode()) for v in range(40)])
    execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(table_name)))
    execute(sql.SQL("INSERT INTO {} SELECT g FROM generate_series(0, 39) g WHERE g NOT IN (3, 4, 33)").format(
        sql.Identifier(table_name)))
    watch, _ = watch_setup.create(watch_setup.WatchSpec(name="aged", group=group, topic=topic, sink_table=table_name,
                                                        record_id="value", row_id="id", settle_seconds=0))
    admin.commit_offsets(group, topic, {0: 20})
    watch_audit.check_watch(watch)
    admin.commit_offsets(group, topic, {0: 40})
    report = watch_audit.check_watch(watch)
    assert (report.lost, len(ranges_of(watch, 0))) == (3, 2)

    # A quarter later (no check since): the first range is past retention.
    assert watch_history.apply(timezone.now() + timedelta(days=91)) == {"watch_ranges": 0}

    assert ranges_of(watch, 0)[0] == (0, 20, 20, 2, 0, 0, [], [], watch_history.SUMMARY_NOTE)
    aged = watch_trace.trace(watch, 0, 3)
    assert (aged.verdict, aged.finding, aged.rows_found) == ("past retention", None, 0)
    assert "more than 90 days ago" in aged.explanation
    assert watch_trace.trace(watch, 0, 5).verdict == "past retention"   # delivered then: its row is there now
    assert watch_trace.trace(watch, 0, 33).verdict == "lost"            # the kept range still has its finding
    again = watch_audit.check_watch(watch)
    assert (again.lost, again.lost_offsets) == (3, [{"partition": 0, "offset": 33}])
    viewer = client_of(make_viewer())
    page = viewer.get("/watches/aged/").content.decode()
    assert '<tr id="range-0-0">' in page and watch_history.SUMMARY_NOTE in page
    api = viewer.get("/api/watches/aged/").json()
    assert api["lost"] == 3 and [r["note"] for r in api["ranges"] if r["start"] == 0] == [watch_history.SUMMARY_NOTE]
    traced = viewer.get("/watches/aged/trace/?partition=0&offset=3")
    assert traced.status_code == 200 and 'data-verdict="past retention"' in traced.content.decode()
    assert viewer.get("/api/watches/aged/trace?partition=0&offset=3").json()["verdict"] == "past retention"
    assert [r["offset"] for r in csv.DictReader(io.StringIO(b"".join(
        viewer.get("/api/watches/aged/findings.csv").streaming_content).decode()))] == ["33"]

    # The group is reset behind the summary: its counts leave the totals, and the re-read is audited afresh.
    admin.commit_offsets(group, topic, {0: 2})
    watch_audit.check_watch(watch)
    admin.commit_offsets(group, topic, {0: 40})
    after = watch_audit.check_watch(watch)
    assert (after.lost, after.checked) == (3, 40)
    assert sorted(o["offset"] for o in after.lost_offsets) == [3, 4, 33]
    assert all(note == "" for *_, note in ranges_of(watch, 0))
