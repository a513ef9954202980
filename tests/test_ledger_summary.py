"""The pages' ledger summary (consumers/reconciliation/ledger_summary.py) says what the coverage sweep
(consumers/reconciliation/coverage.py) says, whatever the history: folded at once, refreshed in steps, with rows
committed since the last refresh, after a rewind and with rows written out of order. Real PostgreSQL; the ledger
rows are made by hand here so that every odd history can be written."""
import random

import pytest
from django.db import connection

from consumers.models import BatchLedger, LedgerSummary, PartitionOffset, Pipeline
from consumers.reconciliation import ledger_summary
from consumers.reconciliation.coverage import ledger_coverage

pytestmark = pytest.mark.django_db


def history(pipeline, partition, seed, batches=60):
    """Rows as engines and operators leave them: contiguous batches, some crossing holes, gaps (a lost batch),
    overlaps (a classic re-read) and rows a rewind trimmed."""
    rng = random.Random(seed)
    position, rows = 0, []
    for _ in range(batches):
        start = position
        kind = rng.random()
        if kind < 0.1:
            start = position + rng.randint(1, 20)          # gap
        elif kind < 0.2 and position > 10:
            start = position - rng.randint(1, 10)          # overlap
        end = start + rng.randint(0, 30)
        records = max(0, end - start - (rng.randint(1, 3) if rng.random() < 0.2 else 0))
        rows.append(BatchLedger(pipeline=pipeline, partition=partition, first_offset=start, end_offset=end,
                                records=records, rows_written=records, epoch=1))
        position = max(position, end)
        if rng.random() < 0.05:                            # a rewind back: rows beyond are trimmed
            back = rng.randint(0, position)
            for row in rows:
                if row.end_offset > back:
                    row.superseded_from = min(row.superseded_from if row.superseded_from is not None
                                              else row.end_offset, back)
            position = back
    return rows


def expected(pipeline):
    with connection.cursor() as cur:
        return {p: (c.first, c.end, c.gaps, c.overlaps) for p, c in ledger_coverage(cur, pipeline.pk).items()}


def summarised(summaries):
    return {p: (s.first, s.end, [tuple(g) for g in s.gaps], [tuple(o) for o in s.overlaps])
            for p, s in summaries.items() if s.first is not None}


@pytest.mark.parametrize("seed", range(8))
def test_the_summary_agrees_with_the_coverage_sweep_read_at_once_or_refreshed_in_steps(seed, monkeypatch):
    pipeline = Pipeline.objects.create(name=f"summary-{seed}", topic="t", sink_table="s", epoch=1)
    PartitionOffset.objects.bulk_create([PartitionOffset(pipeline=pipeline, partition=p, next_offset=0)
                                         for p in (0, 1)])
    rows = history(pipeline, 0, seed) + history(pipeline, 1, seed + 100)
    BatchLedger.objects.bulk_create(rows[:70])
    monkeypatch.setattr(ledger_summary, "REFRESH_ROWS", 7)
    assert ledger_summary.refresh(pipeline.pk) == 14             # two partitions, one bounded step each
    BatchLedger.objects.bulk_create(rows[70:])                   # committed since the refresh
    assert summarised(ledger_summary.read(pipeline.pk)) == expected(pipeline)
    while ledger_summary.refresh(pipeline.pk):
        pass
    assert summarised(ledger_summary.read(pipeline.pk)) == expected(pipeline)
    stored = {s.partition: s for s in LedgerSummary.objects.filter(pipeline=pipeline)}
    assert {p: s.upto_id for p, s in stored.items()} == {
        p: max(r.pk for r in rows if r.partition == p) for p in (0, 1)}


def test_holes_rewinds_and_batches_are_counted_as_the_timeline_drew_them():
    pipeline = Pipeline.objects.create(name="summary-marks", topic="t", sink_table="s", epoch=1)
    PartitionOffset.objects.create(pipeline=pipeline, partition=0, next_offset=40)
    BatchLedger.objects.bulk_create([
        BatchLedger(pipeline=pipeline, partition=0, first_offset=0, end_offset=10, records=9, rows_written=9, epoch=1),
        BatchLedger(pipeline=pipeline, partition=0, first_offset=10, end_offset=20, records=8, rows_written=8,
                    epoch=1),
        BatchLedger(pipeline=pipeline, partition=0, first_offset=20, end_offset=30, records=10, rows_written=10,
                    epoch=1, superseded_from=25),
        BatchLedger(pipeline=pipeline, partition=0, first_offset=25, end_offset=40, records=150, rows_written=150,
                    epoch=1, batches=15),                       # a compacted row: 15 batches
    ])
    ledger_summary.refresh(pipeline.pk)
    summary = ledger_summary.read(pipeline.pk)[0]
    assert (summary.first, summary.end, summary.gaps, summary.overlaps) == (0, 40, [], [])
    assert (summary.holes, summary.holey, summary.rewinds, summary.batches) == (3, [[0, 20]], [25], 18)


def test_rows_written_out_of_order_are_folded_again_in_sweep_order():
    pipeline = Pipeline.objects.create(name="summary-order", topic="t", sink_table="s", epoch=1)
    PartitionOffset.objects.create(pipeline=pipeline, partition=0, next_offset=30)
    make = [(0, 10), (20, 30), (10, 20)]   # the middle batch committed last
    for first, end in make[:2]:
        BatchLedger.objects.create(pipeline=pipeline, partition=0, first_offset=first, end_offset=end, records=10,
                                   rows_written=10, epoch=1)
    ledger_summary.refresh(pipeline.pk)
    assert ledger_summary.read(pipeline.pk)[0].gaps == [[10, 20]]
    BatchLedger.objects.create(pipeline=pipeline, partition=0, first_offset=10, end_offset=20, records=10,
                               rows_written=10, epoch=1)
    assert ledger_summary.read(pipeline.pk)[0].gaps == []       # read: folded again, writes nothing
    ledger_summary.refresh(pipeline.pk)
    assert LedgerSummary.objects.get(pipeline=pipeline).state["gaps"] == []
