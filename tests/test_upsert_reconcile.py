"""Reconciliation of an upsert pipeline: records overwritten by a later record of their key are superseded, not
lost; a key whose row does not hold its latest record, or a deleted key that has a row again, is lost; the trace
says which record wrote the current row."""
import json

import pytest
from django.db import connection
from psycopg2 import sql

from consumers.engine.python import run_pipeline
from consumers.models import ActionLog, ActionResult, PartitionOffset, Pipeline
from consumers.reconciliation.reconcile import reconcile_pipeline
from consumers.reconciliation.trace import trace
from tests.commands import run_command
from tests.conftest import drop_sink_tables
from tests.producing import send

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

# key, value (None: a tombstone); offsets 0..7 in one partition
RECORDS = [(1, "new"), (2, "new"), (1, "paid"), (3, "new"), (2, None), (1, "sent"), (4, "new"), (3, "paid")]


def keyed_statuses(records):
    """(key, status) pairs as keyed JSON records; a status of None is the key's tombstone."""
    return [(None, str(key).encode(), None if status is None else json.dumps({"status": status}).encode())
            for key, status in records]


@pytest.fixture
def keyed(make_topic):
    topic = make_topic("keyed", partitions=1)
    send(topic, keyed_statuses(RECORDS))
    table = f"state_{topic}".replace("-", "_")
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, status text NOT NULL, source_topic text "
                            "NOT NULL, source_partition integer NOT NULL, source_offset bigint NOT NULL)")
                    .format(sql.Identifier(table)).as_string(cur.cursor))
    Pipeline.objects.create(name=topic, topic=topic, sink_table=table, transform="json", json_map={"id": "@key"},
                            upsert_key=["id"], delete_on_tombstone=True)
    result = run_pipeline(topic, stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "caught_up", result.detail
    yield Pipeline.objects.get(name=topic)
    drop_sink_tables([table])


def execute(statement: str, table: str, params=()):
    """`statement` with `{}` for the sink table, quoted by psycopg2.sql."""
    with connection.cursor() as cur:
        cur.execute(sql.SQL(statement).format(sql.Identifier(table)).as_string(cur.cursor), params)


@pytest.mark.parametrize("kafka_client", ["kafka-python", "librdkafka"], indirect=True)
def test_superseded_records_are_not_lost_and_the_table_holds_each_keys_last_record(kafka_client, keyed):
    report = reconcile_pipeline(keyed)
    part = report.partitions[0]
    assert report.exact and part.lost == 0, report.as_json()
    # 8 records: 3 keys hold their last record (1 at 5, 3 at 7, 4 at 6), key 2 was deleted (4), 4 superseded.
    assert (part.superseded, part.deleted) == (4, 1)
    with connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT id, status, source_offset FROM {} ORDER BY id")
                    .format(sql.Identifier(keyed.sink_table)).as_string(cur.cursor))
        assert cur.fetchall() == [(1, "sent", 5), (3, "paid", 7), (4, "new", 6)]


def test_a_row_that_lost_its_last_record_or_a_deleted_key_back_is_reported_lost(keyed):
    execute("UPDATE {} SET status = 'paid', source_offset = 2 WHERE id = 1", keyed.sink_table)
    execute("INSERT INTO {} VALUES (2, 'new', %s, 0, 1)", keyed.sink_table, [keyed.topic])
    execute("DELETE FROM {} WHERE id = 4", keyed.sink_table)
    report = reconcile_pipeline(keyed, full=True)
    lost = sorted(f.start for f in report.partitions[0].findings if f.kind == "lost")
    assert report.lost == 3 and lost == [4, 5, 6] and not report.exact


def test_the_trace_says_which_record_wrote_the_current_row_and_what_superseded_an_older_one(keyed):
    current = trace(keyed, 0, 5)
    assert current.verdict == "written" and current.rows[0]["source_offset"] == 5
    older = trace(keyed, 0, 2)
    assert older.verdict == "superseded" and "offset 5" in older.explanation
    deleted = trace(keyed, 0, 1)
    assert deleted.verdict == "superseded" and "deleted" in deleted.explanation and "offset 4" in deleted.explanation
    # The ledger says which record wrote the current row: the batch that committed offset 5, and the row itself.
    writer = older.current_row
    assert (writer["partition"], writer["offset"], writer["row"]["status"]) == (0, 5, "sent")
    assert [(b["first_offset"] <= 5 < b["end_offset"]) for b in writer["batches"]] == [True]
    assert current.current_row is None and deleted.current_row is None


def test_every_trace_door_names_the_record_and_ledger_batch_that_wrote_the_current_row(keyed, capsys, operator_client):
    code, out, _ = run_command(capsys, "trace", keyed.name, "--partition", "0", "--offset", "2")
    assert code == 0 and "SUPERSEDED" in out and "current row of its key: written by partition 0 offset 5, in " \
        "ledger batch" in out
    api = operator_client.get(f"/api/pipelines/{keyed.name}/trace", {"partition": 0, "offset": 2}).json()
    assert api["current_row"]["offset"] == 5 and api["current_row"]["batches"][0]["first_offset"] <= 5
    page = operator_client.get(f"/pipelines/{keyed.name}/trace/", {"partition": 0, "offset": 2}).content.decode()
    assert "Current row of its key" in page and "written by partition 0, offset 5" in page


def state(pipeline):
    with connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT id, status, source_offset FROM {} ORDER BY id")
                    .format(sql.Identifier(pipeline.sink_table)).as_string(cur.cursor))
        rows = cur.fetchall()
    positions = dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))
    return rows, positions, Pipeline.objects.get(pk=pipeline.pk).epoch


def test_a_rewind_that_rolls_back_an_upsert_sink_is_refused_at_every_door_and_changes_nothing(
        keyed, capsys, operator_client):
    before = state(keyed)
    for arguments in (["--execute"], []):  # the run and its preview
        code, _, err = run_command(capsys, "rewind", keyed.name, "--to-offset", "2", "--rollback-sink", *arguments)
        assert code == 1 and "roll back sink is refused for an upsert pipeline" in err
        assert "Rewind without roll back sink" in err
    response = operator_client.post(f"/api/pipelines/{keyed.name}/rewind", {"mode": "to-offset", "value": "2",
                                    "rollback_sink": True, "dry_run": False}, content_type="application/json")
    assert response.status_code == 409 and "upsert pipeline" in response.json()["error"]
    page = operator_client.post(f"/pipelines/{keyed.name}/rewind/", {"mode": "to-offset", "value": "2",
                                "rollback_sink": "on", "step": "execute"})
    assert page.status_code == 422 and "roll back sink is refused for an upsert pipeline" in page.content.decode()
    assert state(keyed) == before
    refusals = ActionLog.objects.filter(pipeline=keyed, action="rewind", result=ActionResult.REFUSED)
    assert refusals.count() == 4


def test_a_rewind_that_keeps_an_upsert_sink_applies_the_records_again_and_ends_exact(keyed, capsys):
    code, _, err = run_command(capsys, "rewind", keyed.name, "--to-offset", "2", "--execute")
    assert code == 0, err
    assert state(keyed)[1] == {0: 2}
    result = run_pipeline(keyed.name, stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "caught_up" and result.records == 6, result
    rows, positions, _ = state(keyed)
    assert rows == [(1, "sent", 5), (3, "paid", 7), (4, "new", 6)] and positions == {0: 8}
    report = reconcile_pipeline(Pipeline.objects.get(pk=keyed.pk), full=True)
    assert report.exact and report.lost == 0, report.as_json()


def sink_reads(table: str) -> int:
    """Scans of the table (sequential and index) so far, this backend's included: its pending statistics are
    flushed first (this backend is the one reconciliation used)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cur:  # a statement later: the flush has happened at the end of the previous one
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0) FROM pg_stat_user_tables "
                    "WHERE relid = %s::regclass", [sql.Identifier(table).as_string(cur.cursor)])
        return cur.fetchone()[0]


def test_an_idle_pass_does_not_read_the_upsert_table_and_a_moved_position_is_checked_again(keyed):
    assert reconcile_pipeline(keyed).exact
    before = sink_reads(keyed.sink_table)
    idle = reconcile_pipeline(keyed)
    assert idle.exact and sink_reads(keyed.sink_table) == before
    # A row Tally did not write, beyond the stored position: an idle pass keeps what the last look found ...
    execute("INSERT INTO {} VALUES (9, 'ghost', %s, 0, 20)", keyed.sink_table, [keyed.topic])
    assert reconcile_pipeline(keyed).phantom == 0
    # ... and the pass after new records looks again, and still tells superseded from lost.
    send(keyed.topic, keyed_statuses([(1, "closed"), (4, None), (1, "reopened")]))
    assert run_pipeline(keyed.name, stop_when_caught_up=True, max_seconds=60).reason == "caught_up"
    busy = reconcile_pipeline(keyed)
    part = busy.partitions[0]
    # Counts add up over passes: 4 superseded and 1 deleted before, 1 and 1 more now (offsets 8 and 9).
    assert (part.phantom, part.lost, part.superseded, part.deleted) == (1, 0, 5, 2), busy.as_json()
    assert reconcile_pipeline(keyed, full=True).phantom == 1
    execute("DELETE FROM {} WHERE id = 9", keyed.sink_table)
    assert reconcile_pipeline(keyed, full=True).exact


@pytest.mark.parametrize("batch_size", [None, 1])
def test_keys_postgresql_holds_equal_supersede_each_other_in_the_write_and_the_reconciliation(make_topic, batch_size):
    # citext: 'ann' and 'ANN' are one row, as PostgreSQL's equality says, and so is a tombstone of 'BOB' for 'bob'.
    # One record per batch stores what one batch does: the last record's spelling ('ANN'), not the first's.
    topic = make_topic("people", partitions=1)
    send(topic, keyed_statuses([("ann", "new"), ("ANN", "paid"), ("bob", "new"), ("BOB", None), ("carl", "new")]))
    table = f"people_{topic}".replace("-", "_")
    with connection.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS citext")
        cur.execute(sql.SQL("CREATE TABLE {} (name citext PRIMARY KEY, status text NOT NULL, source_topic text "
                            "NOT NULL, source_partition integer NOT NULL, source_offset bigint NOT NULL)")
                    .format(sql.Identifier(table)).as_string(cur.cursor))
    try:
        pipeline = Pipeline.objects.create(name=topic, topic=topic, sink_table=table, transform="json",
                                           json_map={"name": "@key"}, upsert_key=["name"], delete_on_tombstone=True)
        result = run_pipeline(topic, stop_when_caught_up=True, max_seconds=60, batch_size=batch_size)
        assert result.reason == "caught_up", result.detail
        with connection.cursor() as cur:
            cur.execute(sql.SQL("SELECT name, status, source_offset FROM {} ORDER BY name")
                        .format(sql.Identifier(table)).as_string(cur.cursor))
            assert cur.fetchall() == [("ANN", "paid", 1), ("carl", "new", 4)]
        part = reconcile_pipeline(pipeline, full=True).partitions[0]
        assert (part.lost, part.superseded, part.deleted) == (0, 2, 1), part
        older = trace(pipeline, 0, 0)
        assert older.verdict == "superseded" and "offset 1" in older.explanation
    finally:
        drop_sink_tables([table])
