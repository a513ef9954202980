"""Reconciliation on logs with holes (transaction markers, aborted and compacted records), against the
real PostgreSQL with a stand-in for Kafka: a hole is never lost; lost means records the topic holds that
the sink lacks."""
import pytest
from django.db import connection

from consumers.engine import commit, db, sinks
from consumers.engine.transforms import SourceRecord, resolve
from consumers.models import DeliveryMode, PartitionHealth, Pipeline
from consumers.reconciliation import reconcile
from tests.conftest import drop_sink_tables
from tests.test_reconcile import FakeKafka, kinds, records, run_sql


class HolesKafka(FakeKafka):
    """A log whose data records sit at `data` offsets (everything else is a hole)."""

    def __init__(self, data: dict[int, set[int]], **kwargs):
        super().__init__(**kwargs)
        self.data = data
        self.asked = []

    def records_held(self, topic, partition, ranges):
        self.asked += ranges
        return [[o for o in sorted(self.data[partition]) if s <= o < e] for s, e in ranges]


# Three transactions of 5 and their markers: data at 0-4, 6-10, 12-16; markers at 5, 11, 17; end 18.
DATA = set(range(0, 5)) | set(range(6, 11)) | set(range(12, 17))


@pytest.fixture
def holes_setup(transactional_db):
    conn = db.connect()
    made = []

    def make(mode=DeliveryMode.EXACTLY_ONCE):
        pipeline = Pipeline.objects.create(name=f"h-{mode}", topic="nums", sink_table=f"holes_sink_{len(made)}",
                                           delivery_mode=mode, epoch=1)
        made.append(pipeline)
        with connection.cursor() as cur:
            sinks.ensure_sink_table(cur, pipeline.sink_table, resolve("int_value"), pipeline.is_exactly_once)
        target = commit.Target.for_pipeline(pipeline)

        def write(start, end):
            """One poll fetched from `start`, the consumer's position after it `end`."""
            if pipeline.is_exactly_once:
                commit.ensure_positions(conn, pipeline.pk, {0: start})
            offsets = [o for o in sorted(DATA) if start <= o < end]
            commit.commit_batch(conn, target, 1, {0: records(0, offsets)}, fetches={0: commit.Fetch(start, end)})

        return pipeline, write

    yield make
    conn.close()
    drop_sink_tables(pipeline.sink_table for pipeline in made)


def test_a_caught_up_exactly_once_pipeline_on_a_transactional_log_is_exact_with_lag_0(holes_setup):
    pipeline, write = holes_setup()
    write(0, 6)
    write(6, 12)
    write(12, 18)
    kafka = HolesKafka({0: DATA}, high={0: 18}, committed={0: 18})
    report = reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    assert (report.lost, report.duplicated, report.lag_records, report.status) == (0, 0, 0, "OK")
    assert report.exact and kafka.asked == []  # the ledger accounted for every hole: no read of the topic


def test_at_most_once_loss_across_markers_counts_only_the_records_the_topic_held(holes_setup):
    pipeline, write = holes_setup(DeliveryMode.AT_MOST_ONCE)
    write(0, 6)
    write(12, 18)  # [6, 12) was committed to Kafka and lost before the write: 5 records and a marker
    kafka = HolesKafka({0: DATA}, high={0: 18}, committed={0: 18})
    report = reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    assert report.lost == 5 and kinds(report, "lost") == [(6, 11, 5)]
    assert (5, 6, 1) in kinds(report, "hole") and (11, 12, 1) in kinds(report, "hole")
    assert kinds(report, "gap") == [(6, 12, 6)]
    assert report.lag_records == 0


def test_a_deleted_sink_row_is_lost_while_the_markers_around_it_stay_holes(holes_setup):
    pipeline, write = holes_setup()
    write(0, 6)
    write(6, 12)
    run_sql(f'DELETE FROM "{pipeline.sink_table}" WHERE source_offset = 7')  # fixed test table name
    report = reconcile.reconcile_pipeline(pipeline, kafka=HolesKafka({0: DATA}, high={0: 12}, committed={0: 12}))
    assert report.lost == 1 and kinds(report, "lost") == [(7, 8, 1)]
    assert not report.exact and report.status == "ERR"


def test_without_a_way_to_read_the_topic_absent_offsets_outside_the_ledger_count_as_lost(holes_setup):
    pipeline, write = holes_setup(DeliveryMode.AT_MOST_ONCE)
    write(0, 6)
    write(12, 18)
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 18}, committed={0: 18}))
    assert report.lost == 8  # conservative: every absent position, markers at 5, 11 and 17 included


def test_a_replayed_dead_letter_reopens_its_whole_batch_so_a_marker_below_the_log_start_stays_a_hole(holes_setup):
    """A replay moves the verified mark back to its letter's offset, inside a batch. Verified from there, the batch's
    ledger row was not whole, so the marker at 11 went to the topic read, where retention had deleted it: lost 1 on an
    exact sink. The mark now goes back to the batch's first offset, and the ledger's count decides."""
    from consumers.models import DeadLetter
    from consumers.operations import dead_letters

    pipeline, _ = holes_setup()
    conn = db.connect()
    try:
        commit.ensure_positions(conn, pipeline.pk, {0: 0})
        batch = [SourceRecord(0, o, None, b"bad" if o == 7 else str(o + 1).encode()) for o in sorted(DATA) if o < 12]
        commit.commit_batch(conn, commit.Target.for_pipeline(pipeline), 1, {0: batch}, fetches={0: commit.Fetch(0, 12)})
    finally:
        conn.close()
    kafka = HolesKafka({0: DATA}, high={0: 12}, committed={0: 12})
    assert reconcile.reconcile_pipeline(pipeline, kafka=kafka).exact
    kafka.log_start = {0: 12}   # retention deleted the old segments; nothing the pipeline still needs
    assert reconcile.reconcile_pipeline(pipeline, kafka=kafka).exact

    DeadLetter.objects.filter(pipeline=pipeline).update(value=b"8")   # the record, fixed
    result = dead_letters.replay(pipeline, list(DeadLetter.objects.values_list("pk", flat=True)), actor="otto")
    assert result.counts == {"replayed": 1}
    assert PartitionHealth.objects.get(pipeline=pipeline, partition=0).verified_offset == 0   # the batch's start

    report = reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    assert (report.lost, report.dead_lettered, report.status) == (0, 0, "OK") and report.exact


def test_a_rewind_into_a_batch_after_retention_leaves_its_markers_holes(holes_setup, monkeypatch):
    """A rewind trims the rows that reach past its new position; a trimmed row no longer holds it, so the mark
    goes back to the new position itself, not to the trimmed row's start (whose markers, below the log start, Kafka
    could no longer tell from lost records)."""
    from consumers.kafka import admin as kafka_admin
    from consumers.kafka.admin import Watermarks
    from consumers.operations.rewind import rewind

    pipeline, write = holes_setup()
    write(0, 12)
    write(12, 18)
    kafka = HolesKafka({0: DATA}, high={0: 18}, committed={0: 18})
    assert reconcile.reconcile_pipeline(pipeline, kafka=kafka).exact
    kafka.log_start = {0: 8}   # retention, into the first batch
    monkeypatch.setattr(kafka_admin, "partitions_for", lambda topic, cluster=None: [0])
    monkeypatch.setattr(kafka_admin, "watermarks",
                        lambda topic, partitions=None, cluster=None, **kw: {0: Watermarks(8, 18)})
    monkeypatch.setattr(kafka_admin, "committed_offsets", lambda group, topic, partitions=None, cluster=None: {0: 18})
    monkeypatch.setattr(kafka_admin, "commit_offsets", lambda group, topic, offsets, cluster=None: None)

    rewind(pipeline.name, "to-earliest", rollback_sink=True, actor="op")
    assert PartitionHealth.objects.get(pipeline=pipeline, partition=0).verified_offset == 8
    pipeline.refresh_from_db()
    conn = db.connect()
    try:
        commit.commit_batch(conn, commit.Target.for_pipeline(pipeline), pipeline.epoch,
                            {0: records(0, [o for o in sorted(DATA) if o >= 8])}, fetches={0: commit.Fetch(8, 18)})
    finally:
        conn.close()
    report = reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    assert (report.lost, report.exact, report.status) == (0, True, "REWIND"), report.partitions[0].findings
