"""Retention of Tally's own tables (consumers/operations/retention.py, alerts/retention.py): only what is past its
setting goes, never the action log of the last TALLY_RETAIN_ACTION_LOG_DAYS, never a live run, a pending dead
letter, an open alert or an unfinished topic check; the admin page shows the counts. `now` is passed in."""
import subprocess
import sys
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from alerts import retention as alert_retention
from alerts.models import (
    Alert,
    AlertRule,
    AlertState,
    Channel,
    ChannelKind,
    Mute,
    Notification,
    NotificationKind,
    RuleKind,
)
from alerts.outbox import routed_channels
from consumers.admin_history import ledger_facts
from consumers.models import (
    ActionLog,
    BatchLedger,
    ConsumerRun,
    DeadLetter,
    DeadLetterReplay,
    DesiredState,
    Pipeline,
    RunState,
    TopicCheckJob,
    TopicCheckStatus,
)
from consumers.operations import retention
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db
NOW = timezone.now()


def ago(days: float):
    return NOW - timedelta(days=days)


@pytest.fixture
def pipeline():
    return Pipeline.objects.create(name="kept", topic="t", sink_table="s")


def run(pipeline, *, ended_days=None, heartbeat_days, state=RunState.STOPPED):
    return ConsumerRun.objects.create(pipeline=pipeline, epoch=1, host="h", pid=1, state=state,
                                      heartbeat_at=ago(heartbeat_days),
                                      ended_at=ago(ended_days) if ended_days is not None else None)


def test_runs_go_once_ended_or_silent_past_their_setting_and_live_ones_stay(pipeline, settings):
    settings.TALLY_RETAIN_RUNS_DAYS = 30
    old = run(pipeline, ended_days=31, heartbeat_days=31)
    silent = run(pipeline, heartbeat_days=45, state=RunState.RUNNING)      # SIGKILLed, never declared
    recent = run(pipeline, ended_days=29, heartbeat_days=29)
    live = run(pipeline, heartbeat_days=0, state=RunState.RUNNING)

    assert retention.apply(now=NOW)["runs"] == 2

    assert set(ConsumerRun.objects.values_list("pk", flat=True)) == {recent.pk, live.pk}
    assert not ConsumerRun.objects.filter(pk__in=[old.pk, silent.pk]).exists()


def plan_of(query: str) -> str:
    """The plan PostgreSQL chooses for `query` with sequential scans and sorts off (a test's few rows would rather
    be scanned and sorted): a Sort node then remains only where no index gives the order."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off")
        cur.execute(f"EXPLAIN {query}")
        return "\n".join(row[0] for row in cur.fetchall())


def test_finding_expired_runs_reads_each_pipelines_newest_run_from_an_index_not_a_sort(pipeline, settings):
    # Each candidate asks "is this its pipeline's newest run?". Answered by sorting the pipeline's runs, a year of
    # crash-loop restarts (200,000 runs) made one batch's query run for minutes: retention never got through.
    settings.TALLY_RETAIN_RUNS_DAYS = 30
    run(pipeline, ended_days=31, heartbeat_days=31)
    run(pipeline, ended_days=1, heartbeat_days=1)

    with CaptureQueriesContext(connection) as captured:
        assert retention.apply(now=NOW)["runs"] == 1
    query = next(q["sql"] for q in captured.captured_queries   # the first batch's selection
                 if 'FROM "consumers_consumerrun"' in q["sql"] and f"LIMIT {retention.DELETE_BATCH}" in q["sql"])

    plan = plan_of(query)
    assert "Sort" not in plan, plan


def test_a_pipelines_last_run_and_its_current_epochs_runs_stay_whatever_their_age(settings):
    # A pipeline halted on a bad record waits for an operator for as long as it takes: its halted run is what
    # keeps the supervisor from restarting it (Pipeline.halted_run) and what the page and the no-consumer alert
    # quote. Deleted after TALLY_RETAIN_RUNS_DAYS, the pipeline was restarted into the same bad record.
    settings.TALLY_RETAIN_RUNS_DAYS = 30
    halted = Pipeline.objects.create(name="halted", topic="t", sink_table="s", epoch=3,
                                     desired_state=DesiredState.RUNNING)
    older = ConsumerRun.objects.create(pipeline=halted, epoch=2, host="h", pid=1, state=RunState.STOPPED,
                                       started_at=ago(80), heartbeat_at=ago(70), ended_at=ago(70))
    peer = ConsumerRun.objects.create(pipeline=halted, epoch=3, host="h", pid=2, state=RunState.STOPPED,
                                      started_at=ago(62), heartbeat_at=ago(60), ended_at=ago(60))
    failed = ConsumerRun.objects.create(pipeline=halted, epoch=3, host="h", pid=3, state=RunState.FAILED,
                                        started_at=ago(61), heartbeat_at=ago(60), ended_at=ago(60),
                                        end_reason="bad_record: offset 7")
    stopped = Pipeline.objects.create(name="stopped", topic="t", sink_table="s", epoch=9)
    last = ConsumerRun.objects.create(pipeline=stopped, epoch=8, host="h", pid=4, state=RunState.STOPPED,
                                      started_at=ago(400), heartbeat_at=ago(399), ended_at=ago(399))
    before = ConsumerRun.objects.create(pipeline=stopped, epoch=7, host="h", pid=5, state=RunState.STOPPED,
                                        started_at=ago(500), heartbeat_at=ago(499), ended_at=ago(499))

    assert retention.apply(now=NOW)["runs"] == 2

    assert set(ConsumerRun.objects.values_list("pk", flat=True)) == {peer.pk, failed.pk, last.pk}
    assert not ConsumerRun.objects.filter(pk__in=[older.pk, before.pk]).exists()
    assert halted.halted_run() == failed
    assert [c["past_retention"] for c in retention.counts(now=NOW) if c["name"] == "runs"] == [0]


def test_the_action_log_of_the_last_n_days_is_never_deleted(pipeline, settings):
    settings.TALLY_RETAIN_ACTION_LOG_DAYS = 730
    entries = {days: ActionLog.objects.create(pipeline=pipeline, action="restart", actor="cli", created_at=ago(days))
               for days in (0, 400, 729.9, 730.1, 2000)}

    assert retention.apply(now=NOW)["action_log"] == 2

    assert set(ActionLog.objects.values_list("pk", flat=True)) == {entries[d].pk for d in (0, 400, 729.9)}


def test_replayed_dead_letters_go_and_discarded_ones_keep_their_offset_but_lose_their_payload(pipeline, settings):
    settings.TALLY_RETAIN_DEAD_LETTERS_DAYS = 90
    old_replay = DeadLetterReplay.objects.create(pipeline=pipeline, dead_letter_id=1, partition=0, offset=1,
                                                 source="stored", rows_written=1, original_error="e", actor="a",
                                                 replayed_at=ago(91))
    new_replay = DeadLetterReplay.objects.create(pipeline=pipeline, dead_letter_id=2, partition=0, offset=2,
                                                 source="stored", rows_written=1, original_error="e", actor="a",
                                                 replayed_at=ago(89))
    discarded = DeadLetter.objects.create(pipeline=pipeline, partition=0, offset=3, value=b"bad", error="e",
                                          discarded_at=ago(91), discard_reason="junk")
    pending = DeadLetter.objects.create(pipeline=pipeline, partition=0, offset=4, value=b"bad", error="e",
                                        created_at=ago(400))

    done = retention.apply(now=NOW)

    assert (done["dead_letter_replays"], done["discarded_dead_letter_payloads"]) == (1, 1)
    assert list(DeadLetterReplay.objects.values_list("pk", flat=True)) == [new_replay.pk]
    assert not DeadLetterReplay.objects.filter(pk=old_replay.pk).exists()
    discarded.refresh_from_db()
    pending.refresh_from_db()
    assert (discarded.offset, discarded.discard_reason, discarded.value) == (3, "junk", None)
    assert bytes(pending.value) == b"bad"
    assert retention.apply(now=NOW)["discarded_dead_letter_payloads"] == 0   # idempotent


def test_finished_topic_checks_go_and_unfinished_ones_stay(pipeline, settings):
    settings.TALLY_RETAIN_TOPIC_CHECKS_DAYS = 90

    def job(status, finished_days):
        return TopicCheckJob.objects.create(pipeline=pipeline, topic="t", group_id="g", table="s", key_column="id",
                                            status=status, created_at=ago(200),
                                            finished_at=ago(finished_days) if finished_days is not None else None)

    gone = [job(TopicCheckStatus.DONE, 91), job(TopicCheckStatus.FAILED, 100)]
    kept = [job(TopicCheckStatus.DONE, 10), job(TopicCheckStatus.RUNNING, None), job(TopicCheckStatus.QUEUED, None)]

    assert retention.apply(now=NOW)["topic_checks"] == 2

    assert set(TopicCheckJob.objects.values_list("pk", flat=True)) == {j.pk for j in kept}
    assert not TopicCheckJob.objects.filter(pk__in=[j.pk for j in gone]).exists()


def test_resolved_alerts_and_ended_mutes_go_and_open_alerts_stay_whatever_their_age(pipeline, settings):
    settings.TALLY_RETAIN_ALERTS_DAYS = 180
    rule = AlertRule.objects.create(name="loss", kind=RuleKind.LOST, pipeline=pipeline)

    def alert(state, started_days, resolved_days=None):
        return Alert.objects.create(rule=rule, pipeline=pipeline, state=state, summary="s", facts={},
                                    started_at=ago(started_days), last_seen_at=ago(started_days),
                                    resolved_at=ago(resolved_days) if resolved_days is not None else None)

    old = alert(AlertState.RESOLVED, 300, 181)
    recent = alert(AlertState.RESOLVED, 300, 179)
    firing = alert(AlertState.FIRING, 400)
    Mute.objects.create(rule=rule, pipeline=pipeline, until=ago(181))
    kept_mute = Mute.objects.create(rule=rule, pipeline=pipeline, until=ago(-1))

    assert alert_retention.apply(now=NOW) == {"alerts": 1, "mutes": 1, "notifications": 0}

    assert set(Alert.objects.values_list("pk", flat=True)) == {recent.pk, firing.pk}
    assert not Alert.objects.filter(pk=old.pk).exists()
    assert list(Mute.objects.values_list("pk", flat=True)) == [kept_mute.pk]


def test_an_alert_firing_for_months_keeps_its_recent_reminders_not_every_one_it_ever_sent(pipeline, settings):
    # A loss nobody acknowledges stays firing, reminded hourly by default: 24 messages a day per receiver, each with
    # its rendered bodies, kept while the alert is open. Past TALLY_RETAIN_ALERTS_DAYS the reminders sent go; the
    # "fired" message stays, and so does each channel's newest message (it is how a resolve finds who heard it).
    settings.TALLY_RETAIN_ALERTS_DAYS = 180
    rule = AlertRule.objects.create(name="loss", kind=RuleKind.LOST, pipeline=pipeline)
    firing = Alert.objects.create(rule=rule, pipeline=pipeline, state=AlertState.FIRING, summary="s", facts={},
                                  started_at=ago(400), last_seen_at=ago(0))
    slack = Channel.objects.create(name="ops", kind=ChannelKind.WEBHOOK, url="https://hooks.example/x")
    added_later = Channel.objects.create(name="late", kind=ChannelKind.WEBHOOK, url="https://hooks.example/y")

    def message(kind, sequence, days, channel=None, delivered=True):
        return Notification.objects.create(
            alert=firing, channel=channel, kind=kind, sequence=sequence, subject="s", body_text="t", body_html="h",
            created_at=ago(days), next_attempt_at=ago(days), delivered_at=ago(days) if delivered else None)

    fired = [message(NotificationKind.FIRED, 0, 400), message(NotificationKind.FIRED, 0, 400, slack)]
    old = [message(NotificationKind.REMINDER, n, 400 - n) for n in range(1, 200)]
    old += [message(NotificationKind.REMINDER, n, 400 - n, slack) for n in range(1, 200)]
    only_heard = message(NotificationKind.REMINDER, 5, 395, added_later)     # its only message: the resolve needs it
    undelivered = message(NotificationKind.REMINDER, 200, 200, slack, delivered=False)   # still in the outbox
    recent = [message(NotificationKind.REMINDER, 300, 100), message(NotificationKind.REMINDER, 300, 100, slack)]

    assert alert_retention.apply(now=NOW)["notifications"] == len(old)

    assert set(Notification.objects.values_list("pk", flat=True)) == {
        n.pk for n in [*fired, only_heard, undelivered, *recent]}
    assert list(routed_channels(firing, NotificationKind.RESOLVED)) == [slack, added_later]
    assert alert_retention.apply(now=NOW)["notifications"] == 0


def test_the_admin_page_counts_each_kind_and_what_is_past_retention(pipeline, admin_client, settings):
    settings.TALLY_RETAIN_RUNS_DAYS = 30
    run(pipeline, ended_days=31, heartbeat_days=31)
    run(pipeline, ended_days=1, heartbeat_days=1)

    page = admin_client.get("/admin/consumers/history/")

    assert page.status_code == 200
    html = page.content.decode()
    row = html[html.index('data-kind="TALLY_RETAIN_RUNS_DAYS"'):]
    row = row[:row.index("</tr>")]
    assert '<td class="rows">2</td>' in row and '<td class="past">1</td>' in row and "30 days" in row
    assert 'data-kind="TALLY_RETAIN_ALERTS_DAYS"' in html and 'id="ledger-facts"' in html
    assert "History and retention" in admin_client.get("/admin/").content.decode()


def test_settings_refuse_an_action_log_kept_shorter_than_what_it_audits():
    env = {"TALLY_DEVELOPMENT": "1", "TALLY_RETAIN_ACTION_LOG_DAYS": "10", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = "
                             "'tally.settings'; django.setup()"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1 and "TALLY_RETAIN_ACTION_LOG_DAYS must be at least" in result.stderr


def test_the_ledger_row_count_is_the_estimate_once_analysed_and_a_count_before(pipeline):
    for first in range(0, 50, 10):
        BatchLedger.objects.create(pipeline=pipeline, partition=0, first_offset=first, end_offset=first + 10,
                                   records=10, rows_written=10, epoch=1)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE consumers_batchledger")   # counts this transaction's own rows
    assert {k: ledger_facts()[k] for k in ("rows", "estimated")} == {"rows": 5, "estimated": True}
    with connection.cursor() as cursor:   # a table PostgreSQL never analysed (rolled back with the test)
        cursor.execute("UPDATE pg_class SET reltuples = -1 WHERE oid = 'consumers_batchledger'::regclass")
    assert {k: ledger_facts()[k] for k in ("rows", "estimated", "at_least")} == \
        {"rows": 5, "estimated": False, "at_least": False}


def test_expired_sessions_and_sign_ins_older_than_the_action_log_go(settings):
    from axes.models import AccessLog
    from django.contrib.sessions.models import Session

    settings.TALLY_RETAIN_ACTION_LOG_DAYS = 730
    Session.objects.create(session_key="expired", session_data="", expire_date=ago(1))
    Session.objects.create(session_key="current", session_data="", expire_date=ago(-1))
    for days in (731, 729):
        AccessLog.objects.filter(pk=AccessLog.objects.create(username="ada", ip_address="127.0.0.1").pk).update(
            attempt_time=ago(days))

    done = retention.apply(now=NOW)

    assert (done["expired_sessions"], done["sign_ins"]) == (1, 1)
    assert list(Session.objects.values_list("session_key", flat=True)) == ["current"]
    assert [row.attempt_time for row in AccessLog.objects.all()] == [ago(729)]


def test_expired_api_tokens_go_and_live_ones_stay(django_user_model):
    # knox deletes an expired token only when it is sent again: one a script stopped using stayed for good.
    from knox.models import AuthToken

    user = django_user_model.objects.create_user("ada")
    expired, _ = AuthToken.objects.create(user=user, expiry=timedelta(days=1))
    live, _ = AuthToken.objects.create(user=user, expiry=timedelta(days=1))
    AuthToken.objects.filter(pk=expired.pk).update(expiry=ago(1))
    AuthToken.objects.filter(pk=live.pk).update(expiry=ago(-1))

    assert retention.apply(now=NOW)["expired_api_tokens"] == 1

    assert list(AuthToken.objects.values_list("pk", flat=True)) == [live.pk]
