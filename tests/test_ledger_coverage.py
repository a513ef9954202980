"""One definition of the ledger's gaps and overlaps (consumers/reconciliation/coverage.py): reconciliation and the
offset timeline agree on a ledger with a gap, an overlap, a rewind and holes -- and a hole (a position holding
no data record: a transaction marker, an aborted record) is never a gap. Real PostgreSQL, ledger rows written
by the commit protocol; Kafka is a stand-in that knows where the data records sit."""
import pytest
from django.db import connection

from consumers.engine import commit, db, sinks
from consumers.engine.transforms import resolve
from consumers.models import BatchLedger, DeliveryMode, Pipeline
from consumers.reconciliation import reconcile
from consumers.reconciliation.coverage import ledger_coverage
from dashboard.timeline import ledger_timelines
from tests.test_reconcile import kinds, records
from tests.test_reconcile_holes import HolesKafka

# Partition 0: five transactions of five records, each closed by a marker (5, 11, 17, 23, 29), then an
# aborted transaction and its marker (30-35): the log ends at 36.
DATA = {0: set(range(0, 5)) | set(range(6, 11)) | set(range(12, 17)) | set(range(18, 23)) | set(range(24, 29)),
        1: set(range(0, 12))}


@pytest.fixture
def ledger(transactional_db):
    """An at-least-once pipeline (the classic modes write what they are given, overlaps included) whose
    `write(partition, start, end)` commits one poll fetched from `start` with the position `end` after it."""
    conn = db.connect()
    pipeline = Pipeline.objects.create(name="coverage", topic="nums", sink_table="coverage_sink",
                                       delivery_mode=DeliveryMode.AT_LEAST_ONCE, epoch=1)
    with connection.cursor() as cur:
        sinks.ensure_sink_table(cur, pipeline.sink_table, resolve("int_value"), False)
    target = commit.Target.for_pipeline(pipeline)

    def write(partition, start, end):
        offsets = [o for o in sorted(DATA[partition]) if start <= o < end]
        commit.commit_batch(conn, target, 1, {partition: records(partition, offsets)} if offsets else {},
                            fetches={partition: commit.Fetch(start, end)})

    yield pipeline, write
    conn.close()
    with connection.cursor() as cur:
        sinks.drop_sink_table(cur, pipeline.sink_table)


def test_reconciliation_and_the_timeline_agree_on_gaps_and_overlaps_and_holes_are_neither(ledger):
    pipeline, write = ledger
    write(0, 0, 6)     # five records and the marker at 5: a hole inside a batch
    write(0, 6, 12)
    # [12, 18) never written (lost before the write): five records and a marker -- the gap
    write(0, 18, 24)
    write(0, 21, 30)   # resumed from an older position: [21, 24) again -- the overlap
    write(0, 30, 36)   # only an aborted transaction and its marker: no record, the position moves
    write(1, 0, 10)
    BatchLedger.objects.filter(pipeline=pipeline, partition=1).update(superseded_from=8)  # rewound to 8
    write(1, 8, 12)    # the replay from the rewind: no overlap with what the rewind superseded

    report = reconcile.reconcile_pipeline(pipeline, kafka=HolesKafka(DATA, high={0: 36, 1: 12},
                                                                     committed={0: 36, 1: 12}))
    timelines = {t.partition: t for t in ledger_timelines(pipeline)}

    reconciled_gaps = [(s, e) for s, e, _ in kinds(report, "gap")]
    reconciled_overlaps = [(s, e) for s, e, _ in kinds(report, "overlap")]
    drawn_gaps = [(s, e) for t in timelines.values() for s, e in t.gaps]
    drawn_overlaps = [(s, e) for t in timelines.values() for s, e in t.overlaps]
    assert reconciled_gaps == drawn_gaps == [(12, 18)]
    assert reconciled_overlaps == drawn_overlaps == [(21, 24)]
    assert (report.gap, report.overlap) == (6, 3)
    # The holes are holes in both views: never lost, drawn apart from the gap.
    assert kinds(report, "lost") == [(12, 17, 5)]   # the records the topic holds in the gap; 17 is a marker
    holes = kinds(report, "hole")
    assert {(5, 6, 1), (11, 12, 1), (29, 36, 7)} <= set(holes) and (17, 18, 1) in holes
    # Positions the batches crossed without a record: 5, 11, 23 (twice: it is in the overlap), 29, 30-35.
    assert timelines[0].holes == 11 and timelines[0].holey == [(0, 12), (18, 36)]
    assert (timelines[0].covered, timelines[1].covered) == ([(0, 12), (18, 36)], [(0, 12)])


def test_within_a_range_coverage_is_clipped_and_an_uncovered_end_is_a_gap(ledger):
    pipeline, write = ledger
    write(0, 0, 6)
    write(0, 12, 18)
    write(0, 15, 24)
    with connection.cursor() as cur:
        whole = ledger_coverage(cur, pipeline.pk)
        clipped = ledger_coverage(cur, pipeline.pk, partition=0, within=(3, 30))
        untouched = ledger_coverage(cur, pipeline.pk, partition=1, within=(0, 10))
        empty = ledger_coverage(cur, pipeline.pk, partition=0, within=(7, 7))
    assert (whole[0].first, whole[0].end, whole[0].batches) == (0, 24, 3)
    assert (whole[0].gaps, whole[0].overlaps) == ([(6, 12)], [(15, 18)])
    assert (clipped[0].gaps, clipped[0].overlaps) == ([(6, 12), (24, 30)], [(15, 18)])
    assert (untouched[1].gaps, untouched[1].batches) == ([(0, 10)], 0)
    assert (empty[0].gaps, empty[0].overlaps) == ([], [])
    with pytest.raises(ValueError, match="one partition"):
        ledger_coverage(connection.cursor(), pipeline.pk, within=(0, 10))
