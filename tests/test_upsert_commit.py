"""Upsert pipelines through the commit protocol against the real PostgreSQL: one row per key, the last record of
a batch wins, a tombstone deletes the key's row, the row's provenance names the record that wrote it, and it
all commits with the offsets or not at all."""
import json
import uuid

import pytest
from django.db import connection
from psycopg2 import sql

from consumers.engine import commit, db, upsert
from consumers.engine.faults import FaultInjector
from consumers.engine.transforms import SourceRecord
from consumers.models import DeadLetter, PartitionOffset, Pipeline

TABLE = "upsert_orders"


def rec(offset, key, value, partition=0):
    raw = None if value is None else json.dumps(value).encode()
    return SourceRecord(partition, offset, None if key is None else str(key).encode(), raw, 1_700_000_000_000)


@pytest.fixture
def keyed(transactional_db):
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (order_id bigint PRIMARY KEY, status text NOT NULL, amount numeric(8,2), "
                            "source_topic text NOT NULL, source_partition integer NOT NULL, "
                            "source_offset bigint NOT NULL)").format(sql.Identifier(TABLE)).as_string(cur.cursor))
    pipeline = Pipeline.objects.create(name="keyed", topic="orders", sink_table=TABLE, transform="json",
                                       json_map={"order_id": "@key"}, upsert_key=["order_id"],
                                       delete_on_tombstone=True, epoch=1)
    conn = db.connect()
    commit.ensure_positions(conn, pipeline.pk, {0: 0, 1: 0})
    yield pipeline, commit.Target.for_pipeline(pipeline), conn
    conn.close()
    with connection.cursor() as cur:
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(TABLE)).as_string(cur.cursor))


def table_rows():
    with connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT order_id, status, source_partition, source_offset FROM {} ORDER BY order_id")
                    .format(sql.Identifier(TABLE)).as_string(cur.cursor))
        return cur.fetchall()


def test_the_last_record_per_key_of_a_batch_wins_and_a_tombstone_deletes(keyed):
    pipeline, target, conn = keyed
    batch = [rec(0, 1, {"status": "new"}), rec(1, 2, {"status": "new"}), rec(2, 1, {"status": "paid"}),
             rec(3, 3, {"status": "new"}), rec(4, 2, None), rec(5, 3, None), rec(6, 3, {"status": "back"})]
    outcome = commit.commit_batch(conn, target, 1, {0: batch})[0]
    assert (outcome.records, outcome.dead_letters, outcome.end_offset) == (7, 0, 7)
    assert table_rows() == [(1, "paid", 0, 2), (3, "back", 0, 6)]


def test_later_batches_update_rows_in_place_and_delete_them_with_the_offsets(keyed):
    pipeline, target, conn = keyed
    commit.commit_batch(conn, target, 1, {0: [rec(0, 1, {"status": "new"}), rec(1, 2, {"status": "new"})]})
    commit.commit_batch(conn, target, 1, {0: [rec(2, 1, {"status": "shipped", "amount": 3.5}), rec(3, 2, None)]})
    assert table_rows() == [(1, "shipped", 0, 2)]
    assert PartitionOffset.objects.get(pipeline=pipeline, partition=0).next_offset == 4
    # A replay of what is committed changes nothing (exactly once: skipped below next_offset).
    outcome = commit.commit_batch(conn, target, 1, {0: [rec(0, 1, {"status": "new"}), rec(1, 2, {"status": "x"})]})
    assert outcome[0].skipped == 2 and table_rows() == [(1, "shipped", 0, 2)]


def test_a_bad_record_is_a_dead_letter_and_the_keys_previous_record_stands(keyed):
    pipeline, target, conn = keyed
    commit.commit_batch(conn, target, 1, {0: [rec(0, 1, {"status": "new"})]})
    commit.commit_batch(conn, target, 1, {0: [rec(1, 1, {"status": None}), rec(2, 5, {"status": "ok", "amount": "x"})]})
    assert table_rows() == [(1, "new", 0, 0)]
    errors = dict(DeadLetter.objects.filter(pipeline=pipeline).values_list("offset", "error"))
    assert "column status" in errors[1] and "column amount" in errors[2]


def test_a_keys_last_record_the_database_refuses_leaves_its_latest_record_the_database_takes(keyed):
    # The last record per key was chosen before the write; when PostgreSQL then refused it (a CHECK), the key's
    # earlier records of the batch had been dropped as superseded: the key lost them, or kept an older row than
    # record-by-record or smaller batches would give, and reconciliation reported the record lost.
    pipeline, target, conn = keyed
    with connection.cursor() as cur:
        cur.execute(sql.SQL("ALTER TABLE {} ADD CHECK (amount >= 0)").format(sql.Identifier(TABLE)).as_string(
            cur.cursor))
    commit.commit_batch(conn, target, 1, {0: [rec(0, 2, {"status": "old"})]})
    outcome = commit.commit_batch(conn, target, 1, {0: [
        rec(1, 1, {"status": "new", "amount": 1}), rec(2, 1, {"status": "paid", "amount": -1}),
        rec(3, 2, None), rec(4, 2, {"status": "back", "amount": -5}),
        rec(5, 3, {"status": "a"}), rec(6, 3, {"status": "b", "amount": -1}), rec(7, 3, {"status": "c", "amount": -2}),
        rec(8, 4, {"status": "only", "amount": -3})]})[0]
    assert (outcome.end_offset, outcome.dead_letters) == (9, 5)
    assert table_rows() == [(1, "new", 0, 1), (3, "a", 0, 5)]
    letters = DeadLetter.objects.filter(pipeline=pipeline)
    assert sorted(letters.values_list("offset", flat=True)) == [2, 4, 6, 7, 8]
    assert all("violates check constraint" in error for error in letters.values_list("error", flat=True))


def test_a_tombstone_whose_key_postgresql_refuses_is_a_dead_letter_and_the_other_keys_are_deleted(transactional_db):
    # The key's text goes to PostgreSQL's own parser (inet): a bad one refused the whole batch (a SinkError).
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE upsert_hosts (ip inet PRIMARY KEY, name text, source_topic text NOT NULL, "
                    "source_partition integer NOT NULL, source_offset bigint NOT NULL)")
    pipeline = Pipeline.objects.create(name="hosts", topic="hosts", sink_table="upsert_hosts", transform="json",
                                       json_map={"ip": "@key"}, upsert_key=["ip"], delete_on_tombstone=True, epoch=1)
    conn = db.connect()
    try:
        commit.ensure_positions(conn, pipeline.pk, {0: 0})
        target = commit.Target.for_pipeline(pipeline)
        commit.commit_batch(conn, target, 1, {0: [SourceRecord(0, 0, b"10.0.0.1", b'{"name": "a"}'),
                                                  SourceRecord(0, 1, b"10.0.0.2", b'{"name": "b"}')]})
        outcome = commit.commit_batch(conn, target, 1, {0: [SourceRecord(0, 2, b"nope", None),
                                                            SourceRecord(0, 3, b"10.0.0.1", None)]})[0]
        assert (outcome.end_offset, outcome.dead_letters) == (4, 1)
        with connection.cursor() as cur:
            cur.execute("SELECT host(ip) FROM upsert_hosts")
            assert cur.fetchall() == [("10.0.0.2",)]
        letter = DeadLetter.objects.get(pipeline=pipeline)
        assert (letter.offset, bytes(letter.key)) == (2, b"nope")
        assert "invalid input syntax for type inet" in letter.error
    finally:
        conn.close()
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS upsert_hosts")


def test_a_crash_mid_write_leaves_the_table_and_positions_as_they_were(keyed, monkeypatch):
    pipeline, target, conn = keyed
    commit.commit_batch(conn, target, 1, {0: [rec(0, 1, {"status": "new"})]})

    class Crash(Exception):
        pass

    faults = FaultInjector(at_pass={"mid-write": {1}})
    monkeypatch.setattr(faults, "maybe_crash", lambda point: (_ for _ in ()).throw(Crash()) if point == "mid-write"
                        else None)
    monkeypatch.setattr(faults, "armed", lambda point: point == "mid-write")
    with pytest.raises(Crash):
        commit.commit_batch(conn, target, 1, {0: [rec(1, 1, {"status": "paid"}), rec(2, 2, {"status": "new"}),
                                                  rec(3, 3, {"status": "new"})]}, faults)
    assert table_rows() == [(1, "new", 0, 0)]
    assert PartitionOffset.objects.get(pipeline=pipeline, partition=0).next_offset == 1


def test_last_per_key_keeps_record_order_including_deletes():
    rows = [(1, "a", "t", 0, 0), (2, "b", "t", 0, 1), (1, "c", "t", 0, 3)]
    deletes = [upsert.Delete((1,), "t", 0, 2), upsert.Delete((2,), "t", 0, 4)]
    kept, gone = upsert.last_per_key(rows, deletes, [0])
    assert kept == [(1, "c", "t", 0, 3)] and gone == [upsert.Delete((2,), "t", 0, 4)]
    assert upsert.last_per_key(rows[:2], [], [0]) == (rows[:2], [])


@pytest.mark.parametrize("key_type, first, second", [("citext", "Ann", "ANN"), ("char(5)", "ann", "ann  "),
                                                     ("numeric", 1, 1.0), ("text COLLATE tally_ci", "Ann", "ANN"),
                                                     ("varchar(9) COLLATE tally_ci", "Ann", "ANN"),
                                                     ("numeric", "1", "1.00"),
                                                     ("uuid", "5f1c0e4a-0b6d-4c3e-9a57-8d2f7a1b9c00",
                                                      "5F1C0E4A-0B6D-4C3E-9A57-8D2F7A1B9C00")])
def test_keys_postgresql_holds_equal_are_one_key_within_a_batch(transactional_db, key_type, first, second):
    # 'Ann' and 'ANN' differ in Python but are one citext row: ON CONFLICT cannot touch it twice in one statement.
    # So are they in a text key of a nondeterministic (case-insensitive) ICU collation: the catalog says which.
    with connection.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS citext")
        cur.execute("CREATE COLLATION IF NOT EXISTS tally_ci (provider = icu, locale = 'und-u-ks-level2', "
                    "deterministic = false)")
        cur.execute(f"CREATE TABLE upsert_people (name {key_type} PRIMARY KEY, status text, "
                    "source_topic text NOT NULL, source_partition integer NOT NULL, source_offset bigint NOT NULL)")
    pipeline = Pipeline.objects.create(name="people", topic="people", sink_table="upsert_people", transform="json",
                                       upsert_key=["name"], delete_on_tombstone=True, epoch=1)
    conn = db.connect()
    try:
        commit.ensure_positions(conn, pipeline.pk, {0: 0})
        target = commit.Target.for_pipeline(pipeline)
        batch = [SourceRecord(0, 0, None, json.dumps({"name": first, "status": "new"}).encode()),
                 SourceRecord(0, 1, None, json.dumps({"name": second, "status": "paid"}).encode())]
        outcome = commit.commit_batch(conn, target, 1, {0: batch})[0]
        assert (outcome.end_offset, outcome.dead_letters) == (2, 0)
        with connection.cursor() as cur:
            cur.execute("SELECT status, source_offset FROM upsert_people")
            assert cur.fetchall() == [("paid", 1)]
    finally:
        conn.close()
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS upsert_people")


@pytest.mark.parametrize("pg_type, values", [
    ("numeric", ["1", "1.0", "01.00", "-0", "0", "0.000", "2.50", "2.5", "-2.5", "10", "1.01", 1, 2]),
    ("uuid", [str(uuid.UUID(int=n)) for n in (1, 2, 1, 3, 2)]),
    ("bigint", [1, 2, 1, -1, 2**62]),
    ("text", ["a", "A", "a", "a ", ""])])
def test_keys_python_groups_are_the_groups_postgresql_makes(db, pg_type, values):
    # These types are grouped in Python (PostgreSQL takes about 12 µs a key): the groups must be PostgreSQL's own.
    keys = [(value,) for value in values]
    with connection.cursor() as wrapper:
        by_postgresql = upsert._firsts(keys, upsert._ranks(wrapper.cursor, [pg_type], keys))
        assert upsert._judged_in_python([pg_type], keys) is not None
        assert (upsert.same_keys(wrapper.cursor, [pg_type], keys) or {key: key for key in keys}) == by_postgresql


@pytest.mark.parametrize("batches", [[[0, 1, 2]], [[0], [1], [2]], [[0, 1], [2]]])
def test_the_stored_key_spelling_is_the_last_records_however_records_fall_into_batches(transactional_db, batches):
    # A new key took the last record's spelling within a batch ('ANN') but the first across batches ('ann'): ON
    # CONFLICT DO UPDATE left the key as it was, so the sink depended on batch boundaries.
    with connection.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS citext")
        cur.execute("CREATE TABLE upsert_people (name citext PRIMARY KEY, status text, source_topic text NOT NULL, "
                    "source_partition integer NOT NULL, source_offset bigint NOT NULL)")
    pipeline = Pipeline.objects.create(name="people", topic="people", sink_table="upsert_people", transform="json",
                                       upsert_key=["name"], epoch=1)
    records = [SourceRecord(0, offset, None, json.dumps({"name": name, "status": status}).encode())
               for offset, (name, status) in enumerate([("ann", "new"), ("Ann", "paid"), ("ANN", "shipped")])]
    conn = db.connect()
    try:
        commit.ensure_positions(conn, pipeline.pk, {0: 0})
        target = commit.Target.for_pipeline(pipeline)
        for offsets in batches:
            commit.commit_batch(conn, target, 1, {0: [records[offset] for offset in offsets]})
        with connection.cursor() as cur:
            cur.execute("SELECT name, status, source_offset FROM upsert_people")
            assert cur.fetchall() == [("ANN", "shipped", 2)]
    finally:
        conn.close()
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS upsert_people")


def test_a_table_whose_own_id_is_an_identity_takes_upserts_and_each_key_keeps_its_id(transactional_db):
    # The staging copy of the sink (LIKE ... INCLUDING DEFAULTS) kept the identity's NOT NULL without its sequence:
    # every record was a dead letter, 'null value in column "id" of relation "upsert_<table>"'.
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE upsert_accounts (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                    "account text NOT NULL UNIQUE, status text, source_topic text NOT NULL, "
                    "source_partition integer NOT NULL, source_offset bigint NOT NULL)")
    pipeline = Pipeline.objects.create(name="accounts", topic="accounts", sink_table="upsert_accounts",
                                       transform="json", json_map={"account": "@key"}, upsert_key=["account"], epoch=1)
    conn = db.connect()
    try:
        commit.ensure_positions(conn, pipeline.pk, {0: 0})
        target = commit.Target.for_pipeline(pipeline)
        commit.commit_batch(conn, target, 1, {0: [rec(0, "a", {"status": "new"}), rec(1, "b", {"status": "new"})]})
        outcome = commit.commit_batch(conn, target, 1, {0: [rec(2, "a", {"status": "paid"})]})[0]
        assert outcome.dead_letters == 0 and not DeadLetter.objects.exists()
        with connection.cursor() as cur:
            cur.execute("SELECT account, id, status, source_offset FROM upsert_accounts ORDER BY account")
            assert cur.fetchall() == [("a", 1, "paid", 2), ("b", 2, "new", 1)]
    finally:
        conn.close()
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS upsert_accounts")


def test_a_key_twice_in_one_batch_of_a_transform_with_a_fast_copy_path_keeps_its_last_record(transactional_db):
    """int_value COPYs a batch of plain integers verbatim; an upsert sink's rows are cut to the last per key first,
    so a key twice in one batch was a SinkError that failed the run."""
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE upsert_ints (id bigint PRIMARY KEY, source_topic text NOT NULL, "
                    "source_partition integer NOT NULL, source_offset bigint NOT NULL)")
    pipeline = Pipeline.objects.create(name="upsert-ints", topic="ints", sink_table="upsert_ints",
                                       transform="int_value", upsert_key=["id"], epoch=1)
    conn = db.connect()
    try:
        commit.ensure_positions(conn, pipeline.pk, {0: 0})
        target = commit.Target.for_pipeline(pipeline)
        batch = [SourceRecord(0, offset, None, value) for offset, value in enumerate([b"1", b"2", b"1"])]
        outcome = commit.commit_batch(conn, target, 1, {0: batch})[0]
        assert (outcome.records, outcome.dead_letters, outcome.end_offset) == (3, 0, 3)
        with connection.cursor() as cur:
            cur.execute("SELECT id, source_offset FROM upsert_ints ORDER BY id")
            assert cur.fetchall() == [(1, 2), (2, 1)]
        assert PartitionOffset.objects.get(pipeline=pipeline, partition=0).next_offset == 3
    finally:
        conn.close()
        with connection.cursor() as cur:
            cur.execute("DROP TABLE upsert_ints")
