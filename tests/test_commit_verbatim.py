"""The commit protocol's verbatim path (Transform.verbatim: int_value's plain integers written as COPY text,
no per-record call) against the real PostgreSQL: the same rows, dead letters and positions as the
record-by-record path, with kafka-python's own records as the Python engine passes them."""
import dataclasses

import pytest
from django.db import connection
from kafka.consumer.fetcher import ConsumerRecord
from psycopg2 import sql

from consumers.engine import commit, db, sinks
from consumers.engine.faults import FaultInjector
from consumers.engine.transforms import SourceRecord, resolve
from consumers.models import DeadLetter, DeliveryMode, PartitionOffset, Pipeline

INT_VALUE = resolve("int_value")


def polled(partition, values, first_offset=0):
    """Records as kafka-python's poll() returns them."""
    return [ConsumerRecord("nums", partition, -1, first_offset + i, 1_700_000_000_000 + i, 0, None, value, [], None,
                           -1, len(value or b""), -1) for i, value in enumerate(values)]


@pytest.fixture
def sink(transactional_db):
    made = []

    def make(name, id_type="bigint"):
        pipeline = Pipeline.objects.create(name=name, topic="nums", sink_table=f"sink_{name}".replace("-", "_"),
                                           delivery_mode=DeliveryMode.EXACTLY_ONCE, transform="int_value", epoch=1)
        with connection.cursor() as cur:
            sinks.ensure_sink_table(cur, pipeline.sink_table, INT_VALUE, exactly_once=True)
            if id_type != "bigint":  # a user's own table, narrower than the transform's column
                cur.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN id TYPE {}").format(
                    sql.Identifier(pipeline.sink_table), sql.SQL(id_type)))   # id_type: this file's own literals
        made.append(pipeline.sink_table)
        return pipeline, commit.Target.for_pipeline(pipeline)

    conn = db.connect()
    yield make, conn
    conn.close()
    with connection.cursor() as cur:
        for table in made:
            sinks.drop_sink_table(cur, table)


def stored_ids_and_provenance(table):
    with connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT id, source_topic, source_partition, source_offset FROM {} "
                            "ORDER BY source_partition, source_offset").format(sql.Identifier(table)))
        return cur.fetchall()


@pytest.mark.parametrize("values, verbatim", [
    ([b"1", b"22", b"-3", b"007", b"-0", b"999999999999999999"], True),
    ([b"1", b"+2"], False), ([b" 1"], False), ([b"1_000"], False), ([b"1", None], False), ([b""], False),
    ([b"1\n2"], False), ([b"1234567890123456789"], False), ([b"1", b"x"], False), ([b"\xff"], False),
])
def test_only_plain_decimal_integers_take_the_verbatim_path(values, verbatim):
    assert INT_VALUE.verbatim(values) is verbatim


@pytest.fixture
def verbatim_partitions(monkeypatch):
    """The partitions whose rows went the verbatim way."""
    taken, original = [], sinks.verbatim_copy_text

    def spy(values, offsets, topic, partition):
        taken.append(partition)
        return original(values, offsets, topic, partition)

    monkeypatch.setattr(sinks, "verbatim_copy_text", spy)
    return taken


def test_polled_records_are_written_as_the_record_by_record_path_writes_them(sink, verbatim_partitions):
    make, conn = sink
    values = [b"1", b"007", b"-0", b"-42", b"999999999999999999"]
    fast, fast_target = make("fast")
    slow, slow_target = make("slow")
    for pipeline in (fast, slow):
        commit.ensure_positions(conn, pipeline.pk, {0: 0, 1: 100})
    batch = {0: polled(0, values), 1: polled(1, values[:2], first_offset=100)}
    fetches = {0: commit.Fetch(0, 7), 1: commit.Fetch(100, 102)}   # partition 0 ends past a hole
    fast_outcomes = commit.commit_batch(conn, fast_target, 1, batch, fetches=fetches)
    assert verbatim_partitions == [0, 1]
    as_source = {p: [SourceRecord(r.partition, r.offset, r.key, r.value, r.timestamp) for r in records]
                 for p, records in batch.items()}
    slow_target = dataclasses.replace(slow_target, transform=dataclasses.replace(INT_VALUE, verbatim=None))
    slow_outcomes = commit.commit_batch(conn, slow_target, 1, as_source, fetches=fetches)
    assert stored_ids_and_provenance(fast.sink_table) == [(1, "nums", 0, 0), (7, "nums", 0, 1), (0, "nums", 0, 2),
                                          (-42, "nums", 0, 3), (999999999999999999, "nums", 0, 4),
                                          (1, "nums", 1, 100), (7, "nums", 1, 101)]
    assert stored_ids_and_provenance(slow.sink_table) == stored_ids_and_provenance(fast.sink_table)
    assert fast_outcomes == slow_outcomes == [commit.PartitionOutcome(0, 0, 7, 5, 5, 0, 0),
                                              commit.PartitionOutcome(1, 100, 102, 2, 2, 0, 0)]
    assert dict(PartitionOffset.objects.filter(pipeline=fast).values_list("partition", "next_offset")) == {0: 7, 1: 102}


def test_a_partition_with_one_bad_value_goes_record_by_record_and_dead_letters_it(sink, verbatim_partitions):
    make, conn = sink
    pipeline, target = make("mixed")
    commit.ensure_positions(conn, pipeline.pk, {0: 0, 1: 0})
    outcomes = commit.commit_batch(conn, target, 1, {0: polled(0, [b"1", b"two", b"3"]), 1: polled(1, [b"4"])})
    assert verbatim_partitions == [1]
    assert [(o.partition, o.rows_written, o.dead_letters) for o in outcomes] == [(0, 2, 1), (1, 1, 0)]
    assert stored_ids_and_provenance(pipeline.sink_table) == [(1, "nums", 0, 0), (3, "nums", 0, 2), (4, "nums", 1, 0)]
    dead = DeadLetter.objects.get(pipeline=pipeline)
    assert (dead.partition, dead.offset, bytes(dead.value)) == (0, 1, b"two") and "not an integer" in dead.error


def test_values_the_sinks_own_column_refuses_are_found_and_dead_lettered_with_the_databases_reason(sink):
    make, conn = sink
    pipeline, target = make("narrow", id_type="integer")
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    outcomes = commit.commit_batch(conn, target, 1, {0: polled(0, [b"1", b"3000000000", b"3"])})
    assert (outcomes[0].rows_written, outcomes[0].dead_letters) == (2, 1)
    assert stored_ids_and_provenance(pipeline.sink_table) == [(1, "nums", 0, 0), (3, "nums", 0, 2)]
    dead = DeadLetter.objects.get(pipeline=pipeline)
    assert dead.offset == 1 and "database refused" in dead.error and "out of range" in dead.error


def test_a_crash_in_the_middle_of_the_verbatim_copy_leaves_nothing(sink, monkeypatch):
    make, conn = sink
    pipeline, target = make("midwrite")
    commit.ensure_positions(conn, pipeline.pk, {0: 0})

    class Crashed(Exception):
        pass

    faults = FaultInjector.parse(["mid-write"])
    written_before_crash = []

    def crash(point):
        if faults.armed(point):
            with conn.cursor() as cur:   # the first half is in the open transaction
                cur.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(pipeline.sink_table)))
                written_before_crash.append(cur.fetchone()[0])
            raise Crashed(point)

    monkeypatch.setattr(faults, "maybe_crash", crash)
    with pytest.raises(Crashed):
        commit.commit_batch(conn, target, 1, {0: polled(0, [b"%d" % i for i in range(10)])}, faults)
    assert written_before_crash == [5]
    assert stored_ids_and_provenance(pipeline.sink_table) == []
    assert PartitionOffset.objects.get(pipeline=pipeline, partition=0).next_offset == 0
