"""Keyed watches read back what earlier checks settled from the first record as new as the oldest one judged, and
at most SETTLED_READ_LIMIT positions of a partition: a cut says where in the check's notes."""
import uuid
from types import SimpleNamespace

import pytest
from django.db import connection
from psycopg2 import sql

from consumers.kafka import admin
from consumers.operations import watch_setup
from consumers.reconciliation import watch_audit, watch_settled
from tests.watch_helpers import drop_tables, produce


def read_back(monkeypatch, newer_from: dict, settled: dict, limit: int = 100) -> tuple[dict, list]:
    monkeypatch.setattr(watch_settled, "SETTLED_READ_LIMIT", limit)
    monkeypatch.setattr(watch_settled.kafka_admin, "offsets_for_time",
                        lambda topic, partitions, ts, cluster=None: {p: newer_from.get(p) for p in partitions})
    notes: list[str] = []
    return watch_settled.windows(SimpleNamespace(topic="t", cluster="default"), settled, 1_700_000_000_000,
                                 notes), notes


def test_each_partition_is_read_back_from_its_first_record_as_new_as_the_oldest_judged(monkeypatch):
    spans, notes = read_back(monkeypatch, {0: 40, 1: 7, 2: None, 3: 90}, {0: (0, 50), 1: (10, 20), 2: (0, 5),
                                                                          3: (0, 90)})

    assert spans == {0: (40, 50), 1: (10, 20)} and notes == []   # 2: nothing that new; 3: only past its mark


def test_a_partition_far_ahead_is_read_back_to_the_limit_and_the_cut_is_noted(monkeypatch):
    spans, notes = read_back(monkeypatch, {0: 0, 1: 995}, {0: (0, 1000), 1: (0, 1000)})

    assert spans == {0: (900, 1000), 1: (995, 1000)}
    assert len(notes) == 1 and "offset 900 of partition 0 (not 0)" in notes[0]


def test_a_check_that_judges_no_record_reads_nothing_back(monkeypatch):
    monkeypatch.setattr(watch_settled.kafka_admin, "offsets_for_time", None)   # not asked

    assert watch_settled.windows(SimpleNamespace(topic="t", cluster="default"), {0: (0, 9)}, None, []) == {}


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_kafka_failing_to_say_where_to_read_back_fails_the_check_as_err_and_settles_nothing(make_topic, monkeypatch):
    """The lookup by time comes after the range was read: a leader moving in between (or a broker refusing the
    lookup) escaped the check, a 500 on the API's check and an unchanged OK in the periodic pass."""
    table = f"team_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (id text)").format(sql.Identifier(table)).as_string(cur.cursor))
        cur.execute(sql.SQL("INSERT INTO {} VALUES ('a'), ('b'), ('c')").format(sql.Identifier(table))
                    .as_string(cur.cursor))
    try:
        topic, group = make_topic("keyed"), f"keyed-{uuid.uuid4().hex[:6]}"
        produce(topic, [(b"k1", b"a"), (b"k2", b"b")])
        admin.commit_offsets(group, topic, {0: 2})
        watch, _ = watch_setup.create(watch_setup.WatchSpec(name="keyed", group=group, topic=topic, sink_table=table,
                                                            record_id="value", row_id="id", keyed=True,
                                                            settle_seconds=0))
        assert watch_audit.check_watch(watch).status == "OK"
        produce(topic, [(b"k3", b"c")])
        admin.commit_offsets(group, topic, {0: 3})

        def refused(*args, **kwargs):
            raise admin.KafkaAdminError("Kafka could not list offsets: UnsupportedForMessageFormatError")
        monkeypatch.setattr(admin, "offsets_for_time", refused)
        report = watch_audit.check_watch(watch)

        assert report.status == "ERR" and "settled records" in report.error and "UnsupportedForMessage" in report.error
        watch.refresh_from_db()
        assert watch.status == "ERR" and watch.last_error == report.error
        assert watch.partitions.get().settled_offset == 2
    finally:
        drop_tables(table)
