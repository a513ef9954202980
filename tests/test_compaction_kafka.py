"""Ledger compaction of a history made by a real run: the exactly-once demo pipeline against the embedded broker,
four runs of small batches, two epochs, a dead letter, a rewind with sink rollback. Reconciliation, the timeline,
trace and a rewind's preview give the same answers before and after compaction, and a rewind with sink rollback
into the compacted range then leaves the sink exact after catch-up."""
from datetime import timedelta

import pytest
from django.conf import settings as django_settings

from consumers.demo.classic import DEMO_TOPIC
from consumers.models import BatchLedger, DeadLetter, Pipeline
from consumers.operations.rewind import rewind
from consumers.reconciliation import compaction, reconcile, trace
from dashboard.timeline import ledger_timelines
from tests.ops_helpers import EXACTLY_ONCE, catch_up, drop_demo_sinks, produce, seed, sink_rows
from tests.producing import send

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

LATER = timedelta(days=django_settings.TALLY_LEDGER_KEEP_DAYS + 1)   # every row is past the kept-whole window


def produce_raw(partition: int, value: bytes) -> None:
    send(DEMO_TOPIC, [(partition, None, value)])


def answers(pipeline, picks):
    """What compaction must not change, all read from the real broker and database."""
    report = reconcile.reconcile_pipeline(pipeline, full=True)
    found = sorted((p.partition, f.kind, f.start, f.end, f.count) for p in report.partitions
                   for f in p.findings)
    timelines = [(t.partition, t.covered, t.gaps, t.overlaps, t.rewinds, t.holes, t.batches)
                 for t in ledger_timelines(pipeline)]
    traced = {pick: trace.trace(pipeline, *pick) for pick in picks}
    verdicts = {pick: (t.verdict, t.record, t.position, t.rows, bool(t.dead_letter),
                       sorted((b["first_offset"] <= pick[1] < b["end_offset"], b["superseded"]) for b in t.batches))
                for pick, t in traced.items()}
    preview = rewind(EXACTLY_ONCE, "to-offset", "3", rollback_sink=True, dry_run=True)
    moves = [(m.partition, m.current, m.new) for m in preview.moves]
    return ((report.exact, report.lost, report.duplicated, report.gap, report.overlap, report.dead_lettered,
             found), timelines, verdicts, (moves, preview.rows_to_delete)), traced


@pytest.fixture
def history(kafka_bootstrap, settings):
    """Values 1..60 on 2 partitions and one poison record, consumed over four runs in batches of 3 records, with
    a rewind (to offset 9, sink rolled back) between the second and third run."""
    settings.KAFKA_SESSION_TIMEOUT_MS = 6000
    settings.TALLY_REWIND_STOP_TIMEOUT_SECONDS = 10
    seed(30)                                 # offsets 0..14 of each partition
    Pipeline.objects.filter(name=EXACTLY_ONCE).update(batch_size=3)
    catch_up(EXACTLY_ONCE)
    produce(31, 36)                          # offsets 15..17
    produce_raw(0, b"not a number")          # partition 0, offset 18: dead-lettered
    catch_up(EXACTLY_ONCE)
    rewind(EXACTLY_ONCE, "to-offset", "9", rollback_sink=True)
    catch_up(EXACTLY_ONCE)
    produce(37, 60)                          # partition 0: offsets 19..30, partition 1: 18..29
    catch_up(EXACTLY_ONCE)
    yield Pipeline.objects.get(name=EXACTLY_ONCE)
    drop_demo_sinks()


def test_a_real_runs_history_answers_the_same_after_compaction_and_a_rewind_into_it_stays_exact(history):
    pipeline = history
    rows_before = BatchLedger.objects.filter(pipeline=pipeline).count()
    assert BatchLedger.objects.filter(pipeline=pipeline, superseded_from__isnull=False).exists()
    epochs = set(BatchLedger.objects.filter(pipeline=pipeline).values_list("epoch", flat=True))
    assert epochs == {0, 1}                  # the rewind fenced a new one
    assert DeadLetter.objects.filter(pipeline=pipeline, partition=0, offset=18).exists()
    picks = [(0, 1), (0, 5), (0, 10), (0, 18), (0, 25), (1, 2), (1, 12), (1, 29), (0, 40)]
    sink = sink_rows(EXACTLY_ONCE)
    before, _ = answers(pipeline, picks)
    assert before[0][:6] == (True, 0, 0, 0, 0, 1)

    report = compaction.compact_all(now=compaction.database_now() + LATER)

    rows_after = BatchLedger.objects.filter(pipeline=pipeline).count()
    assert report.rows_merged > 0 and rows_after < rows_before
    after, traced = answers(pipeline, picks)
    assert after == before
    assert sink_rows(EXACTLY_ONCE) == sink
    assert any(b["compacted"] for t in traced.values() for b in t.batches)   # the trace says so
    assert all(b["compacted"] for b in traced[(0, 5)].batches)              # the run before the rewind: one row
    letter = [b for b in traced[(0, 18)].batches if not b["superseded"]]
    assert traced[(0, 18)].dead_letter and not letter[0]["compacted"]       # a dead letter's batch keeps its row

    # A rewind with sink rollback into the compacted range, then a catch-up: the sink holds every record once.
    rewind(EXACTLY_ONCE, "to-offset", "2", rollback_sink=True)
    catch_up(EXACTLY_ONCE)
    assert sink_rows(EXACTLY_ONCE) == sink
    final = reconcile.reconcile_pipeline(pipeline, full=True)
    assert (final.exact, final.lost, final.duplicated, final.dead_lettered) == (True, 0, 0, 1)
