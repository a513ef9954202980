"""Lists that read a long history newest first take their page from the top of an index, never from a sort of the
whole table (migrations 0027 and 0029): the action log, a pipeline's newest dead letters, the admin's runs list and
the topic checks. A sort of 200,000 action-log entries cost 262 ms a page, growing with the table. Plans are read
with sequential scans and sorts off (a test's few rows would rather be scanned and sorted): a Sort node then remains
only where no index gives the order."""
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from consumers.models import ActionLog, ConsumerRun, DeadLetter, Pipeline, RunState, TopicCheckJob
from dashboard import status

pytestmark = pytest.mark.django_db


def plan_of(sql: str, params=()) -> str:
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off")
        cur.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cur.fetchall())


def captured(action, table: str) -> tuple[str, tuple]:
    """The SQL of the first query `action` runs that reads `table` a page at a time."""
    with CaptureQueriesContext(connection) as queries:
        action()
    return next(q["sql"] for q in queries.captured_queries if f'FROM "{table}"' in q["sql"] and "LIMIT" in q["sql"]
                and "ORDER BY" in q["sql"]), ()


@pytest.fixture
def pipeline():
    return Pipeline.objects.create(name="kept", topic="t", sink_table="s")


def test_the_action_log_page_reads_its_newest_entries_from_an_index(pipeline, admin_client):
    for number in range(3):
        ActionLog.objects.create(actor="ann", action="rewind", pipeline=pipeline if number else None)
    assert "Sort" not in plan_of(*captured(lambda: admin_client.get("/action-log/"), "consumers_actionlog"))
    assert "Sort" not in plan_of(*captured(status.recent_actions, "consumers_actionlog"))


def test_a_pipelines_newest_dead_letters_are_read_from_an_index(pipeline):
    for offset in range(3):
        DeadLetter.objects.create(pipeline=pipeline, partition=0, offset=offset, error="bad")
    query = captured(lambda: status.recent_dead_letters(pipeline), "consumers_deadletter")
    assert "Sort" not in plan_of(*query)


def test_the_admins_runs_list_reads_its_page_from_an_index(pipeline, admin_client):
    now = timezone.now()
    for pid in range(3):
        ConsumerRun.objects.create(pipeline=pipeline, epoch=1, host="h", pid=pid, state=RunState.STOPPED,
                                   heartbeat_at=now, ended_at=now)
    answer = None

    def page():
        nonlocal answer
        answer = admin_client.get("/admin/consumers/consumerrun/")

    query = captured(page, "consumers_consumerrun")
    assert answer.status_code == 200
    assert "Sort" not in plan_of(*query)


@pytest.mark.parametrize("url", ["/topic-checks/", "/topic-checks/?pipeline=kept"])
def test_the_topic_checks_page_reads_the_newest_checks_from_an_index(pipeline, admin_client, url):
    for _ in range(3):
        TopicCheckJob.objects.create(pipeline=pipeline, topic="t", group_id="g", table="s", key_column="id")
    answer = None

    def page():
        nonlocal answer
        answer = admin_client.get(url)

    query = captured(page, "consumers_topiccheckjob")
    assert answer.status_code == 200 and answer.content.count(b"queued") >= 3
    assert "Sort" not in plan_of(*query)


def test_a_pipelines_delete_finds_its_topic_checks_through_the_one_index_on_their_pipeline(pipeline):
    """The foreign key has no index of its own (0031): the page's index leads with the column, and serves the
    lookup ON DELETE SET NULL makes."""
    TopicCheckJob.objects.create(pipeline=pipeline, topic="t", group_id="g", table="s", key_column="id")
    with connection.cursor() as cur:
        cur.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexdef LIKE %s",
                    [TopicCheckJob._meta.db_table, "%(pipeline_id%"])
        assert [name for (name,) in cur.fetchall()] == ["topic_check_pipeline_idx"]
    assert "topic_check_pipeline_idx" in plan_of("SELECT 1 FROM consumers_topiccheckjob WHERE pipeline_id = %s",
                                                 [pipeline.pk])
    pipeline.delete()
    assert TopicCheckJob.objects.get().pipeline is None


@pytest.mark.parametrize("url,table", [
    ("/admin/consumers/consumerrun/", "consumers_consumerrun"),
    ("/admin/consumers/batchledger/", "consumers_batchledger"),
    ("/admin/consumers/actionlog/", "consumers_actionlog"),
    ("/admin/consumers/deadletter/", "consumers_deadletter"),
    ("/admin/alerts/notification/", "dashboard_notification"),
])
def test_the_admins_history_lists_count_their_table_once_a_page(pipeline, admin_client, url, table):
    """The admin counts a list twice by default: the rows its filters keep, and the whole table again for "N of M
    selected". Over a history of millions of rows (a ledger, the runs) each count reads it all; the lists of history
    tables count once."""
    with CaptureQueriesContext(connection) as queries:
        assert admin_client.get(url).status_code == 200
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"] and f'FROM "{table}"' in q["sql"]]
    assert len(counts) == 1, counts


def test_the_names_of_deleted_pipelines_are_read_from_their_own_small_index(pipeline):
    """The action log's pipeline filter lists deleted pipelines by name, from their deletion entries: entries without
    a pipeline, which are most of a long log (group resets, watches, sign-ins refused). A partial index holds only
    the deletions, so the list reads those and not the log."""
    ActionLog.objects.create(actor="ann", action="delete", params={"pipeline": "gone"}, result="done")
    ActionLog.objects.create(actor="ann", action="reset_group", group_id="g")
    with CaptureQueriesContext(connection) as queries:
        assert ActionLog.objects.deleted_pipeline_names() == ["gone"]
    assert "action_deleted_pipeline_idx" in plan_of(queries.captured_queries[0]["sql"])
