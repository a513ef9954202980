"""`manage.py watch create|list|show|delete|check`: one validation, refusals that name what is wrong (nothing
written), exit codes 0 clean / 1 findings or refused / 2 usage, and `check --json`'s fields."""
import json
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from psycopg2 import sql

from consumers.models import RANGES_SHOWN, ActionLog, Watch, WatchPartition, WatchRange
from tests.commands import run_command
from tests.watch_helpers import produce

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def team_table(transactional_db):
    """A table a team's consumer writes: id bigint, part integer, off bigint, note text, flag boolean."""
    name = f"team_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (id bigint, part integer, off bigint, note text, flag boolean)").format(
            sql.Identifier(name)).as_string(cur.cursor))
    yield name
    with connection.cursor() as cur:
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)).as_string(cur.cursor))


def insert(table, rows):
    with connection.cursor() as cur:
        for row in rows:
            cur.execute(sql.SQL("INSERT INTO {} (id, part, off) VALUES (%s, %s, %s)").format(
                sql.Identifier(table)).as_string(cur.cursor), row)


def refused(capsys, *argv):
    code, out, err = run_command(capsys, "watch", *argv)
    assert code == 1 and "Refused" in err and Watch.objects.count() == 0, (code, out, err)
    return err


def test_refusals_name_the_missing_table_column_and_the_type_that_cannot_match(make_topic, team_table, capsys):
    topic = make_topic("nums")
    base = ["create", "w", "--group", "g", "--topic", topic]
    assert "table 'nope' does not exist" in refused(capsys, *base, "--sink-table", "nope", "--record-id", "value",
                                                    "--row-id", "id")
    assert "has no column 'ident'" in refused(capsys, *base, "--sink-table", team_table, "--record-id", "value",
                                              "--row-id", "ident")
    err = refused(capsys, *base, "--sink-table", team_table, "--record-id", "offset", "--row-id", "part,note")
    assert "column 'note'" in err and "text" in err and "cannot hold a partition or an offset" in err
    assert "column 'flag'" in refused(capsys, *base, "--sink-table", team_table, "--record-id", "json:id",
                                      "--row-id", "flag")
    assert "offset needs two columns" in refused(capsys, *base, "--sink-table", team_table, "--record-id", "offset",
                                                 "--row-id", "off")
    assert "two different columns" in refused(capsys, *base, "--sink-table", team_table, "--record-id", "offset",
                                              "--row-id", "part,part")
    assert "--record-id" in refused(capsys, *base, "--sink-table", team_table)
    assert "does not exist in Kafka" in refused(capsys, "create", "w", "--group", "g", "--topic", "no-such-topic")
    assert "unknown record id 'body'" in refused(capsys, *base, "--sink-table", team_table, "--record-id", "body",
                                                 "--row-id", "id")
    assert "SPEC=VALUE" in refused(capsys, *base, "--ignore", "heartbeat")
    assert "keyed needs a table" in refused(capsys, *base, "--keyed")
    assert "ISO date" in refused(capsys, *base, "--from", "yesterday")
    assert "no such cluster" in refused(capsys, *base, "--cluster", "elsewhere")
    assert not ActionLog.objects.filter(action="create_watch").exclude(result="refused").exists()   # refused only


def test_a_group_with_no_commits_is_allowed_and_said(make_topic, capsys):
    topic = make_topic("nums")
    code, out, err = run_command(capsys, "watch", "create", "quiet", "--group", "nobody", "--topic", topic)
    assert code == 0 and "has no commits on topic" in err and "lag and status only" in out
    assert Watch.objects.get(name="quiet").partitions.count() == 1


def test_a_watch_without_a_table_gives_lag_and_status_only(make_topic, capsys):
    topic = make_topic("nums", partitions=2)
    produce(topic, [(None, str(v).encode()) for v in range(1, 11)], partitions=2)
    assert run_command(capsys, "watch", "create", "lagonly", "--group", "g-none", "--topic", topic)[0] == 0
    code, out, err = run_command(capsys, "watch", "check", "lagonly", "--json")
    report = json.loads(out)
    assert code == 0
    assert set(report) == {"lost", "duplicated", "phantom", "checked", "lag", "status", "lost_offsets",
                           "duplicated_offsets", "notes", "error"}
    assert report["error"] is None
    assert (report["checked"], report["lost"], report["lag"]["records"]) == (0, 0, 10)
    assert report["status"] == "OK" and report["lag"]["seconds"] is not None
    assert not Watch.objects.get(name="lagonly").ranges.exists()


def test_check_json_gives_the_checks_notes_as_the_api_does(make_topic, team_table, capsys):
    from consumers.kafka import admin

    topic = make_topic("compacted", configs={"cleanup.policy": "compact"})
    produce(topic, [(b"k", b"1"), (b"k", b"2")])
    insert(team_table, [(1, 0, 0), (2, 0, 1)])
    admin.commit_offsets("team-group", topic, {0: 2})
    assert run_command(capsys, "watch", "create", "compacted", "--group", "team-group", "--topic", topic,
                       "--sink-table", team_table, "--record-id", "offset", "--row-id", "part,off")[0] == 0

    code, out, _ = run_command(capsys, "watch", "check", "compacted", "--settle-seconds", "0", "--json")

    notes = json.loads(out)["notes"]
    assert code == 0 and [n.startswith("compacted topic (cleanup.policy=compact)") for n in notes] == [True]
    assert notes == Watch.objects.get(name="compacted").last_notes


def test_check_exits_1_with_findings_and_lists_them_as_partition_and_offset(make_topic, team_table, capsys):
    from consumers.kafka import admin

    topic = make_topic("nums")
    produce(topic, [(None, str(v).encode()) for v in range(1, 6)])
    insert(team_table, [(1, 0, 0), (2, 0, 1), (2, 0, 1), (4, 0, 3), (5, 0, 4), (99, 0, 9)])   # 3 lost, 2 twice
    admin.commit_offsets("team-group", topic, {0: 5})
    assert run_command(capsys, "watch", "create", "byvalue", "--group", "team-group", "--topic", topic,
                       "--sink-table", team_table, "--record-id", "value", "--row-id", "id")[0] == 0
    assert run_command(capsys, "watch", "create", "byoffset", "--group", "team-group", "--topic", topic,
                       "--sink-table", team_table, "--record-id", "offset", "--row-id", "part,off")[0] == 0

    code, out, _ = run_command(capsys, "watch", "check", "byvalue", "--settle-seconds", "0", "--json")
    report = json.loads(out)
    assert code == 1
    assert report["lost_offsets"] == [{"partition": 0, "offset": 2}]
    assert report["duplicated_offsets"] == [{"partition": 0, "offset": 1}]
    assert (report["lost"], report["duplicated"], report["checked"]) == (1, 1, 5)

    code, out, _ = run_command(capsys, "watch", "check", "byoffset", "--settle-seconds", "0", "--json")
    by_offset = json.loads(out)
    assert code == 1 and by_offset["lost_offsets"] == [{"partition": 0, "offset": 2}]
    assert by_offset["phantom"] == 0   # the row at offset 9 is beyond the committed offset: not audited

    code, out, _ = run_command(capsys, "watch", "show", "byvalue", "--json")
    shown = json.loads(out)
    assert code == 0 and shown["ranges"][0]["lost_offsets"] == [2] and shown["ranges"][0]["end"] == 5
    code, out, _ = run_command(capsys, "watch", "list")
    assert code == 0 and "byvalue" in out and "byoffset" in out and "ERR" in out


def test_show_lists_the_newest_ranges_as_the_api_does_and_more_on_asking(capsys):
    # It listed every range: a watch with a finding at every check grows by thousands of ranges a day.
    watch = Watch.objects.create(name="busy", group_id="team", topic="orders")
    now = timezone.now()
    WatchRange.objects.bulk_create(WatchRange(watch=watch, partition=0, start=i, end=i + 1, records=1, lost=1,
                                              checked_at=now + timedelta(seconds=i)) for i in range(RANGES_SHOWN + 5))
    code, out, err = run_command(capsys, "watch", "show", "busy", "--json")
    starts = [r["start"] for r in json.loads(out)["ranges"]]
    assert code == 0 and (len(starts), min(starts)) == (RANGES_SHOWN, 5)
    assert f"the newest {RANGES_SHOWN} of {RANGES_SHOWN + 5} ranges; --limit N for more" in err
    code, out, err = run_command(capsys, "watch", "show", "busy", "--limit", "1000")
    assert code == 0 and out.count("lost 1") == RANGES_SHOWN + 5 and err == ""
    assert run_command(capsys, "watch", "show", "busy", "--limit", "0")[0] == 2


def test_a_clean_check_exits_0_and_an_idle_check_reads_nothing_new(make_topic, team_table, capsys):
    from consumers.kafka import admin

    topic = make_topic("nums")
    produce(topic, [(None, str(v).encode()) for v in range(1, 4)])
    insert(team_table, [(1, 0, 0), (2, 0, 1), (3, 0, 2)])
    admin.commit_offsets("clean-group", topic, {0: 3})
    run_command(capsys, "watch", "create", "clean", "--group", "clean-group", "--topic", topic, "--sink-table",
                team_table, "--record-id", "value", "--row-id", "id", "--settle-seconds", "0")
    assert run_command(capsys, "watch", "check", "clean")[0] == 0
    assert run_command(capsys, "watch", "check", "clean")[0] == 0
    watch = Watch.objects.get(name="clean")
    assert WatchPartition.objects.get(watch=watch).settled_offset == 3 and watch.ranges.count() == 1


def test_usage_errors_exit_2_and_delete_removes_the_watch_only(make_topic, team_table, capsys):
    topic = make_topic("nums")
    code, _, _ = run_command(capsys, "watch", "create", "w", "--topic", topic)
    assert code == 2
    assert run_command(capsys, "watch", "check", "missing")[0] == 1
    run_command(capsys, "watch", "create", "gone", "--group", "g", "--topic", topic)
    assert run_command(capsys, "watch", "delete", "gone")[0] == 0
    assert not Watch.objects.exists()
    assert ActionLog.objects.filter(action="delete_watch", params__watch="gone").exists()
    assert run_command(capsys, "watch", "delete", "gone")[0] == 1
    assert run_command(capsys, "watch", "create", "Bad Name", "--group", "g", "--topic", topic)[0] == 1
    assert run_command(capsys, "watch", "apply", "/nonexistent/watches.toml")[0] == 1
    refusals = ActionLog.objects.filter(result="refused").order_by("pk")
    assert [(r.action, r.params) for r in refusals] == [
        ("delete_watch", {"via": "cli", "name": "gone"}), ("create_watch", {"via": "cli", "name": "Bad Name"}),
        ("apply_watches", {"via": "cli", "file": "/nonexistent/watches.toml"})]
    assert "no watch named 'gone'" in refusals[0].message.lower() or "gone" in refusals[0].message


def test_a_watches_file_is_validated_whole_and_applied_once(make_topic, team_table, capsys, tmp_path):
    topic = make_topic("nums")
    good = tmp_path / "watches.toml"
    good.write_text(f"""
[watches.orders]
group = "orders-service"
topic = "{topic}"
sink_table = "{team_table}"
record_id = "value"
row_id = "id"
settle_seconds = 10
ignore = ["json:type=heartbeat"]

[watches.lag-only]
group = "reporting"
topic = "{topic}"
""")
    bad = tmp_path / "bad.toml"
    bad.write_text(good.read_text() + f"""
[watches.broken]
group = "g"
topic = "{topic}"
sink_table = "{team_table}"
record_id = "offset"
row_id = "part,note"
""")
    code, _, err = run_command(capsys, "watch", "apply", str(bad))
    assert code == 1 and "broken.row_id" in err and not Watch.objects.exists()   # nothing of the file applied
    code, out, _ = run_command(capsys, "watch", "apply", str(good))
    assert code == 0 and out.rstrip().endswith("created 2, 0 unchanged.") and "to create" not in out
    assert Watch.objects.get(name="orders").ignore == ["json:type=heartbeat"]
    code, out, _ = run_command(capsys, "watch", "apply", str(good))
    assert code == 0 and "created 0, 2 unchanged" in out
    good.write_text(good.read_text().replace("settle_seconds = 10", "settle_seconds = 20"))
    code, _, err = run_command(capsys, "watch", "apply", str(good))
    assert code == 1 and "settle_seconds 10 -> 20" in err


def test_a_watches_file_takes_start_from_as_a_toml_datetime_and_refuses_a_date_alone(make_topic, capsys, tmp_path):
    topic = make_topic("nums")
    path = tmp_path / "watches.toml"
    path.write_text(f"""
[watches.aware]
group = "g1"
topic = "{topic}"
start_from = 2020-01-02T03:04:05+01:00

[watches.local]
group = "g2"
topic = "{topic}"
start_from = 2020-01-02T03:04:05
""")
    code, out, err = run_command(capsys, "watch", "apply", str(path))
    assert code == 0, err
    assert Watch.objects.get(name="aware").start_from == "2020-01-02T03:04:05+01:00"
    assert Watch.objects.get(name="local").start_from == "2020-01-02T03:04:05+00:00"   # no offset: UTC
    code, out, _ = run_command(capsys, "watch", "apply", str(path))
    assert code == 0 and "unchanged aware" in out and "unchanged local" in out

    path.write_text(f'[watches.day]\ngroup = "g3"\ntopic = "{topic}"\nstart_from = 2020-01-02\n')
    code, _, err = run_command(capsys, "watch", "apply", str(path))
    assert code == 1 and "day.start_from: a date alone is not a start: write a date and time, e.g. " \
                         "2020-01-02T00:00:00Z" in err
    assert not Watch.objects.filter(name="day").exists()


class CleanupPolicy:
    """The watch's Kafka calls, with the topic's cleanup.policy as given (`None`: the broker refuses to describe
    the topic's configs, as a secured cluster without the DESCRIBE_CONFIGS ACL does). The embedded broker never
    compacts, so a compacted-away record is stood for by a transaction marker: read_committed, both are a
    position without a record."""

    def __init__(self, policy: str | None):
        from consumers.kafka import admin

        self.real, self.policy = admin.on(), policy

    def cleanup_policy(self, topic, *args, **kwargs):
        from kafka.errors import TopicAuthorizationFailedError

        if self.policy is None:
            raise TopicAuthorizationFailedError("DescribeConfigs refused")
        return self.policy

    def __getattr__(self, name):
        return getattr(self.real, name)


def offset_watch_with_a_row_at_a_hole(make_topic, team_table, name: str):
    """Offsets 0..2 committed in a transaction (its marker at 3), the group committed at 4 and a row at every
    offset 0..3: the row at 3 is where a consumer read a record that compaction removed since."""
    from consumers.kafka import admin
    from consumers.operations import watch_setup
    from tests.transactional_log import produce_transactions

    topic = make_topic(name)
    produce_transactions(topic, [([1, 2, 3], True)])
    insert(team_table, [(v, 0, v) for v in range(4)])
    group = f"{name}-group"
    admin.commit_offsets(group, topic, {0: 4})
    watch, _ = watch_setup.create(watch_setup.WatchSpec(name=name, group=group, topic=topic, sink_table=team_table,
                                                        record_id="offset", row_id="part,off", settle_seconds=0))
    return watch


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_a_row_at_a_hole_of_a_compacted_topic_is_not_a_phantom(make_topic, team_table, policy):
    from consumers.reconciliation import watch_audit

    watch = offset_watch_with_a_row_at_a_hole(make_topic, team_table, "compacted")
    report = watch_audit.check_watch(watch, kafka=CleanupPolicy(policy))
    assert (report.checked, report.lost, report.phantom, report.status) == (3, 0, 0, "OK")
    assert any("compacted" in note and f"cleanup.policy={policy}" in note for note in report.notes), report.notes


def test_a_row_at_a_hole_of_a_deleting_topic_is_a_phantom(make_topic, team_table):
    from consumers.reconciliation import watch_audit

    watch = offset_watch_with_a_row_at_a_hole(make_topic, team_table, "deleting")
    report = watch_audit.check_watch(watch, kafka=CleanupPolicy("delete"))
    assert (report.checked, report.phantom, report.status) == (3, 1, "ERR")


def test_a_refused_describe_configs_judges_no_hole_and_says_why(make_topic, team_table):
    from consumers.reconciliation import watch_audit

    watch = offset_watch_with_a_row_at_a_hole(make_topic, team_table, "refused")
    report = watch_audit.check_watch(watch, kafka=CleanupPolicy(None))
    assert (report.checked, report.lost, report.phantom, report.status, report.error) == (3, 0, 0, "OK", "")
    assert any("cleanup.policy could not be read" in note and "TopicAuthorizationFailedError" in note
               for note in report.notes), report.notes


def test_the_cleanup_policy_is_read_from_the_broker(make_topic):
    from consumers.kafka import admin

    compacted = make_topic("compacted", configs={"cleanup.policy": "compact,delete"})
    assert admin.cleanup_policy(compacted) == "compact,delete"
    assert admin.cleanup_policy(make_topic("plain")) == "delete"


@pytest.fixture
def describe_configs_refused(monkeypatch):
    """The broker refuses DescribeConfigs as Kafka does without the DESCRIBE_CONFIGS ACL: the request succeeds and
    the topic's result carries TOPIC_AUTHORIZATION_FAILED with no configs. Returns the requests sent, counted."""
    from kafka.future import Future
    from kafka.net.manager import KafkaConnectionManager
    from kafka.protocol.admin import DescribeConfigsRequest, DescribeConfigsResponse

    sent = []
    real = KafkaConnectionManager.send

    def send(manager, request, *args, **kwargs):
        if not isinstance(request, DescribeConfigsRequest):
            return real(manager, request, *args, **kwargs)
        sent.append(request)
        result = DescribeConfigsResponse.DescribeConfigsResult
        return Future().success(DescribeConfigsResponse(throttle_time_ms=0, results=[
            result(error_code=29, error_message="Topic authorization failed.", resource_type=resource_type,
                   resource_name=name, configs=[]) for resource_type, name, _ in request.resources]))

    monkeypatch.setattr(KafkaConnectionManager, "send", send)
    return sent


def test_a_refused_cleanup_policy_is_asked_once_and_raises(make_topic, describe_configs_refused):
    from kafka.errors import TopicAuthorizationFailedError

    from consumers.kafka import admin

    compacted = make_topic("compacted", configs={"cleanup.policy": "compact"})
    with pytest.raises(TopicAuthorizationFailedError):
        admin.cleanup_policy(compacted)
    assert len(describe_configs_refused) == 1


def test_a_check_the_broker_refuses_the_policy_judges_no_hole(make_topic, team_table, describe_configs_refused):
    from consumers.reconciliation import watch_audit

    watch = offset_watch_with_a_row_at_a_hole(make_topic, team_table, "secured")
    report = watch_audit.check_watch(watch)
    assert (report.checked, report.phantom, report.status, report.error) == (3, 0, "OK", ""), report.notes
    assert any("TopicAuthorizationFailedError" in note for note in report.notes), report.notes
    assert len(describe_configs_refused) == 1


def test_two_rows_at_a_hole_of_a_compacted_topic_are_a_duplicate(make_topic, team_table):
    """The consumer wrote the record compaction removed since twice: whatever that position held, one record at
    most was there, so the second row is a duplicate (the one phantom rule a compacted topic still allows)."""
    from consumers.reconciliation import watch_audit

    watch = offset_watch_with_a_row_at_a_hole(make_topic, team_table, "twice")
    insert(team_table, [(3, 0, 3)])
    report = watch_audit.check_watch(watch, kafka=CleanupPolicy("compact"))
    assert (report.checked, report.phantom, report.duplicated, report.status) == (3, 0, 1, "ERR")
    assert report.duplicated_offsets == [{"partition": 0, "offset": 3}]


def test_a_row_at_a_hole_compacted_before_the_policy_became_delete_is_not_a_phantom(make_topic, team_table):
    """The topic is compacted when the group commits past a record compaction then removes (its row stands at the
    hole); before that commit settled, the topic's cleanup.policy became `delete`. The hole was made while the
    topic compacted, so its row is no phantom. A hole written after the switch is judged again."""
    from consumers.kafka import admin
    from consumers.reconciliation import watch_audit
    from tests.transactional_log import produce_transactions

    watch = offset_watch_with_a_row_at_a_hole(make_topic, team_table, "switched")
    now = timezone.now()
    first = watch_audit.check_watch(watch, kafka=CleanupPolicy("compact"), settle_seconds=30, now=now)
    assert first.checked == 0   # the commit of 4 is not settled yet

    report = watch_audit.check_watch(watch, kafka=CleanupPolicy("delete"), settle_seconds=30,
                                     now=now + timedelta(seconds=30))
    assert (report.checked, report.lost, report.phantom, report.status) == (3, 0, 0, "OK"), report.notes
    assert any("compacted before" in note for note in report.notes), report.notes

    produce_transactions(watch.topic, [([4, 5, 6], True)])   # offsets 4..6, the marker at 7
    insert(team_table, [(v, 0, v) for v in range(4, 8)])
    admin.commit_offsets(watch.group_id, watch.topic, {0: 8})
    later = watch_audit.check_watch(watch, kafka=CleanupPolicy("delete"), settle_seconds=0,
                                    now=now + timedelta(seconds=60))
    assert (later.checked, later.phantom, later.status) == (6, 1, "ERR"), later.notes
