"""Poison values against the real PostgreSQL: values that pass the transform but that the database
refuses are found, dead-lettered with the database's error text, and the rest of the batch commits in the
same transaction; errors that are not about data refuse the batch as SinkError."""
import json
import uuid

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg2 import sql

from consumers.engine import commit, db, sinks
from consumers.engine.transforms import SourceRecord
from consumers.models import BadRecordPolicy, BatchLedger, DeadLetter, DeliveryMode, PartitionOffset
from tests.conftest import drop_sink_tables
from tests.pipelines import create_pipeline
from tests.sink_rows import sink_offsets

OVERFLOW = b"99999999999999999999"  # > 2^63: Python parses it, bigint refuses it (22003)


def event(id_, kind="k") -> bytes:
    # ensure_ascii keeps a lone surrogate as the escape "\ud800", which json.loads turns back into one.
    return json.dumps({"id": id_, "kind": kind}).encode()


@pytest.fixture
def make_target(transactional_db):
    made = []

    def make(transform="json_event", mode=DeliveryMode.EXACTLY_ONCE, **fields):
        pipeline = create_pipeline(f"poison-{len(made)}", "t", f"sink_poison_{len(made)}", transform, mode, epoch=1,
                                   **fields)
        made.append(pipeline)
        return pipeline, commit.Target.for_pipeline(pipeline)

    conn = db.connect()
    yield make, conn
    conn.close()
    drop_sink_tables(pipeline.sink_table for pipeline in made)


def batch(values, partition=0, start=0):
    return {partition: [SourceRecord(partition, start + i, None, v) for i, v in enumerate(values)]}


def test_poison_values_become_dead_letters_with_the_database_error_and_the_rest_commits(make_target):
    make, conn = make_target
    pipeline, target = make()
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    values = [event(1), event(10**20), event(3, "a\x00b"), event(4), event(5, "\ud800"), event(6)]
    [outcome] = commit.commit_batch(conn, target, 1, batch(values))
    assert (outcome.records, outcome.rows_written, outcome.dead_letters, outcome.end_offset) == (6, 3, 3, 6)
    assert sink_offsets(pipeline.sink_table) == [0, 3, 5]
    letters = {d.offset: d for d in DeadLetter.objects.filter(pipeline=pipeline)}
    assert sorted(letters) == [1, 2, 4]
    assert letters[1].error.startswith("database refused: 22003") and "out of range for type bigint" in letters[1].error
    assert letters[2].error.startswith("database refused: 22") and "0x00" in letters[2].error
    assert "surrogates not allowed" in letters[4].error
    assert bytes(letters[1].value) == values[1]  # the record itself, for replay after a fix
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 6
    ledger = BatchLedger.objects.get(pipeline=pipeline)
    assert (ledger.rows_written, ledger.dead_letters) == (3, 3)


def test_a_batch_of_nothing_but_poison_still_moves_the_position(make_target):
    make, conn = make_target
    pipeline, target = make("int_value")
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    [outcome] = commit.commit_batch(conn, target, 1, batch([OVERFLOW] * 5))
    assert (outcome.rows_written, outcome.dead_letters) == (0, 5)
    assert sink_offsets(pipeline.sink_table) == []
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 5


def test_a_multi_row_record_with_one_poison_row_is_dead_lettered_whole(make_target):
    make, conn = make_target
    pipeline, target = make("csv_ints")
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    [outcome] = commit.commit_batch(conn, target, 1, batch([b"1,2", b"3," + OVERFLOW + b",4", b"5"]))
    assert (outcome.rows_written, outcome.dead_letters) == (3, 1)
    assert sink_offsets(pipeline.sink_table) == [0, 0, 2]
    assert DeadLetter.objects.get(pipeline=pipeline).offset == 1


def test_poison_in_a_replay_after_a_rewind_is_found_too(make_target):
    make, conn = make_target
    pipeline, target = make("int_value")
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    commit.commit_batch(conn, target, 1, batch([b"1", b"2"]))
    PartitionOffset.objects.filter(pipeline=pipeline).update(next_offset=0, replay_until=2)
    [outcome] = commit.commit_batch(conn, target, 1, batch([b"1", b"2", OVERFLOW, b"4"]))
    assert (outcome.dead_letters, outcome.end_offset) == (1, 4)
    assert sink_offsets(pipeline.sink_table) == [0, 1, 3]


def test_the_stop_policy_refuses_the_batch_naming_the_record_and_the_database_reason(make_target):
    make, conn = make_target
    pipeline, target = make("int_value", on_bad_record=BadRecordPolicy.STOP)
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    with pytest.raises(commit.StopOnBadRecord, match=r"partition 0 offset 2: database refused: 22003 .*bigint"):
        commit.commit_batch(conn, target, 1, batch([b"1", b"2", OVERFLOW, b"4"]))
    assert sink_offsets(pipeline.sink_table) == [] and not DeadLetter.objects.exists()
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 0


@pytest.mark.parametrize("deferred", ["", " DEFERRABLE INITIALLY DEFERRED"], ids=["immediate", "deferred"])
def test_a_duplicate_of_the_tables_own_unique_key_or_a_missing_foreign_key_is_a_dead_letter(make_target, deferred):
    # A key of the table's own written twice (an at-least-once producer's duplicate) or a reference to a missing
    # row refused the whole batch as SinkError: the run ended and was not restarted. Deferred, the constraints were
    # checked at COMMIT, after the bisection had passed: the whole batch was refused the same way.
    make, conn = make_target
    pipeline, target = make("int_value")
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE poison_parent (id bigint PRIMARY KEY)")
        cur.execute("INSERT INTO poison_parent SELECT generate_series(1, 5)")
        cur.execute(sql.SQL("ALTER TABLE {} ADD UNIQUE (id)" + deferred + ", ADD FOREIGN KEY (id) REFERENCES "
                            "poison_parent (id)" + deferred).format(sql.Identifier(pipeline.sink_table))
                    .as_string(cur.cursor))
    try:
        [outcome] = commit.commit_batch(conn, target, 1, batch([b"1", b"2", b"1", b"9", b"3"]))
        assert (outcome.rows_written, outcome.dead_letters, outcome.end_offset) == (3, 2, 5)
        assert sink_offsets(pipeline.sink_table) == [0, 1, 4]
        letters = dict(DeadLetter.objects.filter(pipeline=pipeline).values_list("offset", "error"))
        assert letters[2].startswith("database refused: 23505") and letters[3].startswith("database refused: 23503")
        # A duplicate of the provenance key is not the record's: the table holds rows of the topic already.
        with connection.cursor() as cur:
            cur.execute(sql.SQL("INSERT INTO {} (id, source_topic, source_partition, source_offset) "
                                "VALUES (5, 't', 0, 5)").format(sql.Identifier(pipeline.sink_table)).as_string(
                cur.cursor))
        with pytest.raises(commit.SinkError, match="23505"):
            commit.commit_batch(conn, target, 1, batch([b"4"], start=5))
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE poison_parent CASCADE")


def test_a_row_an_exclusion_constraint_refuses_is_a_dead_letter(make_target):
    # Two bookings of one room (EXCLUDE ... WITH =, as with && on ranges): 23P01 refused the whole batch as SinkError,
    # and the run ended and was not restarted, where a unique key's duplicate is a dead letter.
    make, conn = make_target
    pipeline, target = make("int_value")
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    with connection.cursor() as cur:
        cur.execute(sql.SQL("ALTER TABLE {} ADD EXCLUDE USING btree (id WITH =)").format(
            sql.Identifier(pipeline.sink_table)).as_string(cur.cursor))
    [outcome] = commit.commit_batch(conn, target, 1, batch([b"1", b"2", b"1", b"3"]))
    assert (outcome.rows_written, outcome.dead_letters, outcome.end_offset) == (3, 1, 4)
    assert sink_offsets(pipeline.sink_table) == [0, 1, 3]
    letter = DeadLetter.objects.get(pipeline=pipeline)
    assert letter.offset == 2 and letter.error.startswith("database refused: 23P01 conflicting key value violates "
                                                          "exclusion constraint")


def test_a_missing_sink_table_is_a_sink_error_not_a_data_error(make_target):
    make, conn = make_target
    pipeline, target = make("int_value")
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    with connection.cursor() as cur:
        sinks.drop_sink_table(cur, pipeline.sink_table)
    with pytest.raises(commit.SinkError, match="42P01"):
        commit.commit_batch(conn, target, 1, batch([b"1", b"2"]))
    assert not DeadLetter.objects.exists() and not BatchLedger.objects.exists()
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 0


def test_permission_denied_is_a_sink_error(make_target):
    make, conn = make_target
    pipeline, target = make("int_value")
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    # Roles belong to the whole PostgreSQL cluster: a name of its own keeps parallel test runs apart.
    role = sql.Identifier(f"tally_readonly_{uuid.uuid4().hex[:8]}")
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE ROLE {}").format(role).as_string(cur.cursor))
        cur.execute(sql.SQL("GRANT SELECT, UPDATE ON consumers_pipeline, consumers_partitionoffset TO {}")
                    .format(role).as_string(cur.cursor))
    try:
        with conn.cursor() as cur:
            cur.execute(sql.SQL("SET ROLE {}").format(role))
        conn.commit()
        with pytest.raises(commit.SinkError, match="42501"):
            commit.commit_batch(conn, target, 1, batch([b"1"]))
    finally:
        with conn.cursor() as cur:
            cur.execute("RESET ROLE")
        conn.commit()
        with connection.cursor() as cur:
            cur.execute(sql.SQL("DROP OWNED BY {}").format(role).as_string(cur.cursor))
            cur.execute(sql.SQL("DROP ROLE {}").format(role).as_string(cur.cursor))


# Record values a careless or hostile producer sends: NUL, lone surrogates, numbers past bigint, empty,
# bytes that are not UTF-8, and ordinary integers.
record_values = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(lambda n: str(n).encode()),
    st.text(alphabet=st.characters(codec=None, categories=None), max_size=8).map(
        lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=8),
    st.just(b""),
    st.just(b"\x00"),
    st.builds(lambda n, kind: event(n, kind), st.integers(min_value=-(2**65), max_value=2**65),
              st.sampled_from(["", "ok", "a\x00b", "\ud800", "\udfff x", "é"])),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(record_values, min_size=1, max_size=12), st.sampled_from(["int_value", "json_event"]))
def test_every_record_value_ends_up_exactly_once_as_a_row_or_a_dead_letter(make_target, values, transform):
    make, conn = make_target
    pipeline, target = make(transform)
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    [outcome] = commit.commit_batch(conn, target, 1, batch(values))
    rows, letters = sink_offsets(pipeline.sink_table), list(
        DeadLetter.objects.filter(pipeline=pipeline).values_list("offset", flat=True))
    assert sorted(rows + letters) == list(range(len(values)))
    assert (outcome.rows_written, outcome.dead_letters) == (len(rows), len(letters))
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == len(values)
