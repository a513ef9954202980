"""Watches on every door after real history: a plain consumer killed after its commit, then the API (create,
refusals, check), snapshots, the pages, the overview, /metrics; and alerts on watches that fire once and
resolve once."""
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from psycopg2 import sql

from alerts import evaluate
from alerts.defaults import ensure_default_rules
from alerts.models import Alert, AlertRule, AlertState, Notification, RuleKind
from consumers.kafka import admin
from consumers.models import RANGES_SHOWN, ActionLog, ActionResult, LagSnapshot, Watch, WatchRange
from consumers.operations import watch_setup
from consumers.reconciliation import snapshots, watch_audit, watch_commits
from tests.producing import into, send
from tests.views_helpers import client_of, make_operator, make_viewer
from tests.watch_helpers import as_offsets, id_counts, produce, read_topic, run_plain_consumer

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]
COMPACT = {"cleanup.policy": "compact"}


@pytest.mark.chaos
def test_pages_api_and_metrics_after_a_killed_consumer(make_topic, subprocess_env, table_name):
    topic = make_topic("nums", partitions=2)
    produce(topic, [(None, str(v).encode()) for v in range(1, 61)], partitions=2)
    group = f"g-{uuid.uuid4().hex[:6]}"
    assert run_plain_consumer(subprocess_env, topic, group, table_name, "commit-then-write", die_at_batch=2) == -9
    assert run_plain_consumer(subprocess_env, topic, group, table_name, "commit-then-write") == 0
    operator, viewer = client_of(make_operator()), client_of(make_viewer())
    body = {"name": "team-nums", "group": group, "topic": topic, "sink_table": table_name, "record_id": "value",
            "row_id": "id", "settle_seconds": 0}

    refused = viewer.post("/api/watches/", body, content_type="application/json")
    assert refused.status_code == 403 and not Watch.objects.exists()
    bad_type = operator.post("/api/watches/", {**body, "settle_seconds": "0"}, content_type="application/json")
    assert bad_type.status_code == 400 and "settle_seconds" in bad_type.json()["errors"]
    no_table = operator.post("/api/watches/", {**body, "sink_table": "nope"}, content_type="application/json")
    assert no_table.status_code == 400 and "does not exist" in no_table.json()["errors"]["sink_table"][0]["message"]
    assert not Watch.objects.exists()
    assert ActionLog.objects.filter(action="create_watch", result=ActionResult.REFUSED).count() >= 2
    created = operator.post("/api/watches/", body, content_type="application/json")
    assert created.status_code == 201, created.content

    now = timezone.now()
    snapshots.take_snapshots(now=now - timedelta(minutes=1))   # before any check: nothing measured, no sample
    checked = operator.post("/api/watches/team-nums/check", {}, content_type="application/json").json()
    written = id_counts(table_name)
    missing = {w for w, (_, value, _) in read_topic(topic).items() if int(value) not in written}
    assert missing and as_offsets(checked["lost_offsets"]) == missing and checked["lost"] == len(missing)
    snapshots.take_snapshots(now=now)
    snapshots.take_snapshots(now=now + timedelta(minutes=1))
    watch = Watch.objects.get(name="team-nums")
    assert LagSnapshot.objects.filter(watch=watch, partition__isnull=False).count() == 4
    assert LagSnapshot.objects.filter(watch=watch, partition__isnull=True).count() == 2

    listing = operator.get("/api/watches/").json()["watches"]
    assert [(w["name"], w["lost"], w["status"]) for w in listing] == [("team-nums", len(missing), "ERR")]
    detail = operator.get("/api/watches/team-nums/").json()
    assert len(detail["partitions"]) == 2 and as_offsets(detail["lost_offsets"]) == missing
    assert sum(r["lost"] for r in detail["ranges"]) == len(missing)

    page = viewer.get("/watches/team-nums/").content.decode()
    assert 'id="watch-partitions"' in page and 'id="lost-offsets"' in page
    partition, offset = sorted(missing)[0]
    assert f"<code>{partition}:{offset}</code>" in page and '"lag_p1"' in page
    assert 'id="watch-team-nums"' in viewer.get("/watches/").content.decode()
    assert 'id="watch-team-nums"' in viewer.get("/").content.decode()
    metrics = viewer.get("/metrics").content.decode()
    assert f'tally_watch_lost_records{{group="{group}",topic="{topic}",watch="team-nums"}} {float(len(missing))}' \
        in metrics
    assert f'tally_watch_status{{group="{group}",status="ERR",topic="{topic}",watch="team-nums"}} 1.0' in metrics
    assert f'tally_watch_status{{group="{group}",status="OK",topic="{topic}",watch="team-nums"}} 0.0' in metrics
    assert viewer.post("/api/watches/team-nums/check", {}, content_type="application/json").status_code == 403
    assert operator.delete("/api/watches/team-nums/").status_code == 200 and not Watch.objects.exists()


def test_the_form_adds_a_watch_with_the_same_validation(make_topic):
    topic = make_topic("nums")
    operator = client_of(make_operator())
    assert operator.get("/watches/new/").status_code == 200
    refused = operator.post("/watches/new/", {"name": "form-watch", "group": "g", "topic": topic,
                                              "sink_table": "missing_table", "record_id": "value", "row_id": "id",
                                              "start_from": "earliest", "settle_seconds": 30})
    assert refused.status_code == 400 and "does not exist" in refused.content.decode()
    assert not Watch.objects.exists()
    refusal = ActionLog.objects.get(action="create_watch")
    assert refusal.result == ActionResult.REFUSED and refusal.params["watch"] == "form-watch"
    assert "does not exist" in refusal.message
    created = operator.post("/watches/new/", {"name": "form-watch", "group": "g", "topic": topic,
                                              "start_from": "latest", "settle_seconds": 5,
                                              "ignore": "json:type=heartbeat\n"})
    assert created.status_code == 302 and created["Location"] == "/watches/form-watch/"
    watch = Watch.objects.get(name="form-watch")
    assert (watch.start_from, watch.settle_seconds, watch.ignore) == ("latest", 5, ["json:type=heartbeat"])
    viewer = client_of(make_viewer())
    assert viewer.post("/watches/new/", {"name": "other", "group": "g", "topic": topic}).status_code == 403


def insert_ids(table: str, ids) -> None:
    with connection.cursor() as cur:
        for value in ids:
            cur.execute(sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(sql.Identifier(table)).as_string(cur.cursor),
                        [value])


def test_alerts_on_a_watch_fire_once_and_resolve_once(make_topic, table_name, settings):
    settings.ALERT_RECIPIENTS = ["team@example.com"]
    topic = make_topic("nums")
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(table_name)).as_string(cur.cursor))
    produce(topic, [(None, str(v).encode()) for v in range(1, 11)])
    insert_ids(table_name, [v for v in range(1, 11) if v != 4])   # the record with value 4 is lost
    admin.commit_offsets("alerting-group", topic, {0: 10})
    watch, _ = watch_setup.create(watch_setup.WatchSpec(name="alerting", group="alerting-group", topic=topic,
                                                        sink_table=table_name, record_id="value", row_id="id",
                                                        settle_seconds=0))
    ensure_default_rules()   # "Lost records" and the others every installation has
    lag_rule = AlertRule.objects.create(name="lag over 5", kind=RuleKind.LAG_RECORDS, threshold=5)
    produce(topic, [(None, str(v).encode()) for v in range(11, 21)])   # committed by nobody yet: lag 10
    now = timezone.now()

    watch_audit.check_watch(watch, now=now)
    first = evaluate.evaluate_all(now=now)
    evaluate.evaluate_all(now=now + timedelta(seconds=30))

    assert sorted(first.fired) == ["alerting/Lost records", "alerting/lag over 5"]
    lost_alert = Alert.objects.get(watch=watch, rule__kind=RuleKind.LOST)
    assert "1 lost record (partition 0: offsets 3)" in lost_alert.summary
    assert Notification.objects.filter(kind="fired").count() == 2
    notification = Notification.objects.get(alert=lost_alert)
    assert notification.subject.startswith("[Tally] FIRING: alerting:")
    assert "/watches/alerting/" in notification.body_text

    insert_ids(table_name, range(11, 21))
    admin.commit_offsets("alerting-group", topic, {0: 20})
    watch_audit.check_watch(watch, now=now + timedelta(minutes=1))
    evaluate.evaluate_all(now=now + timedelta(minutes=1))
    evaluate.evaluate_all(now=now + timedelta(minutes=2))

    lag_alert = Alert.objects.get(watch=watch, rule=lag_rule)
    assert lag_alert.state == AlertState.RESOLVED
    assert Notification.objects.filter(alert=lag_alert, kind="resolved").count() == 1
    assert Alert.objects.get(pk=lost_alert.pk).state == AlertState.FIRING   # the record is still lost
    watch_setup.delete("alerting")
    gone = Alert.objects.get(pk=lost_alert.pk)
    assert gone.state == AlertState.RESOLVED and gone.pipeline_label == "alerting" and gone.is_gone
    assert Notification.objects.filter(alert=gone, kind="resolved").count() == 1



def watch_with_history(topic: str, table: str, checks: int, now) -> Watch:
    """A team's consumer of a compacted topic (offset ids) that loses the first record of every batch of 5, and a
    real check after each batch, 30 s apart: a range with a finding per check, never merged, as a watch checked
    every 30 s keeps them."""
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (part integer, off bigint)").format(sql.Identifier(table))
                    .as_string(cur.cursor))
    watch, _ = watch_setup.create(watch_setup.WatchSpec(name="history", group="history-group", topic=topic,
                                                        sink_table=table, record_id="offset", row_id="part,off",
                                                        settle_seconds=0))
    for i in range(checks):
        send(topic, into(0, range(5 * i, 5 * i + 5)))
        with connection.cursor() as cur:
            for offset in range(5 * i + 1, 5 * i + 5):
                cur.execute(sql.SQL("INSERT INTO {} (part, off) VALUES (0, %s)").format(sql.Identifier(table))
                            .as_string(cur.cursor), [offset])
        admin.commit_offsets("history-group", topic, {0: 5 * i + 5})
        assert watch_audit.check_watch(watch, now=now + timedelta(seconds=30 * i)).lost == i + 1
    return Watch.objects.get(pk=watch.pk)


def plan_of_newest_ranges(client, url: str, marker: str = '"checked_at" DESC') -> str:
    """The plan PostgreSQL chooses for the query of `url` that reads the watch's ranges and holds `marker` (by
    default the one reading its newest ranges, for the list of ranges), sequential scans and
    sorts off (a test's few rows would rather be scanned, or read by another index and sorted: which, depends on
    the statistics other tests left): a Sort node then remains only where no index gives the order."""
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    [query] = [q["sql"] for q in captured.captured_queries
               if 'FROM "consumers_watchrange"' in q["sql"] and "LIMIT" in q["sql"] and marker in q["sql"]]
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off")
        cur.execute(f"EXPLAIN {query}")
        return "\n".join(row[0] for row in cur.fetchall())


def test_the_page_and_the_api_read_the_newest_ranges_from_an_index_without_sorting(make_topic, table_name):
    watch = watch_with_history(make_topic("compacted", configs=COMPACT), table_name, checks=3, now=timezone.now())
    viewer = client_of(make_viewer())
    for url in (f"/watches/{watch.name}/", f"/api/watches/{watch.name}/"):
        plan = plan_of_newest_ranges(viewer, url)
        assert "watch_range_newest_idx" in plan and "Sort" not in plan, plan
        # The lost offsets listed come from the first ranges with a loss, in offset order (read no further).
        plan = plan_of_newest_ranges(viewer, url, marker='"lost" > 0')
        assert "watch_range_idx" in plan and "Sort" not in plan, plan


def test_the_page_lists_as_many_ranges_as_the_api_and_says_when_older_ones_were_left_out(make_topic,
                                                                                          table_name):
    now = timezone.now()
    watch = watch_with_history(make_topic("compacted", configs=COMPACT), table_name, checks=2, now=now)
    viewer = client_of(make_viewer())
    page = viewer.get("/watches/history/").content.decode()
    assert page.count('<tr id="range-') == 2 and 'id="ranges-bound"' not in page

    # Older history, as months of checks leave it: a range with a finding per check, never merged.
    WatchRange.objects.bulk_create(WatchRange(watch=watch, partition=1, start=10 * i, end=10 * i + 10, records=10,
                                              lost=1, checked_at=now - timedelta(days=1, seconds=30 * i))
                                   for i in range(RANGES_SHOWN))
    page = viewer.get("/watches/history/").content.decode()
    assert page.count('<tr id="range-') == RANGES_SHOWN
    assert len(viewer.get("/api/watches/history/").json()["ranges"]) == RANGES_SHOWN
    assert '<tr id="range-0-5">' in page and '<tr id="range-0-0">' in page   # the real checks' ranges, newest
    assert f"The newest {RANGES_SHOWN} ranges" in page and 'id="ranges-bound"' in page


def test_the_page_and_the_api_say_why_phantoms_are_not_counted_on_a_compacted_topic(make_topic, table_name):
    from tests.api_schema import RAW_SCHEMA, assert_documented, operation

    now = timezone.now()
    watch = watch_with_history(make_topic("compacted", configs=COMPACT), table_name, checks=2, now=now)
    note = watch_audit.COMPACTED_NOTE.format(policy="compact")
    assert watch.last_notes == [note]
    watch_audit.check_all(now=now + timedelta(minutes=1))   # a pass with nothing new to audit reads no policy
    assert Watch.objects.get(pk=watch.pk).last_notes == [note]

    viewer = client_of(make_viewer())
    page = viewer.get("/watches/history/").content.decode()
    assert 'id="watch-notes"' in page and "rows there are not counted as phantoms" in page
    detail = viewer.get("/api/watches/history/")
    assert detail.json()["last_notes"] == [note]
    assert_documented(operation("GET", "/api/watches/{name}/"), detail, "GET", "/api/watches/history/")
    assert "last_notes" in RAW_SCHEMA["components"]["schemas"]["WatchDetail"]["properties"]


def test_the_apis_ranges_with_every_kind_of_finding_match_the_schema(make_topic, table_name):
    from tests.api_schema import assert_documented, operation

    now = timezone.now()
    watch = watch_with_history(make_topic("compacted", configs=COMPACT), table_name, checks=1, now=now)
    WatchRange.objects.create(watch=watch, partition=1, start=0, end=10, records=9, ignored=1, superseded=1,
                              unreadable=1, lost=1, lost_offsets=[4], duplicated=2, duplicated_offsets=[[6, 2]],
                              phantom=1, phantom_offsets=[8], checked_at=now - timedelta(days=1))
    WatchRange.objects.create(watch=watch, partition=1, start=10, end=20,
                              note=watch_commits.DELETED_UNREAD_NOTE, checked_at=now - timedelta(days=1))
    detail = client_of(make_viewer()).get("/api/watches/history/")
    ranges = {r["start"]: r for r in detail.json()["ranges"] if r["partition"] == 1}
    assert ranges[0]["duplicated_offsets"] == [[6, 2]] and ranges[10]["note"] == watch_commits.DELETED_UNREAD_NOTE
    assert_documented(operation("GET", "/api/watches/{name}/"), detail, "GET", "/api/watches/history/")
